"""Evaluation of an image classifier over one loader: the trainer's validation and `evaluate`'s.

One function for both, so `python -m hpc_train evaluate` reproduces the trainer's validation
numbers: the same forward (autocast of the run's precision), the same loss, and the same sums
added batch by batch in the same order. The result is a vector of sums (never means): parts of
different sizes then combine by one all-reduce and weigh correctly.

    [loss sum, top-1 correct, count, top-5 correct, correct per class x C, count per class x C]

The first three are what the trainer logs; `totals_summary` turns a summed vector into figures.
"""

from __future__ import annotations

from typing import Callable, ContextManager

import torch

TOP_K = 5
HEAD = 4        # loss sum, top-1 correct, count, top-k correct; then the per-class sums


def totals_length(num_classes: int) -> int:
    return HEAD + 2 * num_classes


@torch.no_grad()
def evaluate_classifier(model: torch.nn.Module, loader, device: torch.device,
                        autocast: Callable[[], ContextManager], num_classes: int,
                        tick: Callable[[], None] = lambda: None) -> torch.Tensor:
    """This process's sums over `loader` (float64, layout in the module docstring)."""
    model.eval()
    totals = torch.zeros(totals_length(num_classes), dtype=torch.float64)
    k = min(TOP_K, num_classes)
    for images, labels in loader:
        tick()
        images, labels = images.to(device), labels.to(device)
        with autocast():
            logits = model(images)
        loss = torch.nn.functional.cross_entropy(logits.float(), labels, reduction="sum")
        hit = logits.argmax(1) == labels
        hit_k = (logits.topk(k, 1).indices == labels[:, None]).any(1)
        totals[:HEAD] += torch.tensor([loss.item(), hit.sum().item(), labels.numel(),
                                       hit_k.sum().item()], dtype=torch.float64)
        labels = labels.cpu()
        totals[HEAD:HEAD + num_classes] += torch.bincount(labels[hit.cpu()], minlength=num_classes)
        totals[HEAD + num_classes:] += torch.bincount(labels, minlength=num_classes)
    return totals


def totals_summary(totals: torch.Tensor, num_classes: int) -> dict:
    """Figures from summed totals: loss, accuracy (top-1), top5_accuracy, samples, and per
    class (correct, samples); the rates are None for no samples."""
    loss_sum, correct, count, correct_k = totals[:HEAD].tolist()
    per_class = zip(totals[HEAD:HEAD + num_classes].tolist(), totals[HEAD + num_classes:].tolist())
    return {
        "samples": int(count),
        "loss": loss_sum / count if count else None,
        "accuracy": correct / count if count else None,
        "top5_accuracy": correct_k / count if count else None,
        "per_class": [(int(c), int(n)) for c, n in per_class],
    }

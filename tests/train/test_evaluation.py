"""The evaluation shared by the trainer's validation and `evaluate`: sums of known logits."""

from __future__ import annotations

import contextlib

import pytest
import torch

from hpc_train.train.evaluation import HEAD, evaluate_classifier, totals_length, totals_summary

CLASSES = 6
# The model is the identity: each "image" is its own logits row.
LOGITS = torch.tensor([[9., 8, 7, 6, 5, 0],     # label 0: top-1 hit
                       [9., 8, 7, 6, 5, 0],     # label 4: top-5 hit only
                       [9., 8, 7, 6, 5, 0],     # label 5: missed
                       [0., 0, 0, 0, 0, 9]])    # label 5: top-1 hit
LABELS = torch.tensor([0, 4, 5, 5])


def run(batches):
    return evaluate_classifier(torch.nn.Identity(), batches, torch.device("cpu"),
                               contextlib.nullcontext, CLASSES)


def test_sums_of_known_logits():
    totals = run([(LOGITS[:3], LABELS[:3]), (LOGITS[3:], LABELS[3:])])
    assert totals.dtype == torch.float64 and len(totals) == totals_length(CLASSES)
    loss = torch.nn.functional.cross_entropy(LOGITS, LABELS, reduction="sum").item()
    assert totals[0].item() == pytest.approx(loss, rel=1e-6)
    assert totals[1:HEAD].tolist() == [2, 4, 3]          # top-1 correct, count, top-5 correct
    correct, count = totals[HEAD:HEAD + CLASSES].tolist(), totals[HEAD + CLASSES:].tolist()
    assert correct == [1, 0, 0, 0, 0, 1] and count == [1, 0, 0, 0, 1, 2]


def test_the_trainers_three_sums_are_added_batch_by_batch():
    # The trainer's (loss sum, correct, count): its historic per-batch float64 sums, in order.
    batches = [(LOGITS[:2], LABELS[:2]), (LOGITS[2:], LABELS[2:])]
    expected = torch.zeros(3, dtype=torch.float64)
    for logits, labels in batches:
        loss = torch.nn.functional.cross_entropy(logits, labels, reduction="sum")
        expected += torch.tensor([loss.item(), (logits.argmax(1) == labels).sum().item(),
                                  labels.numel()], dtype=torch.float64)
    assert torch.equal(run(batches)[:3], expected)


def test_fewer_classes_than_five_count_top_k_over_all_of_them():
    totals = evaluate_classifier(torch.nn.Identity(), [(LOGITS[:, :3], torch.tensor([2, 1, 0, 0]))],
                                 torch.device("cpu"), contextlib.nullcontext, 3)
    assert totals[3].item() == 4


def test_summary_figures_and_no_samples():
    figures = totals_summary(run([(LOGITS, LABELS)]), CLASSES)
    assert (figures["samples"], figures["accuracy"], figures["top5_accuracy"]) == (4, 0.5, 0.75)
    assert figures["per_class"][5] == (1, 2)
    empty = totals_summary(torch.zeros(totals_length(CLASSES), dtype=torch.float64), CLASSES)
    assert empty["samples"] == 0 and empty["accuracy"] is None and empty["loss"] is None

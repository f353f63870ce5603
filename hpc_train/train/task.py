"""The job's task (spec `task`, resolved by `JobSpec.task_kind`): what one micro-batch's loss is,
and what evaluation sums. Every kind of job's parts take theirs from `task_for`.

- classification: cross-entropy of model(inputs) against class indices (label smoothing from
  optim.label_smoothing); evaluation by train/evaluation.py (top-1, top-5, per class).
- causal_lm: next-token cross-entropy of (batch, sequence, vocabulary) logits, or an output
  that carries them as `.logits` (Hugging Face's), against (batch, sequence) targets; -100
  marks a target to ignore, as torch's and Hugging Face's losses do. Evaluation sums over
  tokens.
- own: the user's step, `step(model, (inputs, targets))` -> loss or (loss, {name: number});
  evaluation by `task.eval` (same form) or the step itself, without gradients.

Evaluation returns a vector of sums, never means, so parts of any size combine by one
all-reduce: [loss sum, correct, count] then, for an own step, METRIC_SLOTS metric sums. The
names of the metrics are the step's own and never cross ranks: every rank runs the same code, so
each slot means the same on each. Training metrics are summed per step the same way and taken by
the loop at each logged step (`take_metrics`).
"""

from __future__ import annotations

import math
from typing import Any, Callable, ContextManager, Iterable, Protocol

import torch
import torch.nn.functional as F

from hpc_train import usercode
from hpc_train.models.gpt import lm_loss
from hpc_train.spec.schema import TaskKind
from hpc_train.train.evaluation import evaluate_classifier

HEAD = 3              # loss sum, correct, count
METRIC_SLOTS = 8      # an own step's metrics that are logged (the first 8 by name)
IGNORE = -100         # a target no loss is computed for (lm_loss's, torch's and Hugging Face's default)
# Keys of the metrics lines that are ours: a metric of the user's by one of these names is refused.
RESERVED = frozenset({"time", "step", "epoch", "samples", "loss", "lr", "split", "accuracy",
                      "step_time", "data_time", "loss_scale", "skipped_steps", "images_per_s",
                      "samples_per_s", "tokens_per_s"})


class Task(Protocol):
    """`loss`: one micro-batch's (the parts divide by the passes, scale and backward it);
    `evaluate`: this rank's sums over its batches; `val_record`: the val line's figures from the
    ranks' summed totals; `take_metrics` / `metric_record`: the step's own metrics since the last
    log line, summed, then as figures (empty for ours)."""

    kind: TaskKind

    def loss(self, model: torch.nn.Module, inputs: Any, targets: Any) -> torch.Tensor: ...

    def evaluate(self, model: torch.nn.Module, batches: Iterable, autocast: Callable[[], ContextManager],
                 tick: Callable[[], None]) -> torch.Tensor: ...

    def val_record(self, totals: torch.Tensor) -> dict[str, float]: ...

    def take_metrics(self) -> torch.Tensor: ...

    def metric_record(self, summed: torch.Tensor) -> dict[str, float]: ...


def logits_of(output: Any) -> torch.Tensor:
    """A model's logits: the output itself, or its `.logits` (a Hugging Face model's output)."""
    return getattr(output, "logits", output)


class _OurLoss:
    """What classification and causal_lm share: no metrics beyond loss and accuracy."""

    def take_metrics(self) -> torch.Tensor:
        return torch.zeros(0, dtype=torch.float64)

    def metric_record(self, summed: torch.Tensor) -> dict[str, float]:
        return {}

    def val_record(self, totals: torch.Tensor) -> dict[str, float]:
        return {"loss": totals[0].item() / totals[2].item(),
                "accuracy": totals[1].item() / totals[2].item()}


class Classification(_OurLoss):
    kind = TaskKind.CLASSIFICATION

    def __init__(self, num_classes: int, device: torch.device, label_smoothing: float = 0.0):
        self.num_classes, self.device = num_classes, device
        self.criterion = torch.nn.CrossEntropyLoss(label_smoothing=label_smoothing)

    def loss(self, model, inputs, targets) -> torch.Tensor:
        return self.criterion(logits_of(model(inputs)), targets)

    def evaluate(self, model, batches, autocast, tick) -> torch.Tensor:
        return evaluate_classifier(model, batches, self.device, autocast, self.num_classes,
                                   tick)[:HEAD].clone()


class CausalLm(_OurLoss):
    kind = TaskKind.CAUSAL_LM

    @staticmethod
    def output_loss(output, targets) -> torch.Tensor:
        """The loss of a model's output: what the pipeline's last stage computes."""
        return lm_loss(logits_of(output), targets)

    def loss(self, model, inputs, targets) -> torch.Tensor:
        return self.output_loss(model(inputs), targets)

    @torch.no_grad()
    def evaluate(self, model, batches, autocast, tick) -> torch.Tensor:
        model.eval()
        totals = torch.zeros(HEAD, dtype=torch.float64)
        for inputs, targets in batches:
            tick()
            with autocast():
                logits = logits_of(model(inputs))
            logits, targets = logits.float().flatten(0, 1), targets.flatten()
            counted = targets != IGNORE
            loss = F.cross_entropy(logits, targets, ignore_index=IGNORE, reduction="sum")
            hit = (logits.argmax(1) == targets) & counted
            totals += torch.tensor([loss.item(), hit.sum().item(), counted.sum().item()],
                                   dtype=torch.float64)
        return totals


class OwnStep:
    """The user's step (task.name) and evaluation (task.eval, or the step)."""

    kind = TaskKind.OWN

    def __init__(self, step: str, evaluation: str | None = None):
        self.step_name, self.eval_name = step, evaluation or step
        self.step = usercode.load_step(step, "task.name")
        self.eval = usercode.load_step(evaluation, "task.eval") if evaluation else self.step
        self.names: list[str] = []           # the metrics' names, from the step's first result
        self.eval_names: list[str] = []
        self._sums = torch.zeros(1 + METRIC_SLOTS, dtype=torch.float64)   # passes, then sums

    def _split(self, result: Any, reference: str) -> tuple[torch.Tensor, dict[str, float]]:
        """(loss, metrics) from what the user's function returned; one line naming it when
        that is not a loss or (loss, {name: number})."""
        loss, metrics = (result if isinstance(result, tuple) and len(result) == 2 else (result, {}))
        if isinstance(loss, torch.Tensor) and loss.numel() == 1 and isinstance(metrics, dict):
            for name in metrics:
                if name in RESERVED or not isinstance(name, str):
                    raise usercode.UserCodeError(
                        f"{reference} returned a metric named {name!r}: that name is one of the "
                        f"metrics lines' own ({', '.join(sorted(RESERVED))}). Fix: rename it")
            return loss.reshape(()), {k: float(v) for k, v in metrics.items()}
        raise usercode.UserCodeError(
            f"{reference} returned {_kind_of(result)}: a step returns the loss (a tensor of one "
            "element, with its graph) or (loss, {name: number})")

    def loss(self, model, inputs, targets) -> torch.Tensor:
        loss, metrics = self._split(self.step(model, (inputs, targets)), f"task.name {self.step_name}")
        self.names = self.names or _names(metrics)
        self._sums[0] += 1
        _add(self._sums, 1, self.names, metrics, 1.0)
        return loss

    def take_metrics(self) -> torch.Tensor:
        """[passes, metric sums x METRIC_SLOTS] since the last call (every rank: one all-reduce)."""
        taken, self._sums = self._sums, torch.zeros_like(self._sums)
        return taken

    def metric_record(self, summed: torch.Tensor) -> dict[str, float]:
        passes = summed[0].item()
        return {name: summed[1 + slot].item() / passes for slot, name in enumerate(self.names)} if passes else {}

    @torch.no_grad()
    def evaluate(self, model, batches, autocast, tick) -> torch.Tensor:
        model.eval()
        totals = torch.zeros(HEAD + METRIC_SLOTS, dtype=torch.float64)
        for inputs, targets in batches:
            tick()
            with autocast():
                loss, metrics = self._split(self.eval(model, (inputs, targets)), f"task.eval {self.eval_name}")
            self.eval_names = self.eval_names or _names(metrics)
            count = float(len(inputs))      # each batch weighs its samples: means over samples
            totals[0] += loss.item() * count
            totals[2] += count
            _add(totals, HEAD, self.eval_names, metrics, count)
        return totals

    def val_record(self, totals: torch.Tensor) -> dict[str, float]:
        count = totals[2].item()
        return {"loss": totals[0].item() / count,
                **{name: totals[HEAD + slot].item() / count for slot, name in enumerate(self.eval_names)}}


def _names(metrics: dict[str, float]) -> list[str]:
    """The metrics logged, from a first result: the first METRIC_SLOTS names in order."""
    return sorted(metrics)[:METRIC_SLOTS]


def _add(sums: torch.Tensor, start: int, names: list[str], metrics: dict[str, float],
         weight: float) -> None:
    """Add each named metric, times `weight`, to its slot from `start` (NaN where missing)."""
    for slot, name in enumerate(names):
        sums[start + slot] += metrics.get(name, math.nan) * weight


def _kind_of(value: Any) -> str:
    if isinstance(value, torch.Tensor):
        return f"a tensor of shape {tuple(value.shape)}"
    if isinstance(value, tuple):
        return f"a tuple of {len(value)}"
    return type(value).__name__ if value is not None else "None"


def task_for(spec, device: torch.device) -> Task:
    """The job's task on a rank of `device` (an own step's module is imported here)."""
    kind = spec.task_kind
    if kind is TaskKind.OWN:
        return OwnStep(spec.task.name, spec.task.eval)
    if kind is TaskKind.CAUSAL_LM:
        return CausalLm()
    return Classification(spec.data.num_classes, device, spec.optim.label_smoothing)

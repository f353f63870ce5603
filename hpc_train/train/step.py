"""One optimizer step over `accumulation` micro-batches: the whole FP16 recipe in one screen."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from typing import Any

import torch

from hpc_train.train.precision import Precision
from hpc_train.train.timing import NO_CLOCK


def optimizer_step(model: torch.nn.Module, optimizer, micro_batches: Sequence[tuple[Any, Any]],
                   loss_of: Callable[[torch.nn.Module, Any, Any], torch.Tensor], precision: Precision,
                   backend=None, grad_clip: float | None = None, clock=NO_CLOCK) -> tuple[float, bool]:
    """Forward/backward each micro-batch, then one (maybe skipped) optimizer step.
    `loss_of(model, inputs, targets)`: the micro-batch's loss (the job's task, train/task.py).

    Each micro-batch loss is divided by the number of micro-batches, so accumulating k batches
    of B gives the gradient of one batch of k x B (for models without batch statistics).
    Returns (mean loss of the micro-batches, whether the step was applied). `clock` marks the
    step's parts for `bench train` (train/timing.py); training's own does nothing.
    """
    passes = len(micro_batches)
    total = 0.0
    for i, (inputs, targets) in enumerate(micro_batches):
        sync = backend.accumulate(model, last_pass=i == passes - 1) if backend else contextlib.nullcontext()
        with sync:
            with precision.autocast():
                loss = loss_of(model, inputs, targets) / passes
            precision.backward(loss)
        total += loss.item()
    clock.mark("backward")
    hooks = backend.precision_hooks(optimizer) if backend else {}
    if "synchronize" in hooks:
        hooks["synchronize"] = clock.after(hooks["synchronize"], "reduced")
    if grad_clip is not None:
        precision.unscale_and_clip(optimizer, grad_clip, synchronize=hooks.get("synchronize"))
    applied = precision.step(optimizer, **hooks)
    precision.update()
    # Zero even after a skipped step: a kept inf gradient would skip every step after it.
    optimizer.zero_grad()  # set_to_none is torch's default; Horovod's wrapper takes no arguments
    clock.mark("optimizer")
    return total, applied


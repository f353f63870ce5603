"""The seam between the training loop and a kind of job: `TrainingParts`, what a trainer is given.

One `Trainer` runs every job (epochs, logging, stop agreement, checkpoint cadence, heartbeats);
a kind of job, chosen from the parallel layout (`train/factory.py`), provides what differs: the
model and how its ranks talk, one optimizer step, evaluation, and its own checkpoint components
(a named mapping of Stateful objects, torchtitan-style, that `Checkpointing` saves as it is).
The plain data-parallel parts (`train/trainer.py`) and the pipeline's (`train/pipeline_trainer.py`)
provide it today; a sharded backend (FSDP, DeepSpeed ZeRO) is another class with these members.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol, runtime_checkable

import torch

from hpc_train.train.state import CheckpointedState
from hpc_train.train.timing import NullClock


@runtime_checkable
class Collectives(Protocol):
    """Whole-job collectives: the logged loss, evaluation totals, checkpoint agreement."""

    def allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def barrier(self) -> None: ...

    def shutdown(self) -> None: ...


@runtime_checkable
class TrainingParts(Protocol):
    """What a kind of job gives the `Trainer`, built by a `PartsFactory` on every rank."""

    model: torch.nn.Module          # this rank's model (or its stage): digested at the end
    backend: Collectives
    optimizer: torch.optim.Optimizer  # the loop sets its learning rate every step
    precision: Any                  # Stateful, with `loss_scale` (logged)

    def states(self) -> CheckpointedState:
        """This kind's checkpoint components by name and file; the trainer adds the loop's own."""

    def train_step(self, micro_batches: list, clock: NullClock) -> tuple[float | None, bool]:
        """One optimizer step: (this rank's loss, None where it computes none; whether the
        step was applied)."""

    def evaluate(self, val_batches: Iterable, tick: Callable[[], None]) -> torch.Tensor:
        """This rank's (loss sum, correct, count) over its validation part; `tick` per batch."""


PartsFactory = Callable[..., TrainingParts]   # (spec, paths, identity, device) -> the parts

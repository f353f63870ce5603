"""The seam between the training loop and a kind of job: `TrainingParts`, what a trainer is given.

One `Trainer` runs every job; the parts of its layout's `Parallelism` (`train/trainer.py: PARTS`)
provide what differs: the model and its collectives, one optimizer step, evaluation and their
checkpoint components (named Stateful objects, as torchtitan's). A sharded backend (FSDP,
DeepSpeed ZeRO) is one more class with these members and one more entry in PARTS.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Protocol, runtime_checkable

import torch

from hpc_train.train.state import CheckpointedState
from hpc_train.train.task import Task


@runtime_checkable
class Collectives(Protocol):
    """Whole-job collectives: the logged loss, evaluation totals, checkpoint agreement."""

    def allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor: ...

    def barrier(self) -> None: ...

    def shutdown(self) -> None: ...


@runtime_checkable
class TrainingParts(Protocol):
    """`states()`: this kind's checkpoint components (the loop adds its own); `train_step`:
    (this rank's loss, None where it computes none; applied); `evaluate`: this rank's sums of
    the task (loss sum, correct, count, ...: train/task.py), calling `tick` per batch."""

    model: torch.nn.Module            # this rank's model (or its stage): digested at the end
    backend: Collectives
    optimizer: torch.optim.Optimizer  # the loop sets its learning rate every step
    precision: Any                    # Stateful, with the `loss_scale` that is logged
    task: Task                        # the loss, the evaluation's sums and the val line's figures

    def states(self) -> CheckpointedState: ...

    def train_step(self, micro_batches: list, clock) -> tuple[float | None, bool]: ...

    def evaluate(self, val_batches: Iterable, tick: Callable[[], None]) -> torch.Tensor: ...


PartsFactory = Callable[..., TrainingParts]   # (spec, paths, identity, device) -> the parts

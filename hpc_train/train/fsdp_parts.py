"""The parts of an fsdp job (parallel.backend: fsdp), run by the same `Trainer` loop.

What differs from a data-parallel job: every rank holds 1/N of the parameters, gradients and
optimizer state (torch FSDP2, one unit per block where the model catalog says: ResNet stages,
gpt blocks), the fp16 loss scaler agrees on overflow across the shards, and the model and
optimizer are checkpointed by every rank in parallel (DCP, loadable at any world size). The
step itself is the data-parallel one (`optimizer_step`): accumulation without a reduction per
micro-batch, clipping of the sharded gradients' global norm, autocast.
"""

from __future__ import annotations

import logging

import torch

from hpc_train.checkpoint.sharded import ShardedModelState
from hpc_train.models import shard_units
from hpc_train.parallel.fsdp import FsdpBackend, local_numel
from hpc_train.train.optim import build_optimizer
from hpc_train.train.precision import Precision
from hpc_train.train.sharded_model import BlankInput, build_job_model, evaluate_in_step
from hpc_train.train.state import CheckpointedState, ModelBuffers
from hpc_train.train.step import optimizer_step
from hpc_train.train.task import task_for
from hpc_train.train.timing import NO_CLOCK

log = logging.getLogger("hpc_train.trainer")


class FsdpParts:
    """The `TrainingParts` of an fsdp job: the model sharded over all ranks."""

    def __init__(self, spec, paths, identity, device: torch.device):
        self.spec, self.device = spec, device
        self.backend = FsdpBackend(identity, device)
        torch.manual_seed(spec.run.seed)  # the same whole model everywhere; each keeps its shards
        model = build_job_model(spec).to(device)
        units = shard_units(spec.model.name, model, spec.parallel.fsdp.units)
        # Named before fully_shard renames their classes (FSDP<name>).
        kinds = ", ".join(sorted({type(u).__name__ for u in units})) or "none"
        self.model = self.backend.shard(model, units, spec.parallel.fsdp)
        self.optimizer = build_optimizer(spec.optim, self.model.parameters(), lr=spec.scaled_lr)
        self.precision = Precision(spec.precision.mode, device, spec.precision.loss_scale,
                                   spec.precision.init_scale, sharded=True)
        self.task = task_for(spec, device)
        self.blank = BlankInput()      # a rank without validation batches forwards one like it
        if identity.is_main:
            log.info("fsdp: %d ranks, %d parameters on this rank of %d, %d units of %s and the "
                     "root", identity.size, local_numel(self.model),
                     sum(p.numel() for p in self.model.parameters()), len(units), kinds)

    def states(self) -> CheckpointedState:
        """The scaler replicated; model and optimizer sharded (every rank writes its shards);
        buffers per rank (FSDP leaves them whole on every rank, as Horovod does)."""
        return CheckpointedState(
            replicated={"precision": self.precision},
            per_rank={"buffers": ModelBuffers(self.model)},
            sharded=ShardedModelState(self.model, self.optimizer))

    def train_step(self, micro_batches, clock=NO_CLOCK) -> tuple[float, bool]:
        self.blank.see(micro_batches[0][0])
        return optimizer_step(self.model, self.optimizer, micro_batches, self.task.loss,
                              self.precision, self.backend, self.spec.optim.grad_clip, clock)

    def evaluate(self, val_batches, tick) -> torch.Tensor:
        """This rank's (loss sum, correct, count); every forward in step with the other ranks'."""
        return evaluate_in_step(self.model, self.task, val_batches, self.blank, self.precision.autocast,
                                tick, self.backend.allreduce_sum)

"""The parts of a DeepSpeed ZeRO job (parallel.backend: deepspeed), run by the same `Trainer`.

The engine is driven by our loop: our data (this rank's part of the sampler's order), our LR
(the loop sets it in the param groups of the ZeRO optimizer, which are our optimizer's own),
our precision (autocast of `Precision`; DeepSpeed's bf16/fp16 stay off), and the Trainer's
stop agreement, heartbeats and watchdog. A step is `accumulation` micro-batches of
`engine.backward` with the accumulation boundary set by us on the last one, then one
`engine.step`: DeepSpeed's boundaries are ours.

Checkpoints: the engine writes its shards in DeepSpeed's format into the step's temporary
directory (every rank, `EngineShards`), inside our protocol; the loop adds progress, sampler
and RNG streams as for every job. DeepSpeed's shards are cut per rank, so they load only at the
world size they were saved at (`ZeroShape` refuses another in one line; DeepSpeed's universal
checkpoint, which re-cuts them, is not wired).
"""

from __future__ import annotations

import torch

from hpc_train.errors import CheckpointMismatch
from hpc_train.train.task import task_for
from hpc_train.parallel.data_parallel import TorchCollectives
from hpc_train.parallel.deepspeed_config import engine_config
from hpc_train.parallel.deepspeed_engine import EngineShards, start_engine
from hpc_train.train.optim import build_optimizer
from hpc_train.train.precision import Precision
from hpc_train.train.sharded_model import BlankInput, build_job_model, evaluate_in_step
from hpc_train.train.state import CheckpointedState, ModelBuffers
from hpc_train.train.timing import NO_CLOCK


class ZeroShape:
    """The ranks and the ZeRO stage the engine's shards were cut for: saved, and checked first
    at resume (before DeepSpeed reads shards that would not fit)."""

    def __init__(self, world_size: int, stage: int):
        self.world_size, self.stage = world_size, stage

    def state_dict(self) -> dict:
        return {"world_size": self.world_size, "stage": self.stage}

    def load_state_dict(self, state: dict) -> None:
        saved = (int(state["world_size"]), int(state["stage"]))
        if saved != (self.world_size, self.stage):
            raise CheckpointMismatch(
                f"this DeepSpeed checkpoint holds ZeRO-{saved[1]} shards of {saved[0]} ranks, the "
                f"job runs ZeRO-{self.stage} on {self.world_size}: DeepSpeed's shards load only as "
                f"they were cut (its universal checkpoint is not wired). Fix: resume on {saved[0]} "
                f"ranks with parallel.deepspeed.stage: {saved[1]}")


class DeepSpeedParts:
    """The `TrainingParts` of a ZeRO job: DeepSpeed's engine over the whole model."""

    def __init__(self, spec, paths, identity, device: torch.device):
        self.spec, self.device = spec, device
        torch.manual_seed(spec.run.seed)   # the same initial weights on every rank
        model = build_job_model(spec).to(device)
        optimizer = build_optimizer(spec.optim, model.parameters(), lr=spec.scaled_lr)
        self.engine = start_engine(model, optimizer, engine_config(spec), identity, device)
        self.model = self.engine           # a Module: train()/eval() reach the wrapped model
        self.optimizer = self.engine.optimizer
        self.backend = TorchCollectives(device)
        # Autocast only: fp16 (a loss scaler) is refused at validate for this backend.
        self.precision = Precision(spec.precision.mode, device)
        self.task = task_for(spec, device)
        self.blank = BlankInput()      # a rank without validation batches forwards one like it
        self.shape = ZeroShape(identity.size, spec.parallel.deepspeed.stage)

    def states(self) -> CheckpointedState:
        """The shape (checked first) and the precision replicated; the engine in DeepSpeed's
        own shards; buffers per rank (BatchNorm statistics are each rank's own)."""
        return CheckpointedState(
            replicated={"zero": self.shape, "precision": self.precision},
            per_rank={"buffers": ModelBuffers(self.engine.module)},
            sharded=EngineShards(self.engine))

    def train_step(self, micro_batches, clock=NO_CLOCK) -> tuple[float, bool]:
        """One optimizer step: (this rank's mean loss of the micro-batches, applied)."""
        engine, passes = self.engine, len(micro_batches)
        self.blank.see(micro_batches[0][0])
        total = 0.0
        for i, (inputs, targets) in enumerate(micro_batches):
            engine.set_gradient_accumulation_boundary(i == passes - 1)
            with self.precision.autocast():
                loss = self.task.loss(engine, inputs, targets)
            # DeepSpeed divides by gradient_accumulation_steps (= parallel.accumulation = passes).
            total += engine.backward(loss).item()
        clock.mark("backward")
        engine.step()
        clock.mark("optimizer")
        return total, True

    def evaluate(self, val_batches, tick) -> torch.Tensor:
        """This rank's (loss sum, correct, count); every forward in step with the other ranks'
        (ZeRO-3 gathers the parameters in each)."""
        return evaluate_in_step(self.engine, self.task, val_batches, self.blank, self.precision.autocast,
                                tick, self.backend.allreduce_sum)

"""The parts of a pipeline job, run by the same `Trainer` loop as a data-parallel job.

Everything around the step is the `Trainer`'s: epochs, stop agreement, requeue, checkpoint
cadence, logging, heartbeats. What differs is provided here: the model is this rank's stage of
a block list (gpt's, or the user's model cut at its blocks: models/blocks.py), all ranks of one
pipeline read the same samples (the layout's data part), the loss lives on the last stage, and
each stage checkpoints its own weights and optimizer (written once per stage, by replica 0).
"""

from __future__ import annotations

import logging

import torch

from hpc_train.checkpoint import layout
from hpc_train.errors import CheckpointMismatch
from hpc_train.models.blocks import block_list
from hpc_train.train.data import own_dataset
from hpc_train.train.sharded_model import build_job_model
from hpc_train.train.task import CausalLm
from hpc_train.parallel.data_parallel import init_torch_distributed
from hpc_train.parallel.pipeline.engine import PipelineConfig, PipelineEngine
from hpc_train.parallel.pipeline.scaler import AgreedLossScaler
from hpc_train import events, run_state
from hpc_train.train.optim import build_optimizer
from hpc_train.train.state import CheckpointedState

log = logging.getLogger("hpc_train.trainer")


class StageCut:
    """Blocks per stage: saved, and checked at resume (a stage file only fits the same cut)."""

    def __init__(self, sizes):
        self.sizes = list(sizes)

    def state_dict(self) -> dict:
        return {"sizes": self.sizes}

    def load_state_dict(self, state: dict) -> None:
        saved = list(state["sizes"])
        if saved != self.sizes:
            raise CheckpointMismatch(f"the checkpoint's stages hold {saved} blocks, this job "
                                     f"cuts {self.sizes}: resume with the same "
                                     "parallel.pipeline stages and balance")


class StageWeights:
    """This rank's stage of the block list."""

    def __init__(self, module):
        self.module = module

    def state_dict(self) -> dict:
        return self.module.block_state_dict()

    def load_state_dict(self, state: dict) -> None:
        self.module.load_block_state_dict(state)


def example_micro_batch(spec, micro: int) -> torch.Tensor:
    """One micro-batch of token ids to time the blocks on (balance: time): random ids of the
    spec's vocabulary and sequence length, or the first training input of the user's dataset
    repeated (its sequence length is the dataset's own)."""
    if spec.data.kind == "dataset":
        inputs, _ = own_dataset(spec, "train")[0]
        return torch.as_tensor(inputs).unsqueeze(0).repeat_interleave(micro, 0)
    return torch.randint(spec.data.vocab_size, (micro, spec.data.seq_len))


class PipelineParts:
    """The `TrainingParts` of a pipeline job: this rank's stage, the schedule's step."""

    def __init__(self, spec, paths, identity, device: torch.device):
        self.spec = spec
        pipe = spec.parallel.pipeline
        self.layout = spec.layout
        init_torch_distributed(identity.rank, identity.size, device)
        torch.manual_seed(spec.run.seed)   # every rank builds the same full model, keeps a stage
        full = block_list(spec.model.name, build_job_model(spec), spec.model.blocks)
        balance = pipe.balance if isinstance(pipe.balance, str) else tuple(pipe.balance)
        earlier = run_state.read(paths).pipeline_cut if balance == "time" else None
        if earlier:
            # A requeued job keeps its first timed cut: its checkpoints hold those stages, and
            # a new timing (other node, other load) may cut elsewhere.
            balance = earlier
        config = PipelineConfig(pipe.stages, pipe.microbatches, pipe.schedule, balance, pipe.remat,
                                spec.parallel.backend)
        micro = spec.data.batch_size // pipe.microbatches
        example = example_micro_batch(spec, micro) if balance == "time" else None
        self.precision = AgreedLossScaler(spec.precision.mode, spec.precision.loss_scale,
                                          spec.precision.init_scale)
        # A pipeline trains causal_lm (spec/task_rules.py): its loss on the last stage, its
        # figures in the val line.
        self.task = CausalLm()
        self.engine = PipelineEngine(full, self.layout, identity.rank, device, config, self.task.output_loss,
                                     self.precision, spec.precision.mode, example)
        del full
        self.backend = self.engine          # allreduce_sum / barrier / shutdown over the world
        self.model = self.engine.module
        self.optimizer = build_optimizer(spec.optim, self.engine.parameters(), lr=spec.scaled_lr)
        if identity.is_main and not earlier:
            run_state.update(paths, lambda state: state.with_pipeline_cut(self.engine.sizes))
            events.try_record(paths, events.pipeline_cut(list(self.engine.sizes), pipe.balance))
        if identity.is_main:
            log.info("pipeline: %d stages x %d replicas, blocks per stage %s, %s, %d micro-batches%s",
                     pipe.stages, self.layout.replicas, self.engine.sizes, pipe.schedule,
                     pipe.microbatches, ", remat" if pipe.remat else "")

    def states(self) -> CheckpointedState:
        """The cut (checked first) and the scaler replicated; the stage's weights and optimizer
        in the stage's own file, written by replica 0 of the stage; RNG streams per rank."""
        return CheckpointedState(
            replicated={"stage_sizes": StageCut(self.engine.sizes), "precision": self.precision},
            files={layout.stage_file_name(self.engine.stage_index): {
                "model": StageWeights(self.engine.module), "optimizer": self.optimizer}},
            writes_files=self.engine.replica == 0)

    def train_step(self, micro_batches, clock=None) -> tuple[float | None, bool]:
        """Only last stages compute the loss (None elsewhere): the logged mean is over replicas.
        `clock` (bench train's step marks) is not used: the pipeline's step is not broken down."""
        (inputs, targets), = micro_batches      # accumulation is 1: micro-batches are the pipeline's
        return self.engine.step(inputs, targets, self.optimizer, self.spec.optim.grad_clip)

    @torch.no_grad()
    def evaluate(self, val_batches, tick) -> torch.Tensor:
        totals = torch.zeros(3, dtype=torch.float64)   # loss sum, correct tokens, tokens
        skipped = 0
        for inputs, targets in val_batches:
            tick()
            if len(inputs) != self.spec.data.batch_size:
                # The stages fixed their micro-batch shapes at the first step; a short last
                # batch would not match them, so it is left out (fewer than one batch per replica).
                skipped += len(inputs)
                continue
            part = self.engine.evaluate(inputs, targets)
            if part is not None:
                totals += part
        if skipped and self.engine.rank == 0:
            log.info("eval: %d sequence(s) of a short last batch left out on this replica", skipped)
        return totals


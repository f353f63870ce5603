"""The trainer of a pipeline job: the data-parallel loop with a pipeline step inside.

Everything around the step is the data-parallel `Trainer`'s: epochs, stop agreement, requeue,
checkpoint cadence, logging, heartbeats. What differs is here: the model is this rank's stage of
the gpt block list, all ranks of one pipeline read the same samples (the first stage needs the
inputs, the last the targets), the loss lives on the last stage, and each stage checkpoints
its own weights and optimizer (written once per stage, by replica 0).
"""

from __future__ import annotations

import torch

from hpc_train.checkpoint.rng import capture_rng
from hpc_train.errors import CheckpointMismatch
from hpc_train.models import build_model
from hpc_train.models.gpt import lm_loss
from hpc_train.parallel.data_parallel import init_torch_distributed
from hpc_train.parallel.pipeline.engine import PipelineConfig, PipelineEngine
from hpc_train.parallel.pipeline.layout import PipelineLayout
from hpc_train.parallel.pipeline.scaler import AgreedLossScaler
from hpc_train import events
from hpc_train.train import state
from hpc_train.train.meters import Window
from hpc_train.train.optim import build_optimizer
from hpc_train.train.trainer import Trainer, log


def stage_file(stage: int) -> str:
    return f"stage-{stage:05d}.pt"


class PipelineTrainer(Trainer):
    def _build_model(self) -> None:
        spec, me = self.spec, self.identity
        pipe = spec.parallel.pipeline
        self.layout = PipelineLayout(me.size, pipe.stages)
        init_torch_distributed(me.rank, me.size, self.device)
        torch.manual_seed(spec.run.seed)   # every rank builds the same full model, keeps a stage
        full = build_model("gpt", spec.data.vocab_size, spec.model.options, seq_len=spec.data.seq_len)
        balance = pipe.balance if isinstance(pipe.balance, str) else tuple(pipe.balance)
        earlier = events.first_pipeline_cut(events.read(self.paths)) if balance == "time" else None
        if earlier:
            # A requeued job keeps its first timed cut: its checkpoints hold those stages, and
            # a new timing (other node, other load) may cut elsewhere.
            balance = earlier
        config = PipelineConfig(pipe.stages, pipe.microbatches, pipe.schedule, balance, pipe.remat,
                                spec.parallel.backend)
        micro = spec.data.batch_size // pipe.microbatches
        example = torch.randint(spec.data.vocab_size, (micro, spec.data.seq_len))
        self.precision = AgreedLossScaler(spec.precision.mode, spec.precision.loss_scale,
                                          spec.precision.init_scale)
        self.engine = PipelineEngine(full, self.layout, me.rank, self.device, config, lm_loss,
                                     self.precision, spec.precision.mode, example)
        del full
        self.backend = self.engine          # allreduce_sum / barrier / shutdown over the world
        self.model = self.engine.module
        self.optimizer = build_optimizer(spec.optim, self.engine.parameters(), lr=spec.scaled_lr)
        if me.is_main and not earlier:
            events.record(self.paths, events.pipeline_cut(list(self.engine.sizes), pipe.balance))
        if me.is_main:
            log.info("pipeline: %d stages x %d replicas, blocks per stage %s, %s, %d micro-batches%s",
                     pipe.stages, self.layout.replicas, self.engine.sizes, pipe.schedule,
                     pipe.microbatches, ", remat" if pipe.remat else "")

    @property
    def data_part(self) -> tuple[int, int]:
        return self.layout.replica_of(self.identity.rank), self.layout.replicas

    def train_step(self, micro_batches) -> tuple[float, bool]:
        (inputs, targets), = micro_batches      # accumulation is 1: micro-batches are the pipeline's
        loss, applied = self.engine.step(inputs, targets, self.optimizer, self.spec.optim.grad_clip)
        return (loss or 0.0), applied

    def loss_terms(self, window: Window) -> list[float]:
        # Only last stages compute the loss: the mean is over replicas, not over all ranks.
        return [window.loss_sum, float(window.steps)] if self.engine.is_last else [0.0, 0.0]

    def throughput(self, steps: int, elapsed: float) -> dict:
        samples = self.spec.samples_per_step * steps / elapsed
        return {"samples_per_s": samples, "tokens_per_s": samples * self.spec.data.seq_len}

    def identity_fields(self) -> dict:
        return {"stage": self.engine.stage_index, "replica": self.engine.replica}

    @torch.no_grad()
    def evaluate(self, epoch: int) -> None:
        totals = torch.zeros(3, dtype=torch.float64)   # loss sum, correct tokens, tokens
        skipped = 0
        for inputs, targets in self.val_loader:
            self.heartbeat.progress(phase="evaluate")
            if len(inputs) != self.spec.data.batch_size:
                # The stages fixed their micro-batch shapes at the first step; a short last
                # batch would not match them, so it is left out (fewer than one batch per replica).
                skipped += len(inputs)
                continue
            part = self.engine.evaluate(inputs, targets)
            if part is not None:
                totals += part
        if skipped and self.identity.is_main:
            log.info("eval: %d sequence(s) of a short last batch left out on this replica", skipped)
        self.record_evaluation(epoch, totals, "next-token accuracy")

    # -- checkpoints: the stage's own file, written by replica 0 of each stage ------------------
    def capture_state(self) -> tuple[dict, dict, dict]:
        replicated = {**state.capture_progress(self), "stage_sizes": list(self.engine.sizes)}
        per_rank = {"rng": capture_rng(), "rank": self.identity.rank}
        files = {}
        if self.engine.replica == 0:
            files[stage_file(self.engine.stage_index)] = {
                "model": self.engine.module.block_state_dict(),
                "optimizer": self.optimizer.state_dict()}
        return replicated, per_rank, files

    def restore_state(self, replicated: dict, per_rank: dict | None, load_file) -> None:
        saved_sizes = list(replicated.get("stage_sizes", []))
        if saved_sizes != list(self.engine.sizes):
            raise CheckpointMismatch(f"the checkpoint's stages hold {saved_sizes} blocks, this job "
                                  f"cuts {self.engine.sizes}: resume with the same "
                                  "parallel.pipeline stages and balance")
        stage = load_file(stage_file(self.engine.stage_index))
        self.engine.module.load_block_state_dict(stage["model"])
        self.optimizer.load_state_dict(stage["optimizer"])
        state.restore_progress(self, replicated)
        state.restore_streams(self, per_rank)


def make_trainer(spec, paths, identity, stop=None, heartbeat=None) -> Trainer:
    """gpt runs on the pipeline engine (with one stage it is plain data parallelism, its
    micro-batches accumulating); the image models on the data-parallel trainer."""
    cls = PipelineTrainer if spec.model.name == "gpt" else Trainer
    return cls(spec, paths, identity, stop, heartbeat)

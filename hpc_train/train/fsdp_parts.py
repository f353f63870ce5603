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
from hpc_train.models import build_model, shard_units
from hpc_train.models.catalog import model as model_entry
from hpc_train.models.gpt import lm_loss
from hpc_train.parallel.fsdp import FsdpBackend, local_numel
from hpc_train.train.evaluation import evaluate_classifier
from hpc_train.train.optim import build_optimizer
from hpc_train.train.precision import Precision
from hpc_train.train.state import CheckpointedState, ModelBuffers
from hpc_train.train.step import optimizer_step
from hpc_train.train.timing import NO_CLOCK

log = logging.getLogger("hpc_train.trainer")


def build_job_model(spec) -> torch.nn.Module:
    """The spec's whole model: a block list for token data (vocabulary, sequence length), a
    classifier otherwise."""
    if model_entry(spec.model.name).block_list:
        return build_model(spec.model.name, spec.data.vocab_size, spec.model.options,
                           seq_len=spec.data.seq_len)
    return build_model(spec.model.name, spec.data.num_classes, spec.model.options)


class TokensAsSamples(torch.nn.Module):
    """A language model seen as a classifier of every position: (B, S) -> (B x S, vocabulary),
    so the classifier's evaluation sums over tokens (loss sum, correct tokens, tokens)."""

    def __init__(self, model: torch.nn.Module):
        super().__init__()
        self.model = model

    def forward(self, inputs: torch.Tensor) -> torch.Tensor:
        return self.model(inputs).flatten(0, 1)


class FsdpParts:
    """The `TrainingParts` of an fsdp job: the model sharded over all ranks."""

    def __init__(self, spec, paths, identity, device: torch.device):
        self.spec, self.device = spec, device
        self.backend = FsdpBackend(identity, device)
        torch.manual_seed(spec.run.seed)  # the same whole model everywhere; each keeps its shards
        model = build_job_model(spec).to(device)
        self.tokens = model_entry(spec.model.name).block_list
        self.model = self.backend.shard(model, shard_units(spec.model.name, model),
                                        spec.parallel.fsdp)
        self.optimizer = build_optimizer(spec.optim, self.model.parameters(), lr=spec.scaled_lr)
        self.precision = Precision(spec.precision.mode, device, spec.precision.loss_scale,
                                   spec.precision.init_scale, sharded=True)
        self.criterion = lm_loss if self.tokens else torch.nn.CrossEntropyLoss(
            label_smoothing=spec.optim.label_smoothing)
        if identity.is_main:
            log.info("fsdp: %d ranks, %d parameters on this rank of %d, units %s", identity.size,
                     local_numel(self.model), sum(p.numel() for p in self.model.parameters()),
                     spec.model.name)

    def states(self) -> CheckpointedState:
        """The scaler replicated; model and optimizer sharded (every rank writes its shards);
        buffers per rank (FSDP leaves them whole on every rank, as Horovod does)."""
        return CheckpointedState(
            replicated={"precision": self.precision},
            per_rank={"buffers": ModelBuffers(self.model)},
            sharded=ShardedModelState(self.model, self.optimizer))

    def train_step(self, micro_batches, clock=NO_CLOCK) -> tuple[float, bool]:
        return optimizer_step(self.model, self.optimizer, micro_batches, self.criterion,
                              self.precision, self.backend, self.spec.optim.grad_clip, clock)

    def evaluate(self, val_batches, tick) -> torch.Tensor:
        """This rank's (loss sum, correct, count): images, or the tokens of a language model."""
        model, classes = self.model, self.spec.data.num_classes
        batches = self._agreed(val_batches)
        if self.tokens:
            model, classes = TokensAsSamples(model), self.spec.data.vocab_size
            batches = ((inputs, targets.flatten()) for inputs, targets in batches)
        totals = evaluate_classifier(model, batches, self.device, self.precision.autocast,
                                     classes, tick)
        return totals[:3].clone()

    def _agreed(self, batches):
        """This rank's batches, while every rank forwards in step: a forward gathers each unit's
        shards from all ranks, and the validation parts differ in length (every sample once).
        A rank out of batches forwards its last one again, uncounted, until all are out."""
        batches, last = iter(batches), None
        while True:
            batch = next(batches, None)
            left = self.backend.allreduce_sum(torch.tensor([0.0 if batch is None else 1.0]))
            if left.item() == 0:
                return
            if batch is not None:
                last = batch
                yield batch
            else:
                with torch.no_grad(), self.precision.autocast():
                    self.model(self._blank() if last is None else last[0])

    def _blank(self) -> torch.Tensor:
        """One input of the model's shape, for a rank that has no validation batch at all."""
        data = self.spec.data
        if self.tokens:
            return torch.zeros(1, data.seq_len, dtype=torch.long, device=self.device)
        return torch.zeros(1, 3, data.image_size, data.image_size, device=self.device)

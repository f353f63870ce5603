"""What the sharded backends' parts (train/fsdp_parts.py, train/deepspeed_parts.py) share: the
spec's whole model before it is sharded, and an evaluation whose forwards run in step on every
rank.

A sharded model's forward is a collective: FSDP, and DeepSpeed with ZeRO-3, gather each unit's
parameters from every rank. The validation parts differ in length (every sample once), so a rank
out of batches forwards its last one again, uncounted, until every rank is out; otherwise the
ranks with a batch more would wait for the others forever.
"""

from __future__ import annotations

from typing import Callable, ContextManager, Iterable

import torch

from hpc_train.models import build_model
from hpc_train.models.catalog import model as model_entry


def build_job_model(spec) -> torch.nn.Module:
    """The spec's whole model: a block list for token data (vocabulary, sequence length), a
    classifier otherwise."""
    if model_entry(spec.model.name).block_list:
        return build_model(spec.model.name, spec.data.vocab_size, spec.model.options,
                           seq_len=spec.data.seq_len)
    return build_model(spec.model.name, spec.data.num_classes, spec.model.options)


def evaluate_in_step(model: torch.nn.Module, task, spec, device: torch.device, batches: Iterable,
                     autocast: Callable[[], ContextManager], tick: Callable[[], None],
                     allreduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """This rank's sums of the job's task (train/task.py) over `batches`, every forward in
    step with the other ranks'."""
    return task.evaluate(model, _in_step(model, spec, device, batches, autocast, allreduce_sum),
                         autocast, tick)


def _in_step(model, spec, device, batches, autocast, allreduce_sum):
    """This rank's batches; once it has none left, its last one forwarded again (uncounted)
    while another rank still has one."""
    batches, last = iter(batches), None
    while True:
        batch = next(batches, None)
        left = allreduce_sum(torch.tensor([0.0 if batch is None else 1.0]))
        if left.item() == 0:
            return
        if batch is not None:
            last = batch
            yield batch
        else:
            with torch.no_grad(), autocast():
                model(_blank(spec, device) if last is None else last[0])


def _blank(spec, device: torch.device) -> torch.Tensor:
    """One input of the model's shape, for a rank that has no validation batch at all."""
    data = spec.data
    if model_entry(spec.model.name).block_list:
        return torch.zeros(1, data.seq_len, dtype=torch.long, device=device)
    return torch.zeros(1, 3, data.image_size, data.image_size, device=device)

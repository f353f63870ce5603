"""What the sharded backends' parts (train/fsdp_parts.py, train/deepspeed_parts.py) share: the
spec's whole model before it is sharded, and an evaluation whose forwards run in step on every
rank.

A sharded model's forward is a collective: FSDP, and DeepSpeed with ZeRO-3, gather each unit's
parameters from every rank. The validation parts differ in length (every sample once), so a rank
out of batches forwards its last one again, uncounted, until every rank is out; otherwise the
ranks with a batch more would wait for the others forever. A rank with no validation batch at
all forwards a blank input shaped as the first training input it saw (`BlankInput`): image,
token ids or whatever the user's dataset yields, the model takes it as it took that one.
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


class BlankInput:
    """One sample of zeros shaped and typed as the first training input this rank saw (a
    tensor, or a tuple/list/dict of them), on its device: the input of a forward that only
    joins the other ranks' collectives. Told every training micro-batch (`see`); it keeps the
    first. Evaluation runs after a training step in the same process, so it has seen one."""

    def __init__(self):
        self._blank = None

    def see(self, inputs) -> None:
        if self._blank is None:
            self._blank = _zeros_of_one(inputs)

    def __call__(self):
        if self._blank is None:
            raise RuntimeError("no training input seen yet: a blank forward has no shape to take")
        return self._blank


def _zeros_of_one(inputs):
    """Zeros like the first sample of `inputs`, nested containers kept; other values as they are."""
    if isinstance(inputs, torch.Tensor):
        return torch.zeros_like(inputs[:1])
    if isinstance(inputs, dict):
        return type(inputs)({k: _zeros_of_one(v) for k, v in inputs.items()})
    if isinstance(inputs, (list, tuple)):
        return type(inputs)(_zeros_of_one(v) for v in inputs)
    return inputs


def evaluate_in_step(model: torch.nn.Module, task, batches: Iterable, blank: BlankInput,
                     autocast: Callable[[], ContextManager], tick: Callable[[], None],
                     allreduce_sum: Callable[[torch.Tensor], torch.Tensor]) -> torch.Tensor:
    """This rank's sums of the job's task (train/task.py) over `batches`, every forward in
    step with the other ranks'."""
    return task.evaluate(model, _in_step(model, batches, blank, autocast, allreduce_sum),
                         autocast, tick)


def _in_step(model, batches, blank, autocast, allreduce_sum):
    """This rank's batches; once it has none left, its last one forwarded again (uncounted)
    while another rank still has one (a blank input if it had none)."""
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
                model(blank() if last is None else last[0])

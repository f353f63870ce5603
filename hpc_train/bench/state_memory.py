"""The bytes of training state a rank holds, split into parameters, gradients and optimizer
state (fp32 master weights beside it where a backend keeps them), one function per kind of
backend: `bench train`'s memory split (the rest of the peak is everything else).

What is counted is what the rank actually holds: unique storages (a view, a flat buffer and the
parameters that are views into it count once, under the first kind that names them), at their
whole size (padding included), on this rank only:
- ddp, horovod (and a gpt's data-parallel block list): the parameters, their `.grad` and the
  optimizer's state, plain tensors on every rank.
- fsdp: the local shards of FSDP2's DTensors (`to_local()`): parameters, gradients, AdamW's state.
- deepspeed: the ZeRO optimizer's own flat buffers (DeepSpeed 0.19.8): the parameters' flat
  buffer (stages 1, 2: `bit16_groups_flat`, the whole model; stage 3: each parameter's partition
  `ds_tensor` in `fp16_partitioned_groups_flat`, and any parameter gathered or kept whole), the
  fp32 master partition (`single_partition_of_fp32_groups`, `fp32_partitioned_groups_flat`)
  and its `.grad`, the gradient buffers (`averaged_gradients`, `grads_in_partition`,
  `ipg_buffer`; stage 3 `grad_partitions_flat_buffer` and its bucket buffer), and the wrapped
  torch optimizer's state (on the master partition).

When: `at_optimizer_step` takes the figure in a pre-step hook of torch's optimizer, the point of
a step where the state is largest: backward is done and gradients are reduced (or, Horovod,
being reduced in place), the optimizer state of earlier steps exists, and nothing has zeroed or
freed the gradients yet (DeepSpeed calls the wrapped optimizer's step after it has put the
gradient partition on the fp32 master). Torch is imported inside the functions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass

KINDS = ("parameters", "gradients", "optimizer", "master")


@dataclass(frozen=True)
class StateBytes:
    parameters: int
    gradients: int
    optimizer: int          # the optimizer's own state (AdamW: two moments and a step count)
    master: int = 0         # fp32 master weights kept beside the parameters (ZeRO)

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer + self.master

    def as_dict(self) -> dict:
        return {**asdict(self), "total": self.total}


class _Storages:
    """Bytes per kind of unique storages: the first kind to name a storage keeps it."""

    def __init__(self):
        self.seen: set[tuple[str, int]] = set()
        self.bytes = dict.fromkeys(KINDS, 0)

    def add(self, kind: str, tensors: Iterable) -> None:
        for tensor in tensors_in(tensors):
            tensor = tensor.to_local() if hasattr(tensor, "to_local") else tensor
            storage = tensor.untyped_storage()
            key = (str(tensor.device), storage.data_ptr())
            if storage.nbytes() == 0 or key in self.seen:
                continue
            self.seen.add(key)
            self.bytes[kind] += storage.nbytes()

    def result(self) -> StateBytes:
        return StateBytes(**self.bytes)


def tensors_in(found) -> Iterator:
    """Every tensor in `found`: a tensor, or lists, tuples and dicts of them (nested)."""
    import torch

    if isinstance(found, torch.Tensor):
        yield found
    elif isinstance(found, dict):
        for value in found.values():
            yield from tensors_in(value)
    elif isinstance(found, (list, tuple)):
        for value in found:
            yield from tensors_in(value)


def _optimizer_state(optimizer) -> list:
    return [value for state in optimizer.state.values() for value in state.values()]


def data_parallel_state(model, optimizer) -> StateBytes:
    """DDP, Horovod, a gpt's block list: the whole model, its gradients and the optimizer's
    state on every rank (DDP's and Horovod's own buffers are the rest)."""
    storages = _Storages()
    params = list(model.parameters())
    storages.add("parameters", params)
    storages.add("gradients", [p.grad for p in params if p.grad is not None])
    storages.add("optimizer", _optimizer_state(optimizer))
    return storages.result()


MASTER = ("single_partition_of_fp32_groups", "fp32_partitioned_groups_flat")
FLAT_PARAMETERS = ("bit16_groups_flat", "fp16_partitioned_groups_flat")
GRADIENT_BUFFERS = ("averaged_gradients", "grads_in_partition", "ipg_buffer",
                    "grad_partitions_flat_buffer", "_DeepSpeedZeroOptimizer_Stage3__ipg_bucket_flat_buffer")


def deepspeed_state(engine) -> StateBytes:
    """DeepSpeed ZeRO 1-3: the engine's module parameters and the ZeRO optimizer's flat
    buffers (see the module's docstring for each stage's)."""
    zero = engine.optimizer
    storages = _Storages()
    params = list(engine.module.parameters())
    storages.add("parameters", [getattr(zero, name, None) for name in FLAT_PARAMETERS])
    storages.add("parameters", [p.ds_tensor for p in params if getattr(p, "ds_tensor", None) is not None])
    storages.add("parameters", [p.data for p in params])
    master = [t for name in MASTER for t in tensors_in(getattr(zero, name, None))]
    storages.add("gradients", [t.grad for t in master if t.grad is not None])
    storages.add("gradients", [getattr(zero, name, None) for name in GRADIENT_BUFFERS])
    storages.add("gradients", [p.grad for p in params if p.grad is not None])
    storages.add("master", master)
    storages.add("optimizer", _optimizer_state(zero.optimizer))
    return storages.result()


def state_of(backend: str, parts) -> StateBytes:
    """The split for a trainer's parts of this bench backend name (ddp, horovod, fsdp, zeroN)."""
    if backend.startswith("zero"):
        return deepspeed_state(parts.engine)
    # FSDP2 too: _Storages takes each DTensor's local shard (parameters gathered whole for a
    # forward or backward are the rest).
    return data_parallel_state(parts.model, parts.optimizer)


@contextlib.contextmanager
def at_optimizer_step(measure) -> Iterator[list]:
    """While inside: the first optimizer step of any torch optimizer calls `measure()` just
    before it runs; the yielded list then holds its result."""
    from torch.optim.optimizer import register_optimizer_step_pre_hook

    taken: list = []

    def hook(optimizer, args, kwargs):
        if not taken:
            taken.append(measure())

    handle = register_optimizer_step_pre_hook(hook)
    try:
        yield taken
    finally:
        handle.remove()

"""DDP's gradient compression: torch's communication hooks for parallel.compression, and the
PowerSGD state as a checkpoint component.

fp16 and bf16 cast each bucket for the allreduce and back (half the bytes; bf16 keeps fp32's
range, so no gradient overflows). PowerSGD (Vogels et al. 2019; torch's `powerSGD_hook`) sends
each gradient matrix as two rank-r factors and keeps on every rank what the factors missed
(error feedback), adding it to the next step's gradient; vectors (biases, norms) go
uncompressed. Its state is per rank and changes every step: the residuals, the last factors
(warm start) and its random stream. A resume that did not restore it would train differently
from the uninterrupted run, so it is a per-rank checkpoint component (`PowerSgdState`), written
as plain tensors (loadable with weights_only=True).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import torch

log = logging.getLogger("hpc_train.parallel")

# PowerSGD's per-bucket memories: bucket index -> tensor.
_MEMORIES = ("error_dict", "p_memory_dict", "q_memory_dict")


class PowerSgdState:
    """torch's PowerSGDState of this rank as a checkpoint component (`Stateful`): saved per rank,
    loaded only at the world size it was saved at (its residuals are this rank's share of the
    gradient at that size; elsewhere PowerSGD starts afresh, with a log line)."""

    def __init__(self, state, world_size: int):
        self.state, self.world_size = state, world_size

    def state_dict(self) -> dict[str, Any]:
        s = self.state
        name, keys, pos, has_gauss, cached = s.rng.get_state()
        return {"world_size": self.world_size, "iter": int(s.iter),
                "rng": {"keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                        "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
                **{memory: {int(k): v.detach().clone() for k, v in getattr(s, memory).items()}
                   for memory in _MEMORIES}}

    def load_state_dict(self, saved: dict[str, Any]) -> None:
        if saved["world_size"] != self.world_size:
            log.info("PowerSGD state saved at %d ranks, resumed at %d: its residuals start afresh",
                     saved["world_size"], self.world_size)
            return
        s, rng = self.state, saved["rng"]
        s.iter = saved["iter"]
        s.rng.set_state(("MT19937", rng["keys"].numpy().astype(np.uint32), rng["pos"],
                         rng["has_gauss"], rng["cached_gaussian"]))
        device = _device_of(s)
        for memory in _MEMORIES:
            setattr(s, memory, {int(k): v.to(device) for k, v in saved[memory].items()})

    def fresh(self) -> None:
        """No saved state for this rank (a resume on more ranks): PowerSGD starts afresh."""


def _device_of(state) -> torch.device | None:
    """Where the hook keeps its memories; None (as saved) before it has any."""
    for memory in _MEMORIES:
        for tensor in getattr(state, memory).values():
            return tensor.device
    return None


def bf16_average_hook(process_group, bucket):
    """torch's bf16_compress_hook under another name: DDP refuses that one (by its name) unless
    on NCCL, though Gloo reduces bf16 too (checked on 2 CPU ranks). Each bucket is averaged in
    bf16, then written back in its own dtype."""
    import torch.distributed as dist

    group = process_group if process_group is not None else dist.group.WORLD
    buffer = bucket.buffer()
    compressed = buffer.to(torch.bfloat16).div_(group.size())
    future = dist.all_reduce(compressed, group=group, async_op=True).get_future()

    def decompress(done):
        buffer.copy_(done.value()[0])
        return buffer

    return future.then(decompress)


def bucket_options(compression: str) -> dict[str, Any]:
    """DDP's bucket options for `compression` (none where its defaults serve).

    PowerSGD keeps its residuals and factors per bucket, so the buckets must be the same in
    every process of a run, resumed or not. DDP's first step reduces one bucket of every
    gradient, then it rebuilds its buckets in the order the gradients were ready: a resumed
    process starts over with the first layout, and PowerSGD's state would land on the wrong
    gradients. With find_unused_parameters DDP never rebuilds (size-capped buckets in reverse
    definition order from the start; checked on resnet_tiny), at the cost of one walk of the
    autograd graph a step (and a warning of DDP's, once, in the rank log)."""
    return {"find_unused_parameters": True} if compression == "powersgd" else {}


def waited(hook):
    """`hook`, finished before it returns: for Gloo. PowerSGD issues a bucket's second and
    third allreduce from the first one's callback, while DDP starts the next bucket's hook;
    the ranks then issued them in different orders and Gloo aborted ("Received data size
    doesn't match expected size") in 3 of 4 two-rank runs of resnet_tiny; waited, 0 of 4
    (torch's own tests run this hook on NCCL only: pytorch#58467). Costs the overlap of the
    compression with the rest of backward."""
    def run(state, bucket):
        future = hook(state, bucket)
        future.wait()
        return future

    return run


def register(model, compression: str, powersgd, world_size: int) -> PowerSgdState | None:
    """Register `compression`'s hook on the DDP `model`; the PowerSGD checkpoint component for
    powersgd, else None. `powersgd`: the spec's parallel.powersgd."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as power_sgd

    if compression == "fp16":
        model.register_comm_hook(None, default_hooks.fp16_compress_hook)
    elif compression == "bf16":
        model.register_comm_hook(None, bf16_average_hook)
    elif compression == "powersgd":
        state = power_sgd.PowerSGDState(
            process_group=None, matrix_approximation_rank=powersgd.rank,
            start_powerSGD_iter=powersgd.start_step, warm_start=powersgd.warm_start,
            use_error_feedback=True, random_seed=0, min_compression_rate=2)
        on_gloo = next(model.parameters()).device.type == "cpu"
        model.register_comm_hook(state, waited(power_sgd.powerSGD_hook) if on_gloo
                                 else power_sgd.powerSGD_hook)
        return PowerSgdState(state, world_size)
    return None

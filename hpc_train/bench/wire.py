"""Bytes on the wire per training step: the collectives a step makes, measured where Python
calls them, computed where it cannot see them (Horovod's allreduce runs in C++), and the wire
bytes each rank sends under the ring model.

Measured: while a step runs, `CollectiveCounter` wraps the torch.distributed functions (what
FSDP2, a gpt's block list, DeepSpeed's all_reduce and DDP's comm hook call by name: `bench
train`'s StepClock gives DDP its default allreduce as a Python comm hook, train/timing.py) and the
functions DeepSpeed's communication backend keeps references to (its all-gather and
reduce-scatter), recording each call's operation and payload; nothing else changes.
Computed: Horovod averages every gradient once per step, so its payload is the gradients'
bytes (half with fp16 compression of fp32 gradients).

Payload: allreduce, broadcast and reduce: the tensor; all-gather: the whole gathered output;
reduce-scatter: the whole input. Ring-model bytes each rank sends for N ranks: allreduce
2(N-1)/N x payload; reduce-scatter and all-gather (N-1)/N x the whole; broadcast and reduce
(a pipelined chain) the payload once.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

RING_FACTOR = {"all_reduce": lambda n: 2 * (n - 1) / n, "all_gather": lambda n: (n - 1) / n,
               "reduce_scatter": lambda n: (n - 1) / n, "broadcast": lambda n: 1.0 if n > 1 else 0.0,
               "reduce": lambda n: 1.0 if n > 1 else 0.0}
# torch.distributed's functions by operation, and the argument that holds the payload (its
# position and the names it is passed by).
TENSOR, OUTPUT, INPUT = (0, ("tensor", "tensors", "tensor_list")), (0, ("output_tensor", "output")), \
    (1, ("input_tensor", "input", "tensors"))
TORCH_FUNCTIONS = {"all_reduce": ("all_reduce", TENSOR), "all_reduce_coalesced": ("all_reduce", TENSOR),
                   "all_gather_single": ("all_gather", OUTPUT),
                   "all_gather_into_tensor": ("all_gather", OUTPUT),
                   "_all_gather_base": ("all_gather", OUTPUT), "all_gather": ("all_gather", TENSOR),
                   "reduce_scatter_single": ("reduce_scatter", INPUT),
                   "reduce_scatter_tensor": ("reduce_scatter", INPUT),
                   "_reduce_scatter_base": ("reduce_scatter", INPUT),
                   "reduce_scatter": ("reduce_scatter", (1, ("input_list",))),
                   "broadcast": ("broadcast", TENSOR), "_broadcast_coalesced": ("broadcast", INPUT),
                   "reduce": ("reduce", TENSOR)}
DEEPSPEED_FUNCTIONS = {"all_gather_function": ("all_gather", OUTPUT),
                       "reduce_scatter_function": ("reduce_scatter", INPUT)}


def ring_wire_bytes(operation: str, payload: float, ranks: int) -> float:
    """Bytes one rank sends for one collective of `payload` bytes over `ranks` ranks (ring)."""
    return RING_FACTOR[operation](ranks) * payload


def payload_bytes(found) -> int:
    """Bytes of a tensor, or of the tensors of a (nested) list: a collective's argument."""
    if isinstance(found, (list, tuple)):
        return sum(payload_bytes(item) for item in found)
    if hasattr(found, "numel") and hasattr(found, "element_size"):
        return found.numel() * found.element_size()
    return 0


def per_step(calls: Iterable[tuple[str, int]], steps: int, ranks: int, source: str) -> dict:
    """{operation: {calls, payload_bytes, wire_bytes, source}} per step from (operation,
    payload) records of `steps` steps."""
    ops: dict[str, dict] = {}
    for operation, payload in calls:
        entry = ops.setdefault(operation, {"calls": 0, "payload_bytes": 0.0, "source": source})
        entry["calls"] += 1
        entry["payload_bytes"] += payload
    for operation, entry in ops.items():
        entry["calls"] /= max(steps, 1)
        entry["payload_bytes"] /= max(steps, 1)
        entry["wire_bytes"] = ring_wire_bytes(operation, entry["payload_bytes"], ranks)
    return ops


def horovod_gradients(gradient_bytes: int, fp32: bool, compression: str) -> list[tuple[str, int]]:
    """The allreduce Horovod makes in a step, computed: every gradient once, fp16-compressed
    fp32 gradients at half their bytes."""
    return [("all_reduce", gradient_bytes // 2 if compression == "fp16" and fp32 else gradient_bytes)]


def summary(ops: dict) -> dict:
    """Totals of per_step's operations: payload and wire bytes, and how they were known."""
    return {"payload_bytes": sum(e["payload_bytes"] for e in ops.values()),
            "wire_bytes": sum(e["wire_bytes"] for e in ops.values()),
            "sources": sorted({e["source"] for e in ops.values()}), "ops": ops}


class CollectiveCounter:
    """Records (operation, payload bytes) of every collective called while `counting(f)`'s
    wrapper runs; the functions are wrapped for that call only and restored after it."""

    def __init__(self):
        self.calls: list[tuple[str, int]] = []
        self.steps = 0

    def _targets(self) -> list[tuple[object, str, str, tuple]]:
        import sys

        import torch.distributed as dist

        targets = [(dist, name, op, argument) for name, (op, argument) in TORCH_FUNCTIONS.items()
                   if hasattr(dist, name)]
        comm = sys.modules.get("deepspeed.comm.comm")     # only where a DeepSpeed engine runs
        backend = getattr(comm, "cdb", None)
        if backend is not None:
            targets += [(backend, name, op, argument) for name, (op, argument) in DEEPSPEED_FUNCTIONS.items()
                        if getattr(backend, name, None) is not None]
        return targets

    def _wrapped(self, function, operation: str, argument: tuple):
        position, names = argument

        @functools.wraps(function)
        def counted(*args, **kwargs):
            given = args[position] if len(args) > position else \
                next((kwargs[n] for n in names if n in kwargs), None)
            self.calls.append((operation, payload_bytes(given)))
            return function(*args, **kwargs)
        return counted

    def counting(self, step):
        """`step`, counting its collectives (and itself: `steps`)."""
        @functools.wraps(step)
        def counted_step(*args, **kwargs):
            targets = self._targets()
            saved = [(owner, name, getattr(owner, name)) for owner, name, _, _ in targets]
            for owner, name, op, argument in targets:
                setattr(owner, name, self._wrapped(getattr(owner, name), op, argument))
            try:
                return step(*args, **kwargs)
            finally:
                for owner, name, original in saved:
                    setattr(owner, name, original)
                self.steps += 1
        return counted_step

    def reset(self) -> None:
        self.calls, self.steps = [], 0

"""The training state copied to host memory at a step boundary, so training can go on changing it.

`capture()` returns state dicts whose tensors *are* the live parameters, optimizer buffers and
BatchNorm statistics: the next optimizer step would change what a background writer is still
serialising. `HostSnapshot.take` copies every tensor into host buffers of its own (page-locked
for CUDA tensors, so the device-to-host copies run as DMA and one synchronize covers them all)
and rebuilds the containers around them; plain values are copied too. The buffers are kept and
reused: the next save copies into them instead of allocating (and page-faulting) hundreds of MB
again, which is safe because a save waits for the previous write before taking its snapshot.
"""

from __future__ import annotations

import copy
from typing import Any

import torch


class HostSnapshot:
    def __init__(self):
        self._buffers: dict[tuple, torch.Tensor] = {}

    def take(self, state: Any) -> Any:
        """A copy of `state` (nested dicts, lists, tuples, tensors, plain values) that shares no
        memory with it, tensors on the CPU. Returns after every device copy has landed."""
        self._cuda = False
        threads = torch.get_num_threads()
        # One thread: a copy is bound by memory bandwidth, and torch's intra-op threads on a
        # busy node made these copies 2-5x slower, not faster (measured, bench checkpoint).
        torch.set_num_threads(1)
        try:
            out = self._copy(state, ())
        finally:
            torch.set_num_threads(threads)
        if self._cuda:
            torch.cuda.synchronize()
        return out

    def _copy(self, value: Any, path: tuple) -> Any:
        if isinstance(value, torch.Tensor):
            return self._tensor(value.detach(), path)
        if isinstance(value, dict):
            return type(value)((k, self._copy(v, path + (k,))) for k, v in value.items())
        if isinstance(value, list):
            return [self._copy(v, path + (i,)) for i, v in enumerate(value)]
        if isinstance(value, tuple) and not hasattr(value, "_fields"):
            return tuple(self._copy(v, path + (i,)) for i, v in enumerate(value))
        return copy.deepcopy(value)

    def _tensor(self, tensor: torch.Tensor, path: tuple) -> torch.Tensor:
        buffer = self._buffers.get(path)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            pin = tensor.is_cuda
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
            self._buffers[path] = buffer
        buffer.copy_(tensor, non_blocking=tensor.is_cuda)
        self._cuda = self._cuda or tensor.is_cuda
        return buffer

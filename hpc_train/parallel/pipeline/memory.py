"""Peak activation memory of a stage, measured the same way on CPUs and GPUs.

`SavedTensorMeter` counts the bytes autograd keeps for backward (saved tensors, minus the
parameters themselves) while they are alive, and records the peak. That is the memory that
micro-batching and rematerialization trade; unlike process RSS it is exact and not blurred by
the allocator. On a GPU, torch.cuda.max_memory_allocated gives the allocator's view as well.
"""

from __future__ import annotations

import weakref

import torch
from torch import nn


class _Saved:
    __slots__ = ("__weakref__", "tensor")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


class SavedTensorMeter:
    def __init__(self, module: nn.Module):
        self.module = module
        self.live = 0
        self.peak = 0

    def _release(self, nbytes: int) -> None:
        self.live -= nbytes

    def _pack(self, tensor: torch.Tensor):
        if tensor.untyped_storage().data_ptr() in self._param_storages:
            return tensor                          # a weight, not an activation
        nbytes = tensor.untyped_storage().nbytes()
        saved = _Saved(tensor)
        self.live += nbytes
        self.peak = max(self.peak, self.live)
        weakref.finalize(saved, self._release, nbytes)
        return saved

    @staticmethod
    def _unpack(saved):
        return saved.tensor if isinstance(saved, _Saved) else saved

    def __enter__(self) -> SavedTensorMeter:
        self._param_storages = {p.untyped_storage().data_ptr() for p in self.module.parameters()}
        self._hooks = torch.autograd.graph.saved_tensors_hooks(self._pack, self._unpack)
        self._hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._hooks.__exit__(*exc)

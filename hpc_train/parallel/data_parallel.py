"""Data-parallel backends behind one small interface, so one job spec runs on Horovod or DDP.

Every Horovod call of the package lives in this module (and the worker's init), so DDP can
stand beside it and Horovod, dormant upstream since 2023, stays replaceable.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

import torch

from hpc_train.runtime.identity import RankInfo


class HorovodBackend:
    """Gradients averaged by `hvd.DistributedOptimizer`; accumulation via backward_passes_per_step."""

    name = "horovod"

    def __init__(self, identity: RankInfo):
        import horovod.torch as hvd

        hvd.init()
        self.hvd = hvd
        self.rank, self.size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
        if (self.rank, self.size) != (identity.rank, identity.size):
            raise RuntimeError(f"Horovod sees rank {self.rank}/{self.size}, the launcher "
                               f"{identity.rank}/{identity.size}: mixed MPI installations?")

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                accumulation: int, compression: str) -> tuple[torch.nn.Module, Any]:
        hvd = self.hvd
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        # No broadcast_optimizer_state here: every rank builds the same optimizer, and on a
        # fresh optimizer Horovod's version takes a zero-gradient step (weight decay moves the
        # weights). Resumed state is loaded by every rank from the same checkpoint.
        optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(),
            compression=hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none,
            backward_passes_per_step=accumulation, op=hvd.Average)
        return model, optimizer

    def accumulate(self, model: torch.nn.Module, last_pass: bool):
        return contextlib.nullcontext()  # Horovod counts backward passes itself

    def precision_hooks(self, optimizer) -> dict:
        return {"synchronize": optimizer.synchronize,
                "skip_sync_context": optimizer.skip_synchronize}

    def allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        return self.hvd.allreduce(tensor, op=self.hvd.Sum)

    def barrier(self) -> None:
        self.hvd.barrier()

    def shutdown(self) -> None:
        self.hvd.shutdown()


class DdpBackend:
    """torch.distributed with ranks from the MPI launcher: NCCL on GPUs, Gloo on CPUs."""

    name = "ddp"

    def __init__(self, identity: RankInfo, device: torch.device):
        import torch.distributed as dist

        self.dist = dist
        self.rank, self.size, self.local_rank = identity.rank, identity.size, identity.local_rank
        self.device = device
        addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
        port = os.environ.get("MASTER_PORT", "29500")
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                                init_method=f"tcp://{addr}:{port}", rank=self.rank,
                                world_size=self.size)

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                accumulation: int, compression: str) -> tuple[torch.nn.Module, Any]:
        from torch.nn.parallel import DistributedDataParallel

        # DDP broadcasts rank 0's parameters and buffers when it wraps the model.
        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids), optimizer

    def accumulate(self, model, last_pass: bool):
        # Skip the gradient all-reduce on all but the last backward pass of a step.
        return contextlib.nullcontext() if last_pass else model.no_sync()

    def precision_hooks(self, optimizer) -> dict:
        return {}

    def allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        tensor = tensor.clone()
        self.dist.all_reduce(tensor)
        return tensor

    def barrier(self) -> None:
        self.dist.barrier()

    def shutdown(self) -> None:
        self.dist.destroy_process_group()


def make_backend(name: str, identity: RankInfo, device: torch.device):
    if name == "horovod":
        return HorovodBackend(identity)
    if name == "ddp":
        return DdpBackend(identity, device)
    raise ValueError(f"unknown data-parallel backend {name!r}")

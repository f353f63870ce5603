"""Data-parallel backends behind one small interface, so one job spec runs on Horovod or DDP.

Every Horovod call of the package lives in this module (and the pipeline's replica averaging,
parallel/pipeline/groups.py), so DDP can stand beside it and Horovod, dormant upstream since
2023, stays replaceable. The torch.distributed world (`init_torch_distributed`,
`TorchCollectives`) serves DDP and the pipeline alike.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Any

import torch

from hpc_train.launch.horovod import read_knobs
from hpc_train.launch.identity import RankInfo
from hpc_train.launch.network import DEFAULT_MASTER_PORT


class HorovodBackend:
    """Gradients averaged by `hvd.DistributedOptimizer`; accumulation via backward_passes_per_step."""

    name = "horovod"
    compression = "none"   # what goes on the wire, as prepare() set it up
    compression_state = None   # Horovod's fp16 compression keeps no state

    def __init__(self, identity: RankInfo):
        import horovod.torch as hvd

        hvd.init()
        self.hvd = hvd
        self.rank, self.size, self.local_rank = hvd.rank(), hvd.size(), hvd.local_rank()
        if (self.rank, self.size) != (identity.rank, identity.size):
            raise RuntimeError(f"Horovod sees rank {self.rank}/{self.size}, the launcher "
                               f"{identity.rank}/{identity.size}: mixed MPI installations?")
        # What Horovod was told (parallel.horovod, or launch.env), in this rank's log.
        logging.getLogger("hpc_train.parallel").info(
            "horovod %d ranks, knobs %s", self.size, read_knobs(os.environ) or "Horovod's defaults")

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                accumulation: int, compression: str, powersgd=None) -> tuple[torch.nn.Module, Any]:
        hvd = self.hvd
        hvd.broadcast_parameters(model.state_dict(), root_rank=0)
        # No broadcast_optimizer_state here: every rank builds the same optimizer, and on a
        # fresh optimizer Horovod's version takes a zero-gradient step (weight decay moves the
        # weights). Resumed state is loaded by every rank from the same checkpoint.
        optimizer = hvd.DistributedOptimizer(
            optimizer, named_parameters=model.named_parameters(),
            compression=hvd.Compression.fp16 if compression == "fp16" else hvd.Compression.none,
            backward_passes_per_step=accumulation, op=hvd.Average)
        self.compression = compression
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


def init_torch_distributed(rank: int, world: int, device: torch.device) -> None:
    """The torch.distributed world of the ranks mpirun started: NCCL on GPUs, Gloo on CPUs,
    rendezvous at MASTER_ADDR:MASTER_PORT (set by the driver)."""
    import torch.distributed as dist

    if dist.is_initialized():
        # One world per process: `bench train` builds several trainers in the same ranks.
        if (dist.get_rank(), dist.get_world_size()) != (rank, world):
            raise RuntimeError(f"torch.distributed already joined as rank {dist.get_rank()}/"
                               f"{dist.get_world_size()}, asked for {rank}/{world}")
        return
    addr = os.environ.get("MASTER_ADDR", "127.0.0.1")
    port = os.environ.get("MASTER_PORT", DEFAULT_MASTER_PORT)
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo",
                            init_method=f"tcp://{addr}:{port}", rank=rank, world_size=world)


class TorchCollectives:
    """Whole-job collectives over torch.distributed, for the checkpoint code and the logging.

    Tensors go to the device for the collective and come back: NCCL reduces GPU tensors only,
    and callers pass small CPU tensors (loss sums, stop flags).
    """

    def __init__(self, device: torch.device):
        import torch.distributed as dist

        self.dist, self.device = dist, device

    def allreduce_sum(self, tensor: torch.Tensor) -> torch.Tensor:
        out = tensor.to(self.device, copy=True)
        self.dist.all_reduce(out)
        return out.to(tensor.device)

    def barrier(self) -> None:
        self.dist.barrier()

    def shutdown(self) -> None:
        # Every rank must be done with its collectives before any rank tears Gloo down: a rank
        # still reading from a pair that its peer just closed aborts the process ("terminate
        # called without an active exception", seen in about 1 of 30 two-rank runs).
        if self.dist.is_initialized():
            self.dist.barrier()
            self.dist.destroy_process_group()


class DdpBackend(TorchCollectives):
    """torch.distributed with ranks from the MPI launcher: NCCL on GPUs, Gloo on CPUs."""

    name = "ddp"
    compression = "none"   # what goes on the wire, as prepare() set it up (parallel/ddp_hooks.py)
    # PowerSGD's per-rank state (a checkpoint component), when prepare() set it up.
    compression_state = None

    def __init__(self, identity: RankInfo, device: torch.device):
        init_torch_distributed(identity.rank, identity.size, device)
        super().__init__(device)
        self.rank, self.size, self.local_rank = identity.rank, identity.size, identity.local_rank

    def prepare(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, *,
                accumulation: int, compression: str, powersgd=None) -> tuple[torch.nn.Module, Any]:
        from torch.nn.parallel import DistributedDataParallel

        from hpc_train.parallel import ddp_hooks

        # DDP broadcasts rank 0's parameters and buffers when it wraps the model.
        ids = [self.device.index] if self.device.type == "cuda" else None
        model = DistributedDataParallel(model, device_ids=ids,
                                        **ddp_hooks.bucket_options(compression))
        self.compression_state = ddp_hooks.register(model, compression, powersgd, self.size)
        self.compression = compression
        return model, optimizer

    def accumulate(self, model, last_pass: bool):
        # Skip the gradient all-reduce on all but the last backward pass of a step.
        return contextlib.nullcontext() if last_pass else model.no_sync()

    def precision_hooks(self, optimizer) -> dict:
        return {}


def make_backend(name: str, identity: RankInfo, device: torch.device):
    if name == "horovod":
        return HorovodBackend(identity)
    if name == "ddp":
        return DdpBackend(identity, device)
    raise ValueError(f"unknown data-parallel backend {name!r}")

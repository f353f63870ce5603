"""torch FSDP2 over the job's ranks: the device mesh, a model sharded block by block, and the
gradient reduction skipped on all but the last micro-batch of a step.

Every `torch.distributed.fsdp` call of the package lives here (the sharded checkpoint's DCP calls
in checkpoint/sharded.py): FSDP stands beside Horovod and DDP (parallel/data_parallel.py) behind
the same small interface (`prepare`-less: the parts shard the model themselves, `accumulate`,
`precision_hooks`, and the whole-job collectives of `TorchCollectives`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch

from hpc_train.launch.identity import RankInfo
from hpc_train.parallel.data_parallel import TorchCollectives, init_torch_distributed

_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def policy_dtypes(param_dtype: str | None,
                  reduce_dtype: str | None) -> tuple[torch.dtype | None, torch.dtype | None]:
    """(parameter, reduction) dtypes of the mixed-precision policy (pure). Unset parameters stay
    fp32 (autocast computes each op in precision.mode's dtype, and BatchNorm's fp32 running
    statistics meet fp32 weights); unset reductions are fp32 (torchtitan's default: half-precision
    sums over many ranks lose bits)."""
    params = _DTYPES[param_dtype] if param_dtype else None
    reduce = _DTYPES[reduce_dtype] if reduce_dtype else (None if params is None else torch.float32)
    return params, reduce


class FsdpBackend(TorchCollectives):
    """torch.distributed with ranks from the MPI launcher (NCCL on GPUs, Gloo on CPUs) and one
    1-D device mesh over all of them: every rank holds 1/N of each sharded unit."""

    name = "fsdp"
    compression = "none"   # gradients go as parallel.fsdp.reduce_dtype says

    def __init__(self, identity: RankInfo, device: torch.device):
        from torch.distributed.device_mesh import init_device_mesh

        init_torch_distributed(identity.rank, identity.size, device)
        super().__init__(device)
        self.rank, self.size, self.local_rank = identity.rank, identity.size, identity.local_rank
        # Over the default process group that init_torch_distributed made (the same as DDP's).
        self.mesh = init_device_mesh(device.type, (identity.size,))

    def shard(self, model: torch.nn.Module, units: Iterable[torch.nn.Module],
              settings) -> torch.nn.Module:
        """`fully_shard` each unit, then the root (which holds what no unit does); `settings`
        is the spec's parallel.fsdp. Returns the model, now an FSDPModule."""
        from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

        params, reduce = policy_dtypes(settings.param_dtype, settings.reduce_dtype)
        options = {"mesh": self.mesh, "reshard_after_forward": settings.reshard_after_forward,
                   "mp_policy": MixedPrecisionPolicy(param_dtype=params, reduce_dtype=reduce)}
        if settings.cpu_offload and self.device.type == "cuda":   # a CPU job's state is there already
            options["offload_policy"] = CPUOffloadPolicy()
        for unit in units:
            fully_shard(unit, **options)
        return fully_shard(model, **options)

    def accumulate(self, model, last_pass: bool):
        """Gradients stay unsharded and local on all but the last backward of a step; the last
        one reduce-scatters their sum."""
        return _gradient_sync(model, last_pass)

    def precision_hooks(self, optimizer) -> dict:
        return {}


@contextlib.contextmanager
def _gradient_sync(model, sync: bool) -> Iterator[None]:
    model.set_requires_gradient_sync(sync)
    try:
        yield
    finally:
        model.set_requires_gradient_sync(True)


def full_parameters(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, the whole tensor) of every parameter; sharded ones (FSDP's DTensors, the parts of
    DeepSpeed ZeRO-3) are gathered (a collective: every rank calls it, in the same order)."""
    for name, param in sorted(model.named_parameters()):
        if hasattr(param, "ds_id"):         # partitioned by ZeRO-3: DeepSpeed gathers it
            from hpc_train.parallel.deepspeed_engine import whole_parameter

            yield name, whole_parameter(param)
        else:
            yield name, param.full_tensor() if hasattr(param, "full_tensor") else param


def local_numel(model: torch.nn.Module) -> int:
    """Elements of the parameters this rank holds (its shards)."""
    return sum((p.to_local() if hasattr(p, "to_local") else p).numel() for p in model.parameters())

"""One rank's side of `bench train`'s allreduce ratio: the gradients of a model (ResNet-50:
25.6M parameters) reduced by Horovod and by torch.distributed / DDP, against one mpi4py
`Allreduce` of the same bytes (raw MPI), all in the same ranks, in alternating rounds.

What each row times, from a barrier to the last rank's result:
- `mpi4py`: one in-place Allreduce (SUM, MPI_IN_PLACE) of all the gradient bytes as one float32
  buffer: the reference, raw MPI at its best (Horovod reduces in place too). `mpi4py two
  buffers` is the same from a separate send buffer, which costs MPI one more copy.
- `horovod gradients`: what hvd.DistributedOptimizer does with a step's gradients: one
  allreduce_async_ (Average) per parameter, then wait for all; Horovod fuses them in its cycle.
- `horovod one tensor`, `torch.distributed one tensor`: one allreduce of one tensor of all bytes.
- `ddp buckets`: DDP's bucketed gradient reduction: backward of a module holding the model's
  parameter shapes (whose own backward is nearly free), minus the same backward under no_sync().
- `horovod gradients fp16`: the gradients with Horovod's fp16 compression (half the bytes on
  the wire; bandwidth still counted on the fp32 bytes, what the step needs reduced).
Algorithm bandwidth = fp32 bytes / seconds (median). On a GPU the torch rows reduce device
memory (NCCL) and mpi4py host memory; the comparison is then between the two paths a job has.
"""

from __future__ import annotations

import contextlib

import numpy as np
import torch

from hpc_train.models import build_model
from hpc_train.parallel.data_parallel import init_torch_distributed
from hpc_train.train.timing import medians, repeat


def gradient_shapes(model_name: str) -> list[torch.Size]:
    return [p.shape for p in build_model(model_name, 1000).parameters()]


class _Holder(torch.nn.Module):
    """Parameters of the given shapes whose forward touches one element of each: backward then
    costs one memset per gradient, and DDP reduces the whole of every gradient."""

    def __init__(self, shapes, device):
        super().__init__()
        self.params = torch.nn.ParameterList(torch.nn.Parameter(torch.zeros(s, device=device))
                                             for s in shapes)

    def forward(self, x):
        return torch.stack([p.view(-1)[0] for p in self.params]).sum() * x


def measure(model_name: str, device: torch.device, repetitions: int, rounds: int) -> dict:
    """Every rank calls this with the same arguments; returns this rank's times per method."""
    from mpi4py import MPI

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    try:
        import horovod.torch as hvd
    except ImportError:      # a DDP-only site: no Horovod rows
        hvd = None
    comm = MPI.COMM_WORLD
    if hvd is not None and hvd.is_initialized():
        hvd.shutdown()
    init_torch_distributed(comm.Get_rank(), comm.Get_size(), device)
    shapes = gradient_shapes(model_name)
    count = sum(int(np.prod(s)) for s in shapes)
    send, receive = np.ones(count, dtype=np.float32), np.empty(count, dtype=np.float32)
    grads = [torch.ones(s, device=device) for s in shapes]
    flat = torch.ones(count, device=device)
    holder = DistributedDataParallel(_Holder(shapes, device),
                                     device_ids=[device.index] if device.type == "cuda" else None)
    one = torch.ones((), device=device)

    def horovod_grads():
        handles = [hvd.allreduce_async_(g, name=f"bench.grad.{i}", op=hvd.Average)
                   for i, g in enumerate(grads)]
        for handle in handles:
            hvd.synchronize(handle)

    def horovod_fp16():
        # allreduce_async_ takes no compression: compress as DistributedOptimizer does.
        pairs = [hvd.Compression.fp16.compress(g) for g in grads]
        handles = [hvd.allreduce_async_(t, name=f"bench.grad16.{i}", op=hvd.Average)
                   for i, (t, _) in enumerate(pairs)]
        for (tensor, ctx), handle, g in zip(pairs, handles, grads):
            g.copy_(hvd.Compression.fp16.decompress(hvd.synchronize(handle), ctx))

    def ddp(sync: bool):
        with contextlib.nullcontext() if sync else holder.no_sync():
            holder(one).backward()

    # Horovod runs only while its rows are timed: its background thread cycles (an MPI
    # collective every cycle), and MPI serialises threads, which would slow the others' rows.
    groups = [(False, {"mpi4py": lambda: comm.Allreduce(MPI.IN_PLACE, receive, op=MPI.SUM),
                       "mpi4py two buffers": lambda: comm.Allreduce(send, receive, op=MPI.SUM)}),
              (False, {"torch.distributed one tensor": lambda: dist.all_reduce(flat),
                       "ddp backward": lambda: ddp(True), "ddp backward no_sync": lambda: ddp(False)})]
    if hvd is not None:
        groups.append((True, {"horovod gradients": horovod_grads, "horovod gradients fp16": horovod_fp16,
                              "horovod one tensor": lambda: hvd.allreduce_(flat, name="bench.flat",
                                                                           op=hvd.Sum)}))
    times: dict[str, list[float]] = {name: [] for _, methods in groups for name in methods}
    for round_ in range(rounds):
        for horovod, methods in groups if round_ % 2 == 0 else reversed(groups):
            if horovod:
                hvd.init()
            for name, run in methods.items():   # the first of each is a warm-up (buffers, connections)
                times[name] += repeat(run, repetitions + 1, device, before=comm.Barrier)[1:]
            if horovod:
                hvd.shutdown()
    median = medians(times)
    median["ddp buckets"] = max(median.pop("ddp backward") - median.pop("ddp backward no_sync"), 1e-9)
    return {"model": model_name, "parameters": count, "bytes": count * 4, "device": str(device),
            "torch_backend": dist.get_backend(), "repetitions": repetitions, "rounds": rounds,
            "seconds": median, "spread": {n: [min(v), max(v)] for n, v in times.items()}}

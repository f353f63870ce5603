"""Replica groups of a K x D pipeline job: averaging a stage's gradients over its copies.

torch.distributed carries the pipeline (point-to-point between neighbouring stages) and the
few whole-job collectives (`data_parallel.TorchCollectives`). Gradients of a stage
are averaged over its replica set with one bucketed all-reduce, through the data-parallel
backend the spec names: Horovod process sets, or a torch.distributed group.

Every rank creates every group, in the same order: `new_group` is collective over the world.
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch._utils import _flatten_dense_tensors, _unflatten_dense_tensors

from hpc_train.parallel.layout import ParallelLayout


class TorchReplicaAverage:
    """Average a stage's gradients over its replica set: flatten, one all_reduce, unflatten."""

    def __init__(self, layout: ParallelLayout, stage: int):
        groups = [dist.new_group(ranks) for ranks in layout.all_replica_sets()]
        self.group, self.size = groups[stage], layout.replicas

    def __call__(self, grads: list[torch.Tensor]) -> None:
        if self.size == 1 or not grads:
            return
        bucket = _flatten_dense_tensors(grads)
        dist.all_reduce(bucket, group=self.group)
        bucket.div_(self.size)
        for grad, reduced in zip(grads, _unflatten_dense_tensors(bucket, grads)):
            grad.copy_(reduced)


class HorovodReplicaAverage:
    """The same through Horovod: one process set per stage, one grouped (fused) all-reduce."""

    def __init__(self, layout: ParallelLayout, stage: int):
        import horovod.torch as hvd

        sets = [hvd.ProcessSet(ranks) for ranks in layout.all_replica_sets()]
        hvd.init(process_sets=sets if layout.replicas > 1 and layout.stages > 1 else None)
        if hvd.size() != layout.world_size:
            raise RuntimeError(f"Horovod sees {hvd.size()} ranks, the job has {layout.world_size}")
        self.hvd, self.size = hvd, layout.replicas
        self.process_set = sets[stage] if layout.stages > 1 else hvd.global_process_set

    def __call__(self, grads: list[torch.Tensor]) -> None:
        if self.size == 1 or not grads:
            return
        reduced = self.hvd.grouped_allreduce(grads, op=self.hvd.Average, process_set=self.process_set)
        for grad, value in zip(grads, reduced):
            grad.copy_(value)

    def shutdown(self) -> None:
        self.hvd.shutdown()


def replica_average(backend: str, layout: ParallelLayout, stage: int):
    if backend == "horovod":
        return HorovodReplicaAverage(layout, stage)
    return TorchReplicaAverage(layout, stage)

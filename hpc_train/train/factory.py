"""A rank's trainer, its parts chosen from the parallel layout (`ParallelLayout.parallelism`).

The only place that maps a kind of job to its parts: a new backend (FSDP, DeepSpeed ZeRO) adds
a `Parallelism` member and its `TrainingParts` here.
"""

from __future__ import annotations

from hpc_train.parallel.layout import Parallelism, ParallelLayout
from hpc_train.train.parts import PartsFactory
from hpc_train.train.pipeline_trainer import PipelineParts
from hpc_train.train.trainer import DataParallelParts, Trainer

PARTS: dict[Parallelism, PartsFactory] = {
    Parallelism.DATA_PARALLEL: DataParallelParts,
    Parallelism.PIPELINE: PipelineParts,
}


def parts_for(layout: ParallelLayout) -> PartsFactory:
    return PARTS[layout.parallelism]


def make_trainer(spec, paths, identity, **options) -> Trainer:
    """The Trainer of `spec`'s layout; options: Trainer's stop, heartbeat, data_root, clock."""
    return Trainer(spec, paths, identity, parts_for(spec.layout), **options)

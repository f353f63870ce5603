"""The parallel layout of a job: world size = pipeline stages K x data-parallel replicas D (pure).

The one owner of these numbers (docs/architecture.md, "One owner per concept"): the spec asks
it for replicas and samples per step on the login node, the submit-time rule asks it whether the
ranks form whole pipelines, and each rank asks it for its coordinates, its data part and the
ranks it talks to. It imports nothing heavy, so the login node can use it without torch.

rank = replica * K + stage: the ranks of one pipeline are consecutive, so with one rank per GPU
a pipeline fills a node's GPUs first and its point-to-point traffic stays on NVLink, while the
replica all-reduce (once per step) crosses nodes. Without a pipeline (K = 1) every rank is a
replica of its own.

The layout also names what runs each rank's step (`Parallelism`): the trainer takes its parts
from it, never from the model's name.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum


class Parallelism(str, Enum):
    """What runs a rank's step: the kind of parts the trainer is given."""

    DATA_PARALLEL = "data_parallel"   # the whole model on every rank, gradients averaged
    PIPELINE = "pipeline"             # a block list cut into stages (one stage or more)
    FSDP = "fsdp"                     # the model sharded over the ranks (torch FSDP2)
    DEEPSPEED = "deepspeed"           # DeepSpeed's ZeRO engine: state sharded over the ranks


class LayoutError(ValueError):
    """The degrees do not multiply to the world size: the rule, the values and the fix."""

    def __init__(self, world_size: int, stages: int):
        self.world_size, self.stages = world_size, stages
        self.rule = "ranks = stages x replicas: the rank count must be a multiple of the stage count"
        self.fitting_world = -(-world_size // stages) * stages if stages >= 1 else None
        fix = (f"use {self.fitting_world} ranks, or a stage count that divides {world_size}"
               if stages >= 1 else "use 1 stage or more")
        super().__init__(f"{world_size} ranks cannot form pipelines of {stages} stages: "
                         f"{self.rule}; {fix}")


@dataclass(frozen=True)
class ParallelLayout:
    world_size: int
    stages: int = 1
    parallelism: Parallelism | None = None   # None: the pipeline with stages > 1, else data parallel

    def __post_init__(self):
        if self.world_size < 1 or self.stages < 1 or self.world_size % self.stages:
            raise LayoutError(self.world_size, self.stages)
        if self.parallelism is None:
            object.__setattr__(self, "parallelism", Parallelism.PIPELINE if self.stages > 1
                               else Parallelism.DATA_PARALLEL)

    @classmethod
    def problem(cls, world_size: int, stages: int) -> LayoutError | None:
        """Why `world_size` ranks cannot be laid out in `stages` stages, or None if they can."""
        try:
            cls(world_size, stages)
        except LayoutError as exc:
            return exc
        return None

    @property
    def replicas(self) -> int:
        """Data-parallel copies of the model, D = world size / K."""
        return self.world_size // self.stages

    def stage_of(self, rank: int) -> int:
        return rank % self.stages

    def replica_of(self, rank: int) -> int:
        return rank // self.stages

    def data_part(self, rank: int) -> tuple[int, int]:
        """(part, parts) of the training data `rank` reads: one part per replica, so all stages of
        a pipeline see the same samples (the first needs the inputs, the last the targets)."""
        return self.replica_of(rank), self.replicas

    def pipeline_ranks(self, replica: int) -> list[int]:
        """The ranks of one pipeline, in stage order."""
        return [replica * self.stages + s for s in range(self.stages)]

    def replica_ranks(self, stage: int) -> list[int]:
        """The ranks holding one stage, one per replica: they average that stage's gradients."""
        return [d * self.stages + stage for d in range(self.replicas)]

    def all_pipelines(self) -> list[list[int]]:
        return [self.pipeline_ranks(d) for d in range(self.replicas)]

    def all_replica_sets(self) -> list[list[int]]:
        return [self.replica_ranks(s) for s in range(self.stages)]

    def of_rank(self, rank: int) -> RankPlace:
        """This rank's coordinates, asked once by a rank."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank {rank} is outside a world of {self.world_size} ranks")
        return RankPlace(self, rank)


@dataclass(frozen=True)
class RankPlace:
    """One rank's place in a layout: its stage, its replica and the data part it reads."""

    layout: ParallelLayout
    rank: int

    @property
    def stage(self) -> int:
        return self.layout.stage_of(self.rank)

    @property
    def replica(self) -> int:
        return self.layout.replica_of(self.rank)

    @property
    def data_part(self) -> tuple[int, int]:
        return self.layout.data_part(self.rank)

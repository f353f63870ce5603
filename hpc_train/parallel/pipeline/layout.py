"""Rank layout of K pipeline stages x D data-parallel replicas (pure).

rank = replica * K + stage: the ranks of one pipeline are consecutive, so with one rank per GPU
a pipeline fills a node's GPUs first and its point-to-point traffic stays on NVLink, while the
replica all-reduce (once per step) crosses nodes.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class PipelineLayout:
    world: int
    stages: int

    def __post_init__(self):
        if self.stages < 1 or self.world % self.stages:
            raise ValueError(f"{self.world} ranks cannot form pipelines of {self.stages} stages: "
                             "the rank count must be a multiple of the stage count")

    @property
    def replicas(self) -> int:
        return self.world // self.stages

    def stage_of(self, rank: int) -> int:
        return rank % self.stages

    def replica_of(self, rank: int) -> int:
        return rank // self.stages

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

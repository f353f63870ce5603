"""Who this rank is, from the launcher's environment (pure; never SLURM_PROCID, see below).

Ranks started by mpirun inside a Slurm job still see the batch step's SLURM_PROCID (0 for all of
them), so only the MPI launcher's own variables are trusted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

# (rank, size, local rank, local size) variable names per launcher.
_LAUNCHERS = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),    # MPICH / Intel MPI (Hydra)
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),          # torchrun
)


@dataclass(frozen=True)
class RankInfo:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def rank_from_env(env: Mapping[str, str]) -> RankInfo:
    for rank, size, local_rank, local_size in _LAUNCHERS:
        if rank in env and size in env:
            return RankInfo(int(env[rank]), int(env[size]), int(env.get(local_rank, 0)),
                            int(env.get(local_size, 1)))
    return RankInfo()

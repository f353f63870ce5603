"""Who this rank is, from its launcher's environment (pure).

One function for every launcher, told apart by the variables each sets:
- Open MPI's mpirun: OMPI_COMM_WORLD_*; MPICH/Intel MPI (Hydra): PMI_RANK/PMI_SIZE;
  torchrun: RANK/WORLD_SIZE;
- srun (direct launch, PMIx or PMI-2): SLURM_PROCID, SLURM_STEP_NUM_TASKS, SLURM_LOCALID, and
  the ranks on this node from SLURM_STEP_TASKS_PER_NODE at SLURM_NODEID.

Slurm's variables are trusted only in a rank that srun started (its own job step): ranks that
mpirun starts inside a batch script inherit the batch step's SLURM_PROCID, 0 in all of them. The
driver says which launcher it used (HPC_TRAIN_LAUNCHER); without that, a numeric SLURM_STEP_ID
with SLURM_STEP_NUM_TASKS marks an srun task.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from hpc_train.launch.allocation import expand_tasks_per_node

# (rank, size, local rank, local size) variable names per MPI-style launcher.
_LAUNCHERS = (
    ("OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK",
     "OMPI_COMM_WORLD_LOCAL_SIZE"),
    ("PMI_RANK", "PMI_SIZE", "MPI_LOCALRANKID", "MPI_LOCALNRANKS"),    # MPICH / Intel MPI (Hydra)
    ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"),          # torchrun
)
LAUNCHER_ENV = "HPC_TRAIN_LAUNCHER"  # set by the driver: mpirun | srun
LAUNCH_ID_ENV = "HPC_TRAIN_LAUNCH_ID"  # set by the driver: one value per start of the ranks


@dataclass(frozen=True)
class RankInfo:
    rank: int = 0
    size: int = 1
    local_rank: int = 0
    local_size: int = 1

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def started_by_srun(env: Mapping[str, str]) -> bool:
    if env.get(LAUNCHER_ENV):
        return env[LAUNCHER_ENV] == "srun"
    return env.get("SLURM_STEP_ID", "").isdigit() and "SLURM_STEP_NUM_TASKS" in env


def _from_srun(env: Mapping[str, str]) -> RankInfo:
    per_node = expand_tasks_per_node(env["SLURM_STEP_TASKS_PER_NODE"])
    return RankInfo(int(env["SLURM_PROCID"]), int(env["SLURM_STEP_NUM_TASKS"]),
                    int(env["SLURM_LOCALID"]), per_node[int(env.get("SLURM_NODEID", 0))])


def rank_from_env(env: Mapping[str, str]) -> RankInfo:
    if started_by_srun(env):
        return _from_srun(env)
    for rank, size, local_rank, local_size in _LAUNCHERS:
        if rank in env and size in env:
            return RankInfo(int(env[rank]), int(env[size]), int(env.get(local_rank, 0)),
                            int(env.get(local_size, 1)))
    return RankInfo()

"""Pure pieces of a rank: identity from the launcher, synthetic samples, run-directory files."""

from __future__ import annotations

import pytest
import torch

from hpc_train.data.sampler import SampleKey
from hpc_train.data.synthetic import SyntheticImages
from hpc_train.rundir import RunPaths, append_jsonl, read_jsonl
from hpc_train.launch.identity import RankInfo, rank_from_env


def test_rank_from_openmpi_ignores_slurm_procid():
    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4",
           "OMPI_COMM_WORLD_LOCAL_RANK": "1", "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "SLURM_PROCID": "0"}
    assert rank_from_env(env) == RankInfo(3, 4, 1, 2)


def test_rank_from_srun_direct_launch():
    # What srun --mpi=pmix gives the 4th task of `srun -N 2 --ntasks-per-node=2` (recorded).
    env = {"SLURM_PROCID": "3", "SLURM_STEP_NUM_TASKS": "4", "SLURM_LOCALID": "1",
           "SLURM_NODEID": "1", "SLURM_STEP_TASKS_PER_NODE": "2(x2)", "SLURM_STEP_ID": "0",
           "PMIX_RANK": "3", "HPC_TRAIN_LAUNCHER": "srun"}
    assert rank_from_env(env) == RankInfo(3, 4, 1, 2)
    uneven = {**env, "SLURM_PROCID": "4", "SLURM_STEP_NUM_TASKS": "5", "SLURM_LOCALID": "0",
              "SLURM_NODEID": "2", "SLURM_STEP_TASKS_PER_NODE": "2(x2),1"}
    assert rank_from_env(uneven) == RankInfo(4, 5, 0, 1)
    # Without the driver's word, a numbered step with its task count still says srun.
    assert rank_from_env({k: v for k, v in env.items() if k != "HPC_TRAIN_LAUNCHER"}) == RankInfo(3, 4, 1, 2)


def test_ranks_mpirun_starts_in_a_batch_step_never_read_slurm_procid():
    batch = {"SLURM_PROCID": "0", "SLURM_NTASKS": "4", "SLURM_LOCALID": "0", "SLURM_NODEID": "0",
             "SLURM_JOB_ID": "7", "HPC_TRAIN_LAUNCHER": "mpirun"}
    ompi = {"OMPI_COMM_WORLD_RANK": "2", "OMPI_COMM_WORLD_SIZE": "4",
            "OMPI_COMM_WORLD_LOCAL_RANK": "0", "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}
    assert rank_from_env({**batch, **ompi}) == RankInfo(2, 4, 0, 2)
    # The batch step's own variables: no numbered step, so not a task of srun.
    assert rank_from_env({k: v for k, v in batch.items() if k != "HPC_TRAIN_LAUNCHER"}) == RankInfo()


def test_rank_from_hydra_and_default():
    assert rank_from_env({"PMI_RANK": "1", "PMI_SIZE": "2", "MPI_LOCALRANKID": "1"}) == RankInfo(1, 2, 1, 1)
    assert rank_from_env({}) == RankInfo(0, 1, 0, 1)


def test_synthetic_samples_are_pure_functions_of_seed_and_index():
    a, b = SyntheticImages(10, 4, 8, seed=1), SyntheticImages(10, 4, 8, seed=1)
    image, label = a[3]
    assert image.shape == (3, 8, 8) and 0 <= label < 4
    assert torch.equal(image, b[3][0]) and label == b[3][1]
    assert not torch.equal(image, a[4][0])
    assert torch.equal(image, a[SampleKey(2, 3)][0])          # no augmentation: epoch-blind
    val = SyntheticImages(10, 4, 8, seed=1, first_index=1000)
    assert torch.equal(val.patterns, a.patterns) and not torch.equal(val[3][0], image)
    with pytest.raises(IndexError):
        a[10]


def test_jsonl_append_and_torn_last_line(tmp_path):
    paths = RunPaths(tmp_path)
    append_jsonl(paths.events, {"event": "a"})
    append_jsonl(paths.events, {"event": "b"})
    with paths.events.open("a") as f:
        f.write('{"event": "tor')                              # a writer killed mid-line
    assert [e["event"] for e in read_jsonl(paths.events)] == ["a", "b"]


def test_new_run_directories_never_collide(tmp_path):
    from datetime import datetime

    now = datetime(2026, 1, 2, 3, 4, 5)
    first, second = RunPaths.new(tmp_path, "r", now), RunPaths.new(tmp_path, "r", now)
    assert first.root.name == "r-20260102-030405" and second.root.name == "r-20260102-030405-2"
    assert first.logs.is_dir() and first.checkpoints.is_dir()

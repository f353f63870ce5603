"""Restarts inside the job, with the real driver, mpirun and Horovod (no Slurm): a rank SIGKILLed
mid-run is started again with the others from the last checkpoint by the same driver, which
records it and finishes; a rank that fails on every start spends launch.restarts_in_job, then
the run fails (no Slurm to requeue it)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from hpc_train import run_state
from tests.conftest import REPO
from tests.runs import (await_beat, describe_failure, drive, events, heartbeat_step, local_run, metrics_after,
                        wait_for)

pytestmark = [pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

# 8 steps an epoch: six epochs, so the kill at step 10 lands well before the last step (with two,
# a fast machine had trained all 16 before the kill, and the restart had nothing left to train).
SMALL = ["data.kind=synthetic", "data.train_samples=512", "data.val_samples=0", "data.image_size=16",
         "data.workers=1", "log.every_steps=1", "checkpoint.every_steps=4", "optim.epochs=6",
         "launch.env.OMP_NUM_THREADS='1'"]


def _driver(paths) -> subprocess.Popen:
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    paths.submitit.mkdir(parents=True, exist_ok=True)
    with open(paths.submitit / "local_0_log.err", "ab") as output:
        return subprocess.Popen([sys.executable, "-m", "hpc_train.job.driver", str(paths.root)],
                                cwd=REPO, env=environ, stdout=output, stderr=subprocess.STDOUT)


# Heavy: CI covers this path under the real Slurm, bit for bit against the uninterrupted run, in
# tests/e2e/test_restart_e2e.py: test_a_rank_killed_twice_restarts_in_the_job_then_is_requeued_and_
# ends_bit_identical (the same driver, mpirun and Horovod; its first kill is this restart: cause,
# attempt, launches, the resume from the last checkpoint, the run state's count) and
# test_a_rank_killed_under_srun_restarts_in_the_job_and_ends_bit_identical (the shipped budget of 2,
# attempt 1 of it, completed with nothing requeued).
@pytest.mark.heavy
def test_a_killed_rank_is_restarted_in_the_job_from_the_last_checkpoint(tmp_path):
    # Rank 1's beat reaches the run directory with its node writer's next write, up to a beat
    # interval (2 s here) after its start: 24 epochs leave steps to train after the kill.
    paths = local_run(tmp_path, *SMALL, "optim.epochs=24", "launch.stall_seconds=20")
    driver = _driver(paths)
    wait_for(lambda: driver.poll() is not None or heartbeat_step(paths, 1) >= 10, 300, "step 10")
    os.kill(await_beat(paths, 1)["pid"], signal.SIGKILL)
    assert driver.wait(timeout=300) == 0, describe_failure(paths)
    [restarted] = events(paths, "restarted")
    assert metrics_after(paths, restarted["time"]), "no step trained after the restart"
    assert (restarted["cause"], restarted["attempt"], restarted["budget"]) == ("failure", 1, 2)
    assert [e["launch"] for e in events(paths, "started")] == [0, 1]
    [resumed] = events(paths, "resumed")
    assert resumed["from_checkpoint"] >= 8 and resumed["time"] > restarted["time"]
    assert events(paths, "finished")[-1]["status"] == "completed" and not events(paths, "requeued")
    assert run_state.read(paths).restarts_in_job == {"failure": 1}
    assert len({e["params_sha256"] for e in events(paths, "rank_finished")}) == 1


def test_a_rank_failing_on_every_start_spends_the_restarts_then_fails(tmp_path):
    paths = local_run(tmp_path, *SMALL, "launch.restarts_in_job=1",
                      "launch.env.HPC_TRAIN_FAULT=raise:1:2")
    assert drive(paths) == 1
    assert [e["launch"] for e in events(paths, "started")] == [0, 1]
    assert len(events(paths, "restarted")) == 1
    finished = events(paths, "finished")[-1]
    assert finished["status"] == "failed" and "launch.restarts_in_job=1 used up" in finished["reason"]

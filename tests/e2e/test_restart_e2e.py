"""A rank SIGKILLed mid-run on the real Slurm, with the shipped smoke job (Horovod):

- one mpirun job whose rank 1 is killed twice: the first kill restarts the ranks inside the job
  (launch.restarts_in_job: 1) from the last checkpoint; the second, once the restarted ranks
  have trained past a later checkpoint, finds that budget spent and goes through a requeue
  (checkpoint.retries_on_failure: 1) from that checkpoint; sacct shows the requeued segment and
  the completed one, and the run ends bit-identical to the uninterrupted one;
- the same in-job restart under srun --mpi=pmix (Slurm starts the ranks; srun ends the step at
  the kill): one segment, nothing requeued, bit-identical too.

The time from each kill to training again is printed (pytest -s) for docs/benchmarks.md. The
three jobs are submitted at once; the single node runs two at a time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from hpc_train import run_state
from tests.runs import (NO_WORKERS, assert_same_training, describe_failure, events, known_beat, logged_step,
                        metrics_after, submit, wait_for)

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
TOTAL_STEPS = 92            # jobs/smoke.yaml: 2 epochs of 46 steps
# Checkpoints at steps 25, 46 (the first epoch's end), 50, 75 and 92. Each kill waits for the
# checkpoint it should resume from and for rank 0 to log a step after it; the next checkpoint is
# 18 steps (the first) and 22 steps (the second) further: the kill lands well before it.
EVERY = ["log.every_steps=1", "checkpoint.every_steps=25", NO_WORKERS]
# (the checkpoint the kill resumes from, the step rank 0 has logged when it comes)
FIRST_KILL, SECOND_KILL = (25, 28), (50, 53)


def _kill_rank_1(paths, checkpoint: int, at_step: int, since: float = 0.0,
                 spared_pid: int | None = None) -> dict:
    """Once the start that runs since `since` has completed the checkpoint of `checkpoint` and
    rank 0 logged `at_step`, SIGKILL rank 1 (as the kernel's OOM killer would); returns its pid,
    when, the resume that followed and when training went on again."""
    wait_for(lambda: [e for e in events(paths, "checkpoint_saved")
                      if e["step"] == checkpoint and e["time"] > since]
             and logged_step(paths, since) >= at_step, 900, f"step {at_step} of {paths.root.name}")
    # This start's rank 1: after a restart the node's beat file may still name the killed one.
    pid = wait_for(lambda: (beat := known_beat(paths, 1)) and beat["pid"] != spared_pid and beat["pid"],
                   120, "rank 1's beat of this start")
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    resumed = wait_for(lambda: [e for e in events(paths, "resumed") if e["time"] > killed], 900,
                       "the resume")[0]
    again = wait_for(lambda: next((m["time"] for m in metrics_after(paths, resumed["time"])), None),
                     900, "a step after the resume")
    return {"pid": pid, "at_step": at_step, "killed": killed, "resumed": resumed,
            "training_again": again}


def _kill_twice(paths) -> list[dict]:
    first = _kill_rank_1(paths, *FIRST_KILL)
    second = _kill_rank_1(paths, *SECOND_KILL, since=first["resumed"]["time"], spared_pid=first["pid"])
    return [first, second]


def _kill_once(paths) -> list[dict]:
    return [_kill_rank_1(paths, *FIRST_KILL)]


# name -> (overrides, what the test does to it)
PLAN = {
    # The in-job restart's budget is one: the second kill is the requeue's (retries_on_failure: 1,
    # as shipped). A requeued job starts its own count of restarts in the job, so both kills
    # come before the requeue.
    "killed-twice": (["launch.restarts_in_job=1", "checkpoint.retries_on_failure=1"], _kill_twice),
    # No other CI test restarts ranks in the job under srun (the multi-node and node-failure ones
    # use mpirun): it stays here, with the shipped budget of restarts in the job.
    "killed-in-job-srun": (["launch.method=srun"], _kill_once),
    "straight": ([], None),
}


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("restart")
    submitted = {}
    with ThreadPoolExecutor(max_workers=len(PLAN)) as actors:
        for name, (overrides, act) in PLAN.items():
            job_id, paths = submit("jobs/smoke.yaml", root, f"run.name={name}", *EVERY, *overrides)
            slurm_cluster.job_ids.append(job_id)
            acted: Future | None = actors.submit(act, paths) if act else None
            submitted[name] = (job_id, paths, acted)
        yield submitted


def _segments(job_id: str) -> list[str]:
    return subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", job_id, "-o", "State"],
                          capture_output=True, text=True, timeout=30).stdout.split()


def _turnaround(name: str, how: str, seen: dict) -> None:
    print(f"[turnaround] {name}: SIGKILL of rank 1 at step {seen['at_step']}, {how}: to training "
          f"again {seen['training_again'] - seen['killed']:.1f} s (resumed event after "
          f"{seen['resumed']['time'] - seen['killed']:.1f} s)")


def _finished(name: str, jobs, slurm_cluster):
    """(job id, paths, what the kills saw) of `name`, ended COMPLETED, with the straight run's paths."""
    job_id, paths, acted = jobs[name]
    seen = acted.result(timeout=2400)
    assert slurm_cluster.wait_state(job_id, ENDED, timeout=900) == "COMPLETED", describe_failure(paths)
    straight_id, straight, _ = jobs["straight"]
    assert slurm_cluster.wait_state(straight_id, ENDED, timeout=900) == "COMPLETED", describe_failure(straight)
    return job_id, paths, seen, straight


def test_a_rank_killed_twice_restarts_in_the_job_then_is_requeued_and_ends_bit_identical(jobs, slurm_cluster):
    job_id, paths, (in_job, requeue), straight = _finished("killed-twice", jobs, slurm_cluster)
    _turnaround("killed-twice", "restart in the job", in_job)
    _turnaround("killed-twice", "requeue (restarts in the job spent)", requeue)
    # Each resume came from the checkpoint before its kill: the in-job restart in the first
    # Slurm run (restart 0), the requeued run (restart 1) from the later one.
    assert [(e["restart"], e["from_checkpoint"]) for e in events(paths, "resumed")] == [
        (0, FIRST_KILL[0]), (1, SECOND_KILL[0])]
    assert in_job["resumed"]["from_checkpoint"] == FIRST_KILL[0]
    assert requeue["resumed"]["from_checkpoint"] == SECOND_KILL[0]
    # The first kill: a restart in the job, attempt 1 of 1.
    restarted = events(paths, "restarted")
    assert [(e["cause"], e["attempt"], e["budget"]) for e in restarted] == [("failure", 1, 1)]
    assert in_job["killed"] < restarted[0]["time"] < requeue["killed"]
    # The second: the restarts spent, a requeue for the failure (Slurm: REQUEUED, then COMPLETED).
    requeued = events(paths, "requeued")
    assert [e["cause"] for e in requeued] == ["failure"], requeued
    assert "launch.restarts_in_job=1 used up" in requeued[0]["reason"], requeued[0]["reason"]
    assert requeued[0]["time"] > requeue["killed"]
    assert _segments(job_id) == ["REQUEUED", "COMPLETED"]
    # Starts of the ranks: (Slurm's restart count, the start in that job).
    assert [(e["restart"], e["launch"]) for e in events(paths, "started")] == [(0, 0), (0, 1), (1, 0)]
    state = run_state.read(paths)
    assert state.restarts_in_job == {"failure": 1}
    assert state.retries == {"failure": 1}          # the requeue spent retries_on_failure's one
    assert_same_training(paths, straight, TOTAL_STEPS)


def test_a_rank_killed_under_srun_restarts_in_the_job_and_ends_bit_identical(jobs, slurm_cluster):
    job_id, paths, (seen,), straight = _finished("killed-in-job-srun", jobs, slurm_cluster)
    _turnaround("killed-in-job-srun", "restart in the job", seen)
    assert seen["resumed"]["from_checkpoint"] == FIRST_KILL[0]
    assert all(e["argv"][0].endswith("srun") for e in events(paths, "started"))
    assert _segments(job_id) == ["COMPLETED"]                           # one segment, no requeue
    # Attempt 1 of the shipped budget (launch.restarts_in_job: 2): nothing requeued.
    assert [(e["cause"], e["attempt"], e["budget"]) for e in events(paths, "restarted")] == [("failure", 1, 2)]
    assert not events(paths, "requeued")
    assert [(e["restart"], e["launch"]) for e in events(paths, "started")] == [(0, 0), (0, 1)]
    assert run_state.read(paths).restarts_in_job == {"failure": 1}
    assert run_state.read(paths).retries == {}                          # retries_on_failure untouched
    assert_same_training(paths, straight, TOTAL_STEPS)

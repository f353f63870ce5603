"""A rank SIGKILLed mid-run on the real Slurm, with the shipped smoke job (mpirun, Horovod):

- by default (launch.restarts_in_job: 2) the driver starts the ranks again inside the same job
  from the last checkpoint: sacct shows one segment, nothing is requeued, and the run ends
  bit-identical to the uninterrupted one;
- the same under srun --mpi=pmix (Slurm starts the ranks; srun ends the step at the kill);
- with launch.restarts_in_job=0 the same kill goes through a requeue (retries_on_failure: 1)
  and ends bit-identical too.

The time from the kill to training again is printed for each (pytest -s) for docs/benchmarks.md.
The four jobs are submitted at once; the single node runs two at a time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor

import pytest

from hpc_train import run_state
from tests.runs import (await_beat, assert_same_training, describe_failure, events, logged_step, metrics_after,
                        submit, wait_for)

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
TOTAL_STEPS = 92            # jobs/smoke.yaml: 2 epochs of 46 steps, a checkpoint at step 50
KILL_AT = 60
WATCH = ["log.every_steps=1"]


def _kill_rank_1(job_id: str, paths) -> dict:
    """Once the checkpoint of step 50 is complete and rank 0 logged step KILL_AT, SIGKILL rank 1
    (as the kernel's OOM killer would); returns when, and when training went on again."""
    wait_for(lambda: [e for e in events(paths, "checkpoint_saved") if e["step"] == 50]
             and logged_step(paths) >= KILL_AT, 600, f"step {KILL_AT} of {paths.root.name}")
    pid = await_beat(paths, 1)["pid"]
    killed = time.time()
    os.kill(pid, signal.SIGKILL)
    resumed = wait_for(lambda: [e for e in events(paths, "resumed") if e["time"] > killed], 600,
                       "the resume")[0]
    again = wait_for(lambda: next((m["time"] for m in metrics_after(paths, resumed["time"])), None),
                     600, "a step after the resume")
    return {"killed": killed, "resumed": resumed, "training_again": again}


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("restart")
    plan = {"killed-in-job": ([*WATCH], _kill_rank_1),
            "killed-in-job-srun": ([*WATCH, "launch.method=srun"], _kill_rank_1),
            "killed-requeued": ([*WATCH, "launch.restarts_in_job=0"], _kill_rank_1),
            "straight": (WATCH, None)}
    submitted = {}
    with ThreadPoolExecutor(max_workers=len(plan)) as actors:
        for name, (overrides, act) in plan.items():
            job_id, paths = submit("jobs/smoke.yaml", root, f"run.name={name}", *overrides)
            slurm_cluster.job_ids.append(job_id)
            acted: Future | None = actors.submit(act, job_id, paths) if act else None
            submitted[name] = (job_id, paths, acted)
        yield submitted


def _segments(job_id: str) -> list[str]:
    return subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", job_id, "-o", "State"],
                          capture_output=True, text=True, timeout=30).stdout.split()


@pytest.mark.parametrize("name, restarts_in_job", [("killed-in-job", 1), ("killed-in-job-srun", 1),
                                                   ("killed-requeued", 0)])
def test_a_killed_rank_resumes_from_its_checkpoint_and_ends_bit_identical(name, restarts_in_job,
                                                                          jobs, slurm_cluster):
    job_id, paths, acted = jobs[name]
    seen = acted.result(timeout=900)
    print(f"[turnaround] {name}: SIGKILL of rank 1 at step {KILL_AT} to training again "
          f"{seen['training_again'] - seen['killed']:.1f} s (resumed event after "
          f"{seen['resumed']['time'] - seen['killed']:.1f} s)")
    assert slurm_cluster.wait_state(job_id, ENDED, timeout=900) == "COMPLETED", describe_failure(paths)
    straight_id, straight, _ = jobs["straight"]
    assert slurm_cluster.wait_state(straight_id, ENDED, timeout=900) == "COMPLETED"
    assert seen["resumed"]["from_checkpoint"] == 50
    restarted, requeued = events(paths, "restarted"), events(paths, "requeued")
    if restarts_in_job:
        assert _segments(job_id) == ["COMPLETED"]                       # one segment, no requeue
        assert [(e["cause"], e["attempt"]) for e in restarted] == [("failure", 1)] and not requeued
        assert [(e["restart"], e["launch"]) for e in events(paths, "started")] == [(0, 0), (0, 1)]
        assert run_state.read(paths).restarts_in_job == {"failure": 1}
        assert run_state.read(paths).retries == {}                      # retries_on_failure untouched
    else:
        assert _segments(job_id) == ["REQUEUED", "COMPLETED"]
        assert not restarted and [e["cause"] for e in requeued] == ["failure"]
        assert run_state.read(paths).retries == {"failure": 1}
    assert_same_training(paths, straight, TOTAL_STEPS)

"""On the real Slurm, with every event write of the job failing (driver and ranks): a rank that
raises on every run ends the job FAILED after exactly checkpoint.retries_on_failure retries,
since the driver decides from the run state, never from the event log."""

from __future__ import annotations

import subprocess

import pytest

from hpc_train import run_state
from hpc_train.runtime.faults import EVENTS_FAULT_ENV
from tests.runs import NO_WORKERS, describe_failure, events, submit

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def test_without_any_event_a_job_failing_every_run_is_retried_once(slurm_cluster, tmp_path):
    # Rank 1 raises at step 3 of every run: no checkpoint is due before it (every_steps: 50).
    job_id, paths = submit("jobs/smoke.yaml", tmp_path, "run.name=no-events", NO_WORKERS,
                           "checkpoint.retries_on_failure=1", "launch.restarts_in_job=0",
                           "launch.env.HPC_TRAIN_FAULT=raise:1:3",
                           f"launch.env.{EVENTS_FAULT_ENV}=1", f"slurm.setup=[export {EVENTS_FAULT_ENV}=1]")
    slurm_cluster.job_ids.append(job_id)
    assert slurm_cluster.wait_state(job_id, ENDED, timeout=600) == "FAILED", describe_failure(paths)
    # Two runs: the first, requeued once, and its retry, which failed for good.
    runs = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", job_id, "-o", "State"],
                          capture_output=True, text=True, timeout=20).stdout.split()
    assert runs == ["REQUEUED", "FAILED"], runs
    assert run_state.read(paths).retries == {"failure": 1}
    assert [e["event"] for e in events(paths)] == ["submitted"]        # the login node's only
    driver_log = "\n".join(p.read_text() for p in sorted(paths.submitit.glob(f"{job_id}_*")))
    assert "retries_on_failure=1 used up" in driver_log and "could not record event" in driver_log

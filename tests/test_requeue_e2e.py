"""Requeue on the real Slurm: time limits (signal and deadline), external requeue, SIGTERM.

All jobs are submitted at once by a module fixture; the single node runs two at a time.
"""

from __future__ import annotations

import subprocess
import time

import pytest

from hpc_train.rundir import RunPaths
from tests.runs import assert_trained, cli, describe_failure, events, submit

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
# A one-minute limit; USR2 25 s before it (Slurm checks limits about every 30 s).
SHORT = ["slurm.time=00:01:00", "slurm.signal_seconds=25", "optim.epochs=3", "log.every_steps=4"]
LONG = ["optim.epochs=2", "log.every_steps=4", "checkpoint.every_steps=10"]


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if value := predicate():
            return value
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("requeue")
    submitted = {}
    # The jobs that a test interrupts go first: they must still be running when it acts.
    for name, overrides in {"external": LONG, "sigterm": LONG, "timelimit": SHORT}.items():
        job_id, paths = submit("jobs/smoke.yaml", root, f"run.name={name}", *overrides)
        slurm_cluster.job_ids.append(job_id)
        submitted[name] = (job_id, paths)
    # The deadline case: a rendered script with the signal line taken out.
    script = root / "nosignal.sbatch"
    out = cli("render", "jobs/smoke.yaml", "-o", str(script), "--set", f"run.root={root}",
              "--set", "run.name=nosignal", *[a for o in SHORT for a in ("--set", o)])
    assert out.returncode == 0, out.stderr
    script.write_text("\n".join(line for line in script.read_text().splitlines()
                                if not line.startswith("#SBATCH --signal")) + "\n")
    job_id = slurm_cluster.sbatch(str(script))
    submitted["nosignal"] = (job_id, RunPaths(next(root.glob("nosignal-*"))))
    return submitted


def _requeue_history(job_id: str) -> list[str]:
    out = subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", job_id, "-o", "State"],
                         capture_output=True, text=True, timeout=30).stdout.split()
    return out


def _assert_resumed_where_stopped(paths: RunPaths):
    stops, resumes = events(paths, "stop_saved"), events(paths, "resumed")
    assert [e["step"] for e in resumes][:len(stops)] == [e["step"] for e in stops]
    restarts = [e["restart"] for e in events(paths, "started")]
    assert restarts == list(range(len(restarts)))                  # SLURM_RESTART_COUNT 0, 1, ...
    assert len({e["job_id"] for e in events(paths, "started")}) == 1  # one job id throughout


def _interrupt_both(jobs) -> int:
    """`scontrol requeue` the "external" job and SIGTERM the "sigterm" job, each once it has a
    checkpoint; both act while their jobs run. Returns the external job's last periodic
    checkpoint before the requeue."""
    (external_id, external), (sigterm_id, sigterm) = jobs["external"], jobs["sigterm"]
    last_periodic, terminated = None, False
    deadline = time.monotonic() + 600
    while (last_periodic is None or not terminated) and time.monotonic() < deadline:
        if last_periodic is None and events(external, "checkpoint_saved"):
            subprocess.run(["scontrol", "requeue", external_id], check=True, timeout=30)
            last_periodic = max(e["step"] for e in events(external, "checkpoint_saved"))
        if not terminated and events(sigterm, "checkpoint_saved"):
            # --full: the batch shell (the driver) and every process of the job, as a preemption.
            subprocess.run(["scancel", "--full", "--signal=TERM", sigterm_id], check=True, timeout=30)
            terminated = True
        time.sleep(0.5)
    assert last_periodic is not None and terminated, "the jobs did not start in time"
    return last_periodic


def test_external_requeue_and_sigterm_lose_at_most_the_periodic_interval(jobs, slurm_cluster):
    last_periodic = _interrupt_both(jobs)
    for name in ("external", "sigterm"):
        job_id, paths = jobs[name]
        state = slurm_cluster.wait_state(job_id, ENDED, timeout=900)
        assert state == "COMPLETED", describe_failure(paths)
        assert "REQUEUED" in _requeue_history(job_id)
        assert_trained(paths)
    _, external = jobs["external"]
    assert events(external, "resumed")[0]["from_checkpoint"] >= last_periodic
    _, sigterm = jobs["sigterm"]
    # Slurm's TERM reaches every process, mpirun too, and Open MPI aborts on it: the ranks may
    # not get to save. The driver requeues all the same, and the run resumes from the latest
    # complete checkpoint, periodic or the stop's own.
    requeued = events(sigterm, "requeued")[0]
    assert requeued["by_driver"] is True and requeued["reason"].startswith("SIGTERM")
    saved_before = [e["step"] for e in events(sigterm, "checkpoint_saved") if e["time"] < requeued["time"]]
    assert events(sigterm, "resumed")[0]["from_checkpoint"] == max(saved_before)


@pytest.mark.parametrize("name, reasons", [("timelimit", {"SIGUSR2", "deadline"}), ("nosignal", {"deadline"})])
def test_time_limit_stops_saves_requeues_and_finishes(name, reasons, jobs, slurm_cluster):
    job_id, paths = jobs[name]
    state = slurm_cluster.wait_state(job_id, ENDED, timeout=900)
    assert state == "COMPLETED", describe_failure(paths)
    requeued = events(paths, "requeued")
    assert requeued and {e["reason"] for e in requeued} <= reasons, requeued
    assert "REQUEUED" in _requeue_history(job_id)
    _assert_resumed_where_stopped(paths)
    assert_trained(paths)

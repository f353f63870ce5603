"""Requeue on the real Slurm at the time limit: by the signal and by the ranks' own deadline.

External requeue, SIGTERM to the whole job and USR2 to the batch shell are in
test_lifecycle_e2e.py (the shipped smoke job stopped three ways, bit-identical at the end).
All jobs are submitted at once by a module fixture; the single node runs two at a time.
"""

from __future__ import annotations

import subprocess

import pytest

from hpc_train.rundir import RunPaths
from tests.runs import assert_trained, cli, describe_failure, events, submit

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
# A one-minute limit; USR2 25 s before it (Slurm checks limits about every 30 s). Six epochs
# take longer than the 35 s to the ranks' own deadline even on an idle machine (three took 23 s).
# Slurm may signal up to 30 s early, so a start can train for as little as 7 s: on a loaded CI
# machine the job needed more than the default 10 requeues (it went FAILED at step 232 of 276
# after 11 starts), so the budget here is far above what any machine needs. That budget is
# tested on its own (tests/job/test_stop_requeue.py); this test is about stopping and resuming.
SHORT = ["slurm.time=00:01:00", "slurm.signal_seconds=25", "optim.epochs=6", "log.every_steps=4",
         "checkpoint.max_requeues=40"]


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("requeue")
    submitted = {}
    job_id, paths = submit("jobs/smoke.yaml", root, "run.name=timelimit", *SHORT)
    slurm_cluster.job_ids.append(job_id)
    submitted["timelimit"] = (job_id, paths)
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


def _after_every_rank_finished(paths: RunPaths, requeued: dict) -> bool:
    """A signal that came while the ranks were exiting after the last step: it reached mpirun
    as it finalised and ended it (cause interrupted, "exit -12"), the driver requeued, and the
    next start found nothing left to train. A race of the time limit's signal with the end."""
    restart = requeued["restart"]
    ranks = [e["ranks"] for e in events(paths, "started") if e["restart"] == restart]
    finished = {e["rank"] for e in events(paths, "rank_finished") if e["restart"] == restart}
    return requeued["cause"] == "interrupted" and len(finished) == ranks[-1]


def _while_starting(paths: RunPaths, requeued: dict) -> bool:
    """A signal that came before the ranks began training (Slurm sends --signal up to a minute
    early: here, seconds into a start on a loaded machine): too late for them to obey within
    the grace, so they were torn down and the job requeued as interrupted, resuming from the
    checkpoint before it."""
    stalls = [e for e in events(paths, "ranks_stalled") if e["restart"] == requeued["restart"]]
    return (requeued["cause"] == "interrupted" and bool(stalls)
            and stalls[-1]["standing"] == "starting")


def _assert_resumed_where_stopped(paths: RunPaths):
    """Each start resumes from the last checkpoint saved before it (a start ended while it was
    still starting resumed from that one too), and each stop's save is resumed from."""
    saved, resumes = events(paths, "checkpoint_saved"), events(paths, "resumed")
    for resume in resumes:
        before = [e["step"] for e in saved if e["restart"] < resume["restart"]]
        assert before and resume["step"] == before[-1], (resume, before)
    assert {e["step"] for e in events(paths, "stop_saved")} <= {e["step"] for e in resumes}
    restarts = [e["restart"] for e in events(paths, "started")]
    assert restarts == list(range(len(restarts)))                  # SLURM_RESTART_COUNT 0, 1, ...
    assert len({e["job_id"] for e in events(paths, "started")}) == 1  # one job id throughout


@pytest.mark.parametrize("name, reasons", [("timelimit", {"SIGUSR2", "deadline"}), ("nosignal", {"deadline"})])
def test_time_limit_stops_saves_requeues_and_finishes(name, reasons, jobs, slurm_cluster):
    job_id, paths = jobs[name]
    state = slurm_cluster.wait_state(job_id, ENDED, timeout=1500)
    assert state == "COMPLETED", describe_failure(paths)
    requeued = events(paths, "requeued")
    stops = [e for e in requeued
             if not _after_every_rank_finished(paths, e) and not _while_starting(paths, e)]
    # A stop that was saved but whose exit outlasted the grace says so after its reason.
    assert stops and {e["reason"].split(" (the ranks were ended")[0] for e in stops} <= reasons, requeued
    assert {(e["cause"], e["by"]) for e in stops} == {("stop", "driver")}, requeued
    assert "REQUEUED" in _requeue_history(job_id)
    _assert_resumed_where_stopped(paths)
    assert_trained(paths)

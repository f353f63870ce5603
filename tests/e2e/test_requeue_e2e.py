"""Requeue on the real Slurm at the time limit: by the signal and by the ranks' own deadline.
The deadline case runs a script written by `render` with plain sbatch (its signal line taken
out), so it also shows that a rendered script runs as it is.

External requeue, SIGTERM to the whole job and USR2 to the batch shell are in
test_lifecycle_e2e.py (the shipped smoke job stopped three ways, bit-identical at the end).
All jobs are submitted at once by a module fixture; the single node runs two at a time.
"""

from __future__ import annotations

import subprocess

import pytest

from hpc_train.rundir import RunPaths
from tests.runs import NO_WORKERS, assert_trained, cli, describe_failure, events, submit

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
# Slurm sends --signal up to 60 s early (its checks' resolution), and a start takes 6-25 s
# before its first step. Each job's length is set by the test-only pace (a fixed sleep in every
# step), not by the CPU, to more than the most any one start can train: it stops on every
# machine, the fastest included, in 2-4 starts.
# - timelimit: a two-minute limit, USR2 25 s before it: the signal comes 95 s after the job's
#   start at the latest; two epochs (92 steps) at 1.1 s, at least 101 s in all. (At 0.7 s an
#   idle machine trained them in 80 s and finished before the signal.)
# - nosignal: a one-minute limit and no signal: the ranks stop at their own deadline, 35 s into a
#   start (signal_seconds 25, which leaves the ranks 25 s to exit and the driver to requeue: a
#   loaded machine took 15 s to end the ranks' processes after their save, and the driver ends
#   them itself once the job's end is near: supervise.REQUEUE_SECONDS), after at most about 27 s
#   of training; one epoch at 0.8 s, at least 37 s.
# (Six unpaced epochs under a one-minute limit took 2-4 starts on an idle machine, 11 on a loaded
# one.) The requeue budget is far above any machine's need: the budget has tests of its own
# (tests/job/test_stop_requeue.py); this one is about stopping and resuming.
COMMON = ["log.every_steps=4", "checkpoint.max_requeues=40", NO_WORKERS]
TIMELIMIT = ["slurm.time=00:02:00", "slurm.signal_seconds=25", "optim.epochs=2",
             "launch.env.HPC_TRAIN_FAULT=pace:1.1", *COMMON]
NOSIGNAL = ["slurm.time=00:01:00", "slurm.signal_seconds=25", "optim.epochs=1",
            "launch.env.HPC_TRAIN_FAULT=pace:0.8", *COMMON]


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("requeue")
    submitted = {}
    job_id, paths = submit("jobs/smoke.yaml", root, "run.name=timelimit", *TIMELIMIT)
    slurm_cluster.job_ids.append(job_id)
    submitted["timelimit"] = (job_id, paths)
    # The deadline case: a rendered script with the signal line taken out.
    script = root / "nosignal.sbatch"
    out = cli("render", "jobs/smoke.yaml", "-o", str(script), "--set", f"run.root={root}",
              "--set", "run.name=nosignal", *[a for o in NOSIGNAL for a in ("--set", o)])
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
    if name == "nosignal":          # plain sbatch kept the script's own output file
        assert (paths.root / f"slurm-{job_id}.out").is_file()

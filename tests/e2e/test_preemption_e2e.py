"""A real preemption with a grace, heard at the grace's start, under every launcher.

The multi-node cluster is configured as many sites are (env/slurm/start.sh: partition priority
tiers, PreemptMode=REQUEUE, GraceTime=30 on the default partition `debug`; jobs of partition
`urgent` preempt its jobs). Slurm signals the preempted job's *steps* at the grace's start and
the batch step only at its end. Each job below runs one epoch of jobs/smoke.yaml paced to at
least 0.25 s a step, so that a run that heard nothing until the grace's end would train 120 steps
more, past its end (46 steps). At step 12 an `urgent` job asks for one of its nodes, whole:

- mpirun on one node: the driver's sentinel step hears SIGTERM and passes the agreed stop on;
- srun on one node, and srun across two nodes: the ranks, a step, hear it themselves;
- mpirun across two nodes: Open MPI's daemon on the second node is a step as well; the grace's
  SIGTERM reaches it first and it passes it to its rank, then dies: the ranks save a stop or are
  ended before they can (seen both ways here). Either way the job is requeued as preempted,
  resumes from its last checkpoint and ends as the uninterrupted run, and no node is called lost.

Each saves its stop within a few steps of the urgent job's submission (steps, from the events),
is requeued by its driver (Slurm ends a job whose batch script exits during the grace without a
requeue), counts the stop as a preemption, and ends COMPLETED with the weights of an
uninterrupted run of the same layout; the urgent job starts before the grace would have ended
(sacct's start time against its submission).
"""

from __future__ import annotations

import json
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass

import pytest

from hpc_train.rundir import RunPaths
from hpc_train.spec import load_spec
from tests.runs import NO_WORKERS, ONE_EPOCH, SMOKE_EPOCH_STEPS, cli, describe_failure, events, logged_step, submit, wait_for

pytestmark = [pytest.mark.multinode, pytest.mark.slurm, pytest.mark.mpi, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
SMOKE = "jobs/smoke.yaml"
# One epoch of jobs/smoke.yaml (46 steps): the stop comes by step 32, the rest is the resume's.
# (Two epochs before: 46 more steps in each of the six jobs, which no assertion needed.)
TOTAL_STEPS = SMOKE_EPOCH_STEPS
PREEMPT_AT = 12
# The ranks agree on a stop every 5 steps; the signal reaches them within a second or two (a few
# 0.25 s steps). A grace heard at its end would come 120 steps later, after the run's end.
HEARD_WITHIN_STEPS = 20
PACED = ["launch.env.HPC_TRAIN_FAULT=pace:0.25", "log.every_steps=1"]
# Each job holds its nodes whole (sbatch --exclusive): an urgent job then preempts the one job
# whose node it asked for. Two of the two-node jobs (one CPU on each of two 2-CPU nodes) shared a
# node in CI18, and one urgent job preempted both: each was preempted twice.
WHOLE_NODES = "slurm.extra={exclusive: ''}"
ONE_NODE = ["slurm.nodes=1", "slurm.tasks_per_node=2", ONE_EPOCH, NO_WORKERS, WHOLE_NODES]
TWO_NODES = ["slurm.nodes=2", "slurm.tasks_per_node=1", ONE_EPOCH, NO_WORKERS, WHOLE_NODES]
PLAN = {
    "straight-one-node": [*ONE_NODE, "log.every_steps=1"],
    "straight-two-nodes": [*TWO_NODES, "log.every_steps=1"],
    "mpirun": [*ONE_NODE, "launch.method=mpirun", *PACED],
    "srun": [*ONE_NODE, "launch.method=srun", *PACED],
    "srun-two-nodes": [*TWO_NODES, "launch.method=srun", *PACED],
    "mpirun-two-nodes": [*TWO_NODES, "launch.method=mpirun", *PACED],
}
TWIN = {"mpirun": "straight-one-node", "srun": "straight-one-node", "srun-two-nodes": "straight-two-nodes"}
# Open MPI's daemons on the other nodes are a step too: the grace's SIGTERM ends them, and may end
# their ranks before the stop is saved (docs/running.md: srun across nodes on such partitions).
INTERRUPTED = {"mpirun-two-nodes": "straight-two-nodes"}


@dataclass
class Job:
    job_id: str
    paths: RunPaths
    preempted: Future | None = None     # what the preemptor saw and did
    state: str = ""                     # Slurm's last word on the job


def _partition(cluster, name: str) -> dict[str, str]:
    out = subprocess.run(["scontrol", "show", "partition", name, "-o"], capture_output=True,
                         text=True, timeout=20, env=cluster.env)
    return dict(word.split("=", 1) for word in out.stdout.split() if "=" in word)


def _nodes_of(cluster, job_id: str) -> list[str]:
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%N"], capture_output=True, text=True,
                         timeout=20, env=cluster.env).stdout.strip()
    expanded = subprocess.run(["scontrol", "show", "hostnames", out], capture_output=True, text=True,
                              timeout=20, env=cluster.env).stdout.split()
    return expanded


def _preempt(cluster, job_id: str, paths: RunPaths) -> dict:
    """At step PREEMPT_AT, an urgent job asks for the first node of ours, whole."""
    wait_for(lambda: logged_step(paths) >= PREEMPT_AT, 900, f"step {PREEMPT_AT} of {paths.root.name}")
    step = logged_step(paths)
    node = _nodes_of(cluster, job_id)[0]
    submitted = time.time()
    urgent = cluster.sbatch("--partition=urgent", f"--nodelist={node}", "--exclusive", "--time=2",
                            "--mem=100M", "--job-name=urgent", "--output=/dev/null", "--wrap", "sleep 15")
    return {"step": step, "submitted": submitted, "urgent": urgent, "node": node}


@pytest.fixture(scope="module")
def jobs(slurm_nodes, tmp_path_factory):
    urgent = _partition(slurm_nodes, "urgent")
    if not urgent:
        # Not skipped: CI's cluster has it; a cluster started before the option existed does not.
        pytest.fail("the multi-node Slurm has no `urgent` partition: restart it with "
                    "`bash env/slurm/stop.sh --nodes 8 && bash env/slurm/start.sh --nodes 8` "
                    "(preemption is on unless --no-preemption)")
    root = tmp_path_factory.mktemp("preemption")
    submitted: dict[str, Job] = {}
    with ThreadPoolExecutor(max_workers=len(TWIN) + len(INTERRUPTED)) as preemptors:
        for name, overrides in PLAN.items():
            job_id, paths = submit(SMOKE, root, f"run.name={name}", *overrides, env=slurm_nodes.env)
            slurm_nodes.job_ids.append(job_id)
            job = Job(job_id, paths)
            if name in TWIN or name in INTERRUPTED:
                job.preempted = preemptors.submit(_preempt, slurm_nodes, job_id, paths)
            submitted[name] = job
        for job in submitted.values():
            job.state = slurm_nodes.wait_state(job.job_id, ENDED, timeout=1500)
    return submitted


def _sacct_start(cluster, job_id: str) -> float:
    out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "Start"], capture_output=True,
                         text=True, timeout=20, env=cluster.env).stdout.split()
    return time.mktime(time.strptime(out[-1], "%Y-%m-%dT%H:%M:%S"))


@pytest.mark.parametrize("name", list(TWIN))
def test_a_preempted_run_saves_at_the_graces_start_and_ends_as_an_uninterrupted_one(name, jobs, slurm_nodes):
    job, twin = jobs[name], jobs[TWIN[name]]
    seen = job.preempted.result(timeout=60)
    assert job.state == "COMPLETED", describe_failure(job.paths)
    assert twin.state == "COMPLETED", describe_failure(twin.paths)

    # Heard at the grace's start: the stop was saved within a few steps of the urgent job.
    saved, *later = events(job.paths, "stop_saved")
    assert seen["step"] <= saved["step"] <= seen["step"] + HEARD_WITHIN_STEPS, (seen, saved)
    grace = float(_partition(slurm_nodes, "debug")["GraceTime"])
    _only_grace_clamped_stops(job.paths, later, grace)
    if name == "mpirun":                                 # the sentinel step heard it for the driver
        [asked] = events(job.paths, "stop_requested")
        assert (asked["reason"], asked["source"]) == ("preempted", "preemption sentinel step")
    else:                                                # srun's ranks, a step, heard it themselves
        assert saved["reason"] == "SIGTERM" and not events(job.paths, "stop_requested")
    requeued = events(job.paths, "requeued")
    assert [(e["stop"], e["by"]) for e in requeued] == [("preempted", "driver")] + [("time_limit", "driver")] * len(later)
    assert [e["from_checkpoint"] for e in events(job.paths, "resumed")] == [saved["step"]] + [e["step"] for e in later]

    # Counted apart from time limits, in status and the run state.
    stops = {"preempted": 1, **({"time_limit": len(later)} if later else {})}
    status = json.loads(cli("status", str(job.paths.root), "--json", env=slurm_nodes.env).stdout)["runs"][0]
    assert status["stops"] == stops
    assert json.loads(job.paths.run_state.read_text())["stops"] == stops

    # The same training as the uninterrupted run of the same layout.
    finished = {e["params_sha256"] for e in events(job.paths, "rank_finished")}
    assert finished == {e["params_sha256"] for e in events(twin.paths, "rank_finished")}
    assert {e["step"] for e in events(job.paths, "rank_finished")} == {TOTAL_STEPS}

    # The preempting job did not wait for the grace to end (Slurm's own record of its start).
    urgent_start = _sacct_start(slurm_nodes, seen["urgent"])
    assert urgent_start < seen["submitted"] + grace, (urgent_start - seen["submitted"], grace)
    assert urgent_start >= int(saved["time"]) - 1          # it started once ours had saved


def _only_grace_clamped_stops(paths: RunPaths, later: list[dict], grace: float) -> None:
    """Stops after the preemption's are time-limit stops at an end Slurm gave as the grace only.
    The requeued job may start while Slurm still counts it as preempted, and then ends it
    GraceTime after that start (its end time, SLURM_JOB_END_TIME, is the preemption's clamp; seen
    in CI14, srun across two nodes): the driver saves a stop before that end, as at any time
    limit, and requeues once more. Any other second stop is a fault of ours."""
    starts = events(paths, "started")
    for stop in later:
        assert stop["reason"] == "deadline", stop
        start = max((e for e in starts if e["time"] <= stop["time"]), key=lambda e: e["time"])
        end = start["deadline"] + float(load_spec(paths.spec).slurm.signal_seconds)
        assert end - start["time"] <= grace + 5, (start, stop)       # the clamp, not the limit


@pytest.mark.parametrize("name", list(INTERRUPTED))
def test_mpirun_across_nodes_is_stopped_or_interrupted_by_the_grace_and_loses_no_node(name, jobs):
    job, twin = jobs[name], jobs[INTERRUPTED[name]]
    job.preempted.result(timeout=60)
    assert job.state == "COMPLETED", describe_failure(job.paths)
    [asked] = events(job.paths, "stop_requested")
    assert (asked["reason"], asked["source"]) == ("preempted", "preemption sentinel step")
    [requeued] = events(job.paths, "requeued")
    assert (requeued["stop"], requeued["by"]) == ("preempted", "driver"), requeued
    # Saved (the daemon passed the SIGTERM on first) or interrupted (it died first): both resume.
    saved = events(job.paths, "stop_saved")
    assert requeued["cause"] == ("stop" if saved else "interrupted"), (requeued, saved)
    assert not events(job.paths, "node_lost"), "a daemon ended by the grace's signal is no lost node"
    assert "excluded" not in requeued["detail"]
    finished = {e["params_sha256"] for e in events(job.paths, "rank_finished")}
    assert finished == {e["params_sha256"] for e in events(twin.paths, "rank_finished")}

"""The driver's retry budget comes from the run state: with every event write failing, a job that
fails on every run is restarted in the job launch.restarts_in_job times, then retried exactly
checkpoint.retries_on_failure times, then FAILED."""

from __future__ import annotations

import pytest

from hpc_train import run_state, scheduler
from hpc_train.job import driver
from hpc_train.job.node_fault import NodeFault
from hpc_train.rundir import RunPaths, read_jsonl
from hpc_train.runtime.faults import EVENTS_FAULT_ENV
from hpc_train.spec import CheckpointSpec, JobSpec, LaunchSpec, RunSpec


@pytest.fixture
def requeues(monkeypatch):
    """Slurm stood in for: the job still runs, and every `scontrol requeue` it is asked succeeds."""
    asked = []
    monkeypatch.setattr(scheduler, "show_job", lambda job: None)
    monkeypatch.setattr(scheduler, "requeue", lambda job, restart: asked.append(restart) or ("driver", "ok"))
    return asked


def _run_fails(paths: RunPaths, restart: int, launch: int = 0, in_job: int = 0) -> driver.Decision:
    environ = {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": str(restart)}
    spec = JobSpec(RunSpec("x"), launch=LaunchSpec(restarts_in_job=in_job),
                   checkpoint=CheckpointSpec(retries_on_failure=1))
    return driver.conclude(paths, spec, environ, 0.0, driver.Launch(launch, None, None),
                           driver.Ended(1, 2.0))


def test_with_every_event_write_failing_one_retry_then_failed(tmp_path, monkeypatch, requeues):
    monkeypatch.setenv(EVENTS_FAULT_ENV, "1")
    paths = RunPaths(tmp_path)
    first, second = _run_fails(paths, 0), _run_fails(paths, 1)
    assert (first.action, second.action) == ("requeue", "failed")
    assert "retries_on_failure=1 used up" in second.reason
    assert requeues == [0]                          # exactly one scontrol requeue
    assert run_state.read(paths).retries == {"failure": 1}
    assert not paths.events.exists()                # nothing of it was recorded


def test_restarts_in_the_job_come_first_and_are_counted_apart(tmp_path, monkeypatch, requeues):
    monkeypatch.setenv(EVENTS_FAULT_ENV, "1")
    paths = RunPaths(tmp_path)
    actions = [_run_fails(paths, 0, launch, in_job=2).action for launch in range(3)]
    assert actions == ["restart", "restart", "requeue"] and requeues == [0]
    assert _run_fails(paths, 1, 0, in_job=2).action == "restart"     # a new job, new restarts
    state = run_state.read(paths)
    assert (state.restarts_in_job, state.retries) == ({"failure": 3}, {"failure": 1})


@pytest.fixture
def full_disk(monkeypatch):
    """The run state cannot be written."""
    def unwritable(paths, change):
        raise OSError(28, "No space left on device")
    monkeypatch.setattr(run_state, "update", unwritable)


def test_a_restart_that_cannot_be_counted_is_taken(tmp_path, full_disk, requeues):
    assert _run_fails(RunPaths(tmp_path), 0, in_job=1).action == "restart"   # bounded by the driver


def test_a_dead_node_is_requeued_excluded_on_its_own_budget(tmp_path, monkeypatch, requeues):
    excluded = []
    monkeypatch.setattr(scheduler, "exclude_nodes", lambda job, nodes: excluded.append((job, nodes)))
    paths = RunPaths(tmp_path)
    spec = JobSpec(RunSpec("x"), checkpoint=CheckpointSpec(retries_on_failure=1,
                                                           retries_on_node_failure=1))
    dead = driver.Ended(205, 2.0, node_fault=NodeFault(("hpcn2",), "mpirun lost its daemon on hpcn2"))
    decisions = [driver.conclude(paths, spec, {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": str(k)},
                                 0.0, driver.Launch(0, None, None), dead) for k in (0, 1)]
    assert [d.action for d in decisions] == ["requeue", "failed"]
    assert "retries_on_node_failure=1 used up" in decisions[1].reason
    assert excluded == [("5", ["hpcn2"])] and requeues == [0]
    assert run_state.read(paths).retries == {"node_failure": 1}
    assert run_state.read(paths).failed_runs() == 0                  # the code's budget untouched
    [requeued] = [e for e in read_jsonl(paths.events) if e["event"] == "requeued"]
    assert requeued["cause"] == "node_failure" and requeued["detail"].endswith("excluded hpcn2 (ExcNodeList)")


def test_a_dead_node_is_replaced_by_a_spare_in_the_job_then_the_job_requeued_without_both(
        tmp_path, monkeypatch, requeues):
    excluded = []
    monkeypatch.setattr(scheduler, "exclude_nodes", lambda job, nodes: excluded.append(nodes))
    paths = RunPaths(tmp_path)
    spec = JobSpec(RunSpec("x"), checkpoint=CheckpointSpec(retries_on_node_failure=1))
    environ = {"SLURM_JOB_ID": "5", "SLURM_RESTART_COUNT": "0"}
    hosts = ("n1", "n2", "n3")                   # slurm.nodes 1 (default), two spares

    def node_dies(node: str, launch: int, lost=frozenset()):
        dead = driver.Ended(205, 2.0, node_fault=NodeFault((node,), f"mpirun lost its daemon on {node}"))
        return driver.conclude(paths, spec, environ, 0.0, driver.Launch(launch, None, None, hosts, lost), dead)

    assert node_dies("n2", 0).action == "restart"
    assert node_dies("n3", 1, frozenset({"n2"})).action == "restart"
    assert node_dies("n1", 2, frozenset({"n2", "n3"})).action == "requeue"     # none left
    assert excluded == [["n1", "n2", "n3"]] and requeues == [0]
    state = run_state.read(paths)
    assert (state.restarts_in_job, state.retries) == ({"node_failure": 2}, {"node_failure": 1})


def test_a_retry_that_cannot_be_counted_is_not_taken(tmp_path, full_disk, requeues):
    decision = _run_fails(RunPaths(tmp_path), 0)
    assert decision.action == "failed" and "could not be counted" in decision.reason
    assert requeues == []

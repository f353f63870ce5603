"""Sweep members and the best one; Slurm's answers about a workflow's jobs, merged."""

from __future__ import annotations

from hpc_train import scheduler
from hpc_train.scheduler.parse import parse_sacct, parse_squeue
from hpc_train.workflow import queue, sweep
from hpc_train.workflow.schema import SweepSpec


def test_members_are_every_grid_point_combined_with_every_set():
    grid = SweepSpec(grid={"optim.base_lr": [0.1, 0.2], "data.batch_size": [16, 32]})
    assert sweep.members(grid) == [
        {"optim.base_lr": 0.1, "data.batch_size": 16}, {"optim.base_lr": 0.1, "data.batch_size": 32},
        {"optim.base_lr": 0.2, "data.batch_size": 16}, {"optim.base_lr": 0.2, "data.batch_size": 32}]
    both = SweepSpec(grid={"run.seed": [1, 2]}, sets=[{"optim.name": "sgd"}, {"optim.name": "adamw"}])
    assert [m["optim.name"] for m in sweep.members(both)] == ["sgd", "sgd", "adamw", "adamw"]
    assert sweep.members(SweepSpec()) == [{}]


def test_overrides_read_back_as_the_values_given():
    from hpc_train.spec.yaml_io import parse_yaml

    values = {"optim.base_lr": 1e-05, "data.path": "/a b/c", "slurm.setup": ["x"], "log.x": None}
    for item in sweep.as_overrides(values):
        key, _, text = item.partition("=")
        read = parse_yaml(text)
        assert read == values[key] or float(read) == values[key]


def test_metric_and_best_member():
    lines = [{"step": 10, "loss": 2.0}, {"split": "val", "step": 20, "accuracy": 0.5, "loss": 1.0},
             {"step": 30, "loss": 1.5}, {"split": "val", "step": 40, "accuracy": 0.7, "loss": 0.9}]
    assert sweep.metric_value(lines, "val.accuracy") == 0.7
    assert sweep.metric_value(lines, "train.loss") == 1.5
    assert sweep.metric_value(lines, "val.top5") is None
    assert sweep.mode_of("val.accuracy", None) == "max" and sweep.mode_of("val.loss", None) == "min"
    assert sweep.mode_of("val.loss", "max") == "max"
    values = {0: 0.8, 1: 0.9, 2: None, 3: 0.9}
    assert sweep.ranking(values, "max") == [1, 3, 0, 2]          # a tie: the lower index first
    assert sweep.best(values, "max") == 1
    assert sweep.best({0: 0.3, 1: 0.1}, "min") == 1
    assert sweep.best({0: None}, "max") is None


SQUEUE = """128_2|PENDING|JobArrayTaskLimit|0:00|N/A|1|
129|PENDING|Dependency|0:00|N/A|1|
128_0|RUNNING|None|1:02|2026-12-01T16:15:47|1|vm
"""
SACCT = """127|COMPLETED|None|5|0:0|1|vm
128_[2-3%2]|PENDING|JobArrayTaskLimit|0|0:0|1|None assigned
128_0|RUNNING|None|61|0:0|1|vm
128_1|FAILED|None|20|1:0|1|vm
130|CANCELLED by 0|Dependency|0|0:0|1|None assigned
"""


def answering(monkeypatch, sacct: str | None, squeue: str | None) -> None:
    """The client's two queries answer with these rows (None: that command failed)."""
    monkeypatch.setattr(scheduler, "accounted", lambda ids, timeout: sacct and parse_sacct(sacct))
    monkeypatch.setattr(scheduler, "queue", lambda ids, timeout: squeue and parse_squeue(squeue))


def test_squeue_and_sacct_rows_array_tasks_included(monkeypatch):
    answering(monkeypatch, SACCT, SQUEUE)
    rows = queue.query(["127", "128", "129", "130"])
    assert (rows["128_0"].state, rows["128_0"].elapsed, rows["128_0"].source) == ("RUNNING", 62.0, "squeue")
    assert rows["128_1"].state == "FAILED" and rows["128_1"].exit_code == "1:0"
    assert "128_[2-3%2]" not in rows and rows["128_2"].reason == "JobArrayTaskLimit"
    assert [r.job_id for r in queue.rows_of(rows, "128")] == ["128_0", "128_1", "128_2", "128_3"]
    assert rows["128_3"].state == "PENDING"          # not started: sacct's one row stands for it
    assert queue.rows_of(rows, "128_1") == [rows["128_1"]]
    assert queue.rows_of(rows, "127") == [rows["127"]] and queue.rows_of(rows, "999") == []
    assert rows["130"].state == "CANCELLED" and rows["129"].reason == "Dependency"


def test_either_command_may_be_missing(monkeypatch):
    answering(monkeypatch, None, SQUEUE)
    assert set(queue.query(["128", "129"])) == {"128_2", "129", "128_0"}
    answering(monkeypatch, None, None)
    assert queue.query(["128"]) is None
    assert queue.query([]) == {}


def test_an_array_cancelled_before_any_task_started_is_cancelled_task_by_task(monkeypatch):
    # What sacct shows once `workflow cancel` ended a pending array; squeue no longer lists it.
    answering(monkeypatch, "42_[0-1]|CANCELLED by 0|None|0|0:0|0|None assigned\n"
                           "43|CANCELLED by 0|None|0|0:0|0|None assigned\n", "")
    rows = queue.query(["42", "43"])
    assert [(r.job_id, r.state) for r in queue.rows_of(rows, "42")] == [("42_0", "CANCELLED"),
                                                                       ("42_1", "CANCELLED")]


def test_one_state_for_a_stage():
    assert queue.combine(["COMPLETED", "COMPLETED"]) == "COMPLETED"
    assert queue.combine(["COMPLETED", "RUNNING", "PENDING"]) == "RUNNING"
    assert queue.combine(["COMPLETED", "PENDING"]) == "PENDING"
    assert queue.combine(["FAILED", "RUNNING"]) == "FAILED"
    assert queue.combine(["CANCELLED", "COMPLETED"]) == "CANCELLED"
    assert queue.combine([]) == "UNKNOWN"

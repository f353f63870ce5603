"""Experiment trackers (log.trackers): one tracker run per run directory, continued across
restarts with each step logged once, read back with the trackers' own readers."""

from __future__ import annotations

import os

import pytest

from hpc_train.rundir import RunPaths
from hpc_train.runtime import tracker_state
from hpc_train.runtime.tracker_state import Tracker, TrackerRun, should_log, wandb_run_id
from hpc_train.spec.schema import LogSpec
from tests.conftest import require
from tests.runs import drive, events, local_run
from tests.trackers import mlflow_run, mlflow_steps, wandb_records, wandb_steps


def test_a_resumed_segment_logs_only_steps_past_the_last_logged_one_per_split():
    run = TrackerRun("abc", {"train": 15, "val": 10})
    assert [s for s in range(11, 18) if should_log(run, "train", s)] == [16, 17]
    assert should_log(run, "val", 15) and not should_log(run, "val", 10)
    assert should_log(TrackerRun("abc"), "train", 0)      # nothing logged yet
    assert run.with_logged("train", 12).last_step("train") == 15   # never goes back


def test_the_wandb_id_is_fixed_by_the_run_directory(tmp_path):
    assert wandb_run_id(tmp_path / "a") == wandb_run_id(tmp_path / "x" / ".." / "a")
    assert wandb_run_id(tmp_path / "a") != wandb_run_id(tmp_path / "b")
    assert wandb_run_id(tmp_path / "a").isalnum() and len(wandb_run_id(tmp_path / "a")) == 16


def test_the_tracker_state_round_trips_and_a_damaged_file_reads_as_none(tmp_path):
    paths = RunPaths(tmp_path)
    runs = {Tracker.MLFLOW: TrackerRun("r1", {"train": 40, "val": 40})}
    tracker_state.write(paths, runs)
    assert tracker_state.read(paths) == runs
    paths.trackers.write_bytes(b'{"mlflow": {"run_id": "r1", "logged": {"train": \xff')
    assert tracker_state.read(paths) == {}


def test_log_tensorboard_is_the_default_of_log_trackers():
    assert LogSpec().chosen_trackers == (Tracker.TENSORBOARD,)
    assert LogSpec(tensorboard=False).chosen_trackers == ()
    assert LogSpec(tensorboard=False, trackers=["mlflow", "wandb", "mlflow"]).chosen_trackers \
        == (Tracker.MLFLOW, Tracker.WANDB)


# Heavy: CI covers the path on the real Slurm, a requeue and a kill beside (tests/e2e/
# test_lifecycle_e2e.py: test_a_tracked_run_requeued_then_killed_and_resumed_logs_each_step_once).
@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.heavy
def test_a_restarted_run_continues_its_tracker_runs_with_each_step_once(tmp_path):
    require("wandb")
    require("mlflow")
    # Rank 0 fails after step 15 of a run that checkpoints every 10 steps: the next run resumes
    # from step 10 and trains steps 11-15 again, which the trackers had logged.
    paths = local_run(tmp_path, "optim.epochs=1", "log.every_steps=1", "checkpoint.every_steps=10",
                      "launch.restarts_in_job=0", "log.trackers=[wandb, mlflow]")
    assert drive(paths, env={**os.environ, "HPC_TRAIN_FAULT": "raise:0:15"}) == 1
    assert drive(paths) == 0
    assert events(paths, "resumed")[0]["from_checkpoint"] == 10
    total = events(paths, "rank_finished")[0]["step"]
    steps = list(range(1, total + 1))
    assert mlflow_steps(paths, "train/loss") == steps
    assert mlflow_steps(paths, "val/accuracy") == [total]
    records = wandb_records(paths)
    assert len(list(paths.wandb.glob("offline-run-*"))) == 2
    assert {r["run"]["run_id"] for r in records if r["type"] == "run"} == {wandb_run_id(paths.root)}
    assert wandb_steps(records, "train/loss") == steps
    assert wandb_steps(records, "val/accuracy") == [total]
    run = mlflow_run(paths)
    assert run.data.params["log.every_steps"] == "1"
    assert run.data.tags["final_checkpoint"].endswith(f"step-{total:08d}")


def test_status_shows_the_wandb_sync_command_of_an_offline_run(tmp_path):
    from hpc_train.inspection.trackers import tracker_views

    paths = RunPaths(tmp_path / "run")
    log = {"trackers": ["wandb", "mlflow"], "wandb": {"mode": "offline"}, "mlflow": {}}
    wandb, mlflow = tracker_views(log, paths, {Tracker.MLFLOW: TrackerRun("m1")})
    assert wandb.command == f"wandb sync --id {wandb_run_id(paths.root)} {paths.root}/wandb/offline-run-*"
    assert mlflow.run_id == "m1" and f"file:{paths.root}/mlruns" in mlflow.command
    online = tracker_views({**log, "wandb": {"mode": "online"}}, paths, {})[0]
    assert online.command is None


def test_a_store_that_lost_records_gets_them_replayed_up_to_the_resume_point():
    from hpc_train.train.trackers.tracker_set import replay_records

    records = [{"step": s, "loss": float(s)} for s in range(1, 31)]
    records.insert(20, {"step": 20, "split": "val", "accuracy": 0.5})
    records += [{"step": s, "loss": -float(s)} for s in range(21, 26)]      # trained again after a resume
    # The store held train steps to 12 and no val; this segment starts at step 26.
    run = TrackerRun("w1", {"train": 12})
    replayed = replay_records(records, run, first_step=26)
    assert [(r.get("split", "train"), r["step"]) for r in replayed] == \
        [*[("train", s) for s in range(13, 20)], ("train", 20), ("val", 20),
         *[("train", s) for s in range(21, 26)]]
    assert [r["loss"] for r in replayed if r["step"] in (21, 25) and "loss" in r] == [-21.0, -25.0]
    assert replay_records(records, TrackerRun("w1", {"train": 30, "val": 20}), 26) == []


def test_the_wandb_reader_takes_the_last_step_of_each_split_and_skips_what_it_cannot_parse():
    from hpc_train.train.trackers.protocol import last_steps
    from hpc_train.train.trackers.wandb_tracker import history_steps

    lines = ['{"num":1,"type":"header","header":{}}',
             '{"type":"history","history":{"item":{"_step":4,"train/loss":0.3},"step":{"num":4}}}',
             '{"type":"history","history":{"item":{"val/accuracy":0.8},"step":{"num":4}}}',
             '{"type":"history","history":{"item":{"train/loss":0.2,"train/lr":0.1},"step":{"num":5}}}',
             '{"type":"history","history":{"item":{"train/loss"', "\xff not json"]
    steps = history_steps(lines)
    assert steps == {"train/loss": 5, "train/lr": 5, "val/accuracy": 4}
    assert last_steps(steps) == {"train": 5, "val": 4}

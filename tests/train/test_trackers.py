"""Experiment trackers (log.trackers): one tracker run per run directory, continued across
restarts with each step logged once, read back with the trackers' own readers."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from hpc_train.rundir import RunPaths
from hpc_train.runtime import tracker_state
from hpc_train.runtime.tracker_state import Tracker, TrackerRun, should_log, wandb_run_id
from hpc_train.spec.schema import LogSpec
from tests.runs import drive, events, local_run


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


def _mlflow_steps(paths, key: str) -> list[int]:
    from mlflow.tracking import MlflowClient

    run_id = json.loads(paths.trackers.read_text())["mlflow"]["run_id"]
    client = MlflowClient(f"file:{paths.mlruns}")
    return [m.step for m in sorted(client.get_metric_history(run_id, key),
                                   key=lambda m: m.timestamp)]


def _wandb_records(paths) -> list[dict]:
    """Every record of every segment's offline run, in order, read by wandb's own reader."""
    records = []
    for path in sorted(paths.wandb.glob("offline-run-*/run-*.wandb")):
        out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
                             capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        records += [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return records


def _wandb_steps(records, key: str) -> list[int]:
    return [r["history"]["step"]["num"] for r in records
            if r["type"] == "history" and key in r["history"]["item"]]


@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.slow
def test_a_restarted_run_continues_its_tracker_runs_with_each_step_once(tmp_path):
    pytest.importorskip("wandb")
    pytest.importorskip("mlflow")
    # Rank 0 fails after step 15 of a run that checkpoints every 10 steps: the next run resumes
    # from step 10 and trains steps 11-15 again, which the trackers had logged.
    paths = local_run(tmp_path, "optim.epochs=1", "log.every_steps=1", "checkpoint.every_steps=10",
                      "launch.restarts_in_job=0", "log.trackers=[wandb, mlflow]")
    env = {**os.environ, "MLFLOW_ALLOW_FILE_STORE": "true"}
    assert drive(paths, env={**env, "HPC_TRAIN_FAULT": "raise:0:15"}, timeout=240) == 1
    assert drive(paths, env=env, timeout=240) == 0
    assert events(paths, "resumed")[0]["from_checkpoint"] == 10
    total = events(paths, "rank_finished")[0]["step"]
    steps = list(range(1, total + 1))
    assert _mlflow_steps(paths, "train/loss") == steps
    assert _mlflow_steps(paths, "val/accuracy") == [total]
    records = _wandb_records(paths)
    assert len(list(paths.wandb.glob("offline-run-*"))) == 2
    assert {r["run"]["run_id"] for r in records if r["type"] == "run"} == {wandb_run_id(paths.root)}
    assert _wandb_steps(records, "train/loss") == steps
    assert _wandb_steps(records, "val/accuracy") == [total]
    from mlflow.tracking import MlflowClient

    run = MlflowClient(f"file:{paths.mlruns}").get_run(
        json.loads(paths.trackers.read_text())["mlflow"]["run_id"])
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

"""The trackers' records of a run, read back with the trackers' own readers: MLflow's client on
the run directory's file store, and W&B's `wandb leet inspect` on its offline run files."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from unittest import mock

from hpc_train.rundir import RunPaths


def mlflow_client(paths: RunPaths):
    """A client of the run's file store, which MLflow 3 opens only when told to (the ranks tell
    themselves: mlflow_tracker.open_mlflow; a test process does not inherit that)."""
    from mlflow.tracking import MlflowClient

    with mock.patch.dict(os.environ, {"MLFLOW_ALLOW_FILE_STORE": "true"}):
        return MlflowClient(f"file:{paths.mlruns}")


def mlflow_run(paths: RunPaths):
    """The run directory's MLflow run (its id from trackers.json)."""
    return mlflow_client(paths).get_run(json.loads(paths.trackers.read_text())["mlflow"]["run_id"])


def mlflow_steps(paths: RunPaths, key: str) -> list[int]:
    """The steps of every value of `key`, in the order they were logged (a step logged twice
    shows twice)."""
    run_id = json.loads(paths.trackers.read_text())["mlflow"]["run_id"]
    return [m.step for m in sorted(mlflow_client(paths).get_metric_history(run_id, key),
                                   key=lambda m: m.timestamp)]


def wandb_records(paths: RunPaths) -> list[dict]:
    """Every record of every segment's offline run, in order, read by wandb's own reader."""
    records = []
    for path in sorted(paths.wandb.glob("offline-run-*/run-*.wandb")):
        out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
                             capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
        records += [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    return records


def wandb_steps(records: list[dict], key: str) -> list[int]:
    return [r["history"]["step"]["num"] for r in records
            if r["type"] == "history" and key in r["history"]["item"]]

"""The metrics as an MLflow run: a file store under the run directory, or log.mlflow.tracking_uri.

The run is made at the first start and its id kept in trackers.json, so every segment logs to
it. MLflow keeps every value of a repeated step, so steps already logged are not logged again.
A file store (file:RUN/mlruns, the default: no server, and no SQLite database on a shared file
system) needs MLFLOW_ALLOW_FILE_STORE=true with MLflow 3; this module sets it for its own
process, and readers set it likewise (docs/run-directory.md).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path

from hpc_train.runtime.tracker_state import TrackerRun
from hpc_train.train.trackers.protocol import Opened, Param, TrackerContext, last_steps

log = logging.getLogger("hpc_train.trackers")

PARAMS_PER_BATCH = 100          # MLflow's limit of parameters in one log_batch
PARAM_VALUE_CHARS = 500         # the shortest value limit of MLflow's stores


def tracking_uri(spec, run_dir_mlruns: Path) -> str:
    """log.mlflow.tracking_uri, or the run directory's file store."""
    return spec.log.mlflow.tracking_uri or f"file:{run_dir_mlruns}"


class MlflowTracker:
    rewrites_steps = False

    def __init__(self, client, run_id: str):
        self.client, self.run_id = client, run_id

    def log_params(self, params: Mapping[str, Param]) -> None:
        from mlflow.entities import Param as MlflowParam

        items = [MlflowParam(key, str(value)[:PARAM_VALUE_CHARS]) for key, value in params.items()]
        for start in range(0, len(items), PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[start:start + PARAMS_PER_BATCH])

    def log_metrics(self, step: int, metrics: Mapping[str, float], walltime: float | None) -> None:
        from mlflow.entities import Metric

        stamp = int((walltime or time.time()) * 1000)
        self.client.log_batch(self.run_id, metrics=[Metric(key, value, stamp, step)
                                                    for key, value in metrics.items()])

    def log_final_checkpoint(self, path: Path) -> None:
        self.client.set_tag(self.run_id, "final_checkpoint", str(path))
        self.client.set_terminated(self.run_id, "FINISHED")

    def close(self) -> None:
        """Nothing to flush: every call above is written when it returns."""


def stored_steps(client, run_id: str) -> dict[str, int]:
    """The last step of each split that the store holds for the run (a tracking server that
    lost a killed segment's last calls holds fewer than trackers.json says)."""
    keys = client.get_run(run_id).data.metrics
    return last_steps({key: max((m.step for m in client.get_metric_history(run_id, key)), default=-1)
                       for key in keys})


def _experiment_id(client, name: str) -> str:
    """The experiment's id, made if new (another run making it at the same time is fine)."""
    found = client.get_experiment_by_name(name)
    if found is not None:
        return found.experiment_id
    try:
        return client.create_experiment(name)
    except Exception:           # made meanwhile by another run: MlflowException
        return client.get_experiment_by_name(name).experiment_id


def open_mlflow(context: TrackerContext) -> Opened | None:
    """This run directory's MLflow run, made at the first start, or None (said) without the
    package."""
    try:
        from mlflow.tracking import MlflowClient
    except ImportError as exc:
        log.warning("log.trackers mlflow: %s; no MLflow run for this run", exc)
        return None
    spec, paths = context.spec, context.paths
    uri = tracking_uri(spec, paths.mlruns)
    if uri.startswith("file:"):
        os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
    client = MlflowClient(uri)
    if context.stored is not None:
        run_id = context.stored.run_id
        client.update_run(run_id, status="RUNNING")
        try:
            held = stored_steps(client, run_id)
        except Exception as exc:     # noqa: BLE001 -- MLflow's stores raise anything
            log.warning("log.trackers mlflow: run %s's steps not read back (%s); trusting "
                        "trackers.json", run_id, exc)
            held = None
        return Opened(MlflowTracker(client, run_id), context.stored, is_new=False, held=held)
    experiment = _experiment_id(client, spec.log.mlflow.experiment or spec.run.name)
    run = client.create_run(experiment, run_name=paths.root.name,
                            tags={"hpc_train.run_dir": str(paths.root)})
    return Opened(MlflowTracker(client, run.info.run_id), TrackerRun(run.info.run_id), is_new=True)

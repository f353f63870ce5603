"""A run's experiment trackers as `status` and `submit` show them: run id and the command to see them.

W&B offline (the default) needs its files uploaded from a machine with internet: the command is
`wandb sync --id <id> RUN/wandb/offline-run-*`, which uploads every segment's files in order of
start time into the one run. MLflow's file store is opened with `mlflow ui`. Pure but for the
read of trackers.json (runtime/tracker_state.py).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from shlex import quote

from hpc_train.rundir import RunPaths
from hpc_train.runtime import tracker_state
from hpc_train.runtime.tracker_state import Tracker, TrackerRun, wandb_run_id
from hpc_train.spec.schema import LogSpec


@dataclass(frozen=True)
class TrackerView:
    tracker: str
    run_id: str | None        # the tracker's run (TensorBoard: none; MLflow: once started)
    command: str | None       # what to run to see it, quoted for the shell; None: nothing to run
    what: str                 # the command's purpose, or where the run already is


def chosen_trackers(log: Mapping) -> tuple[Tracker, ...]:
    """The trackers of a saved spec's log section (older runs: from log.tensorboard)."""
    try:
        return LogSpec(tensorboard=bool(log.get("tensorboard", True)),
                       trackers=log.get("trackers")).chosen_trackers
    except (ValueError, TypeError):          # a hand-edited spec.yaml: show none
        return ()


def tracker_views(log: Mapping, paths: RunPaths,
                  kept: dict[Tracker, TrackerRun]) -> list[TrackerView]:
    """The chosen trackers of a run, in log.trackers' order (pure)."""
    run = quote(str(paths.root))
    views = []
    for tracker in chosen_trackers(log):
        stored = kept.get(tracker)
        if tracker is Tracker.TENSORBOARD:
            views.append(TrackerView(tracker.value, None, f"tensorboard --logdir {run}/tensorboard",
                                     "loss, accuracy, LR"))
        elif tracker is Tracker.WANDB:
            run_id = stored.run_id if stored else wandb_run_id(paths.root)
            online = (log.get("wandb") or {}).get("mode") == "online"
            views.append(TrackerView(
                tracker.value, run_id,
                None if online else f"wandb sync --id {run_id} {run}/wandb/offline-run-*",
                "online: logged to the W&B server as the run goes" if online else
                "upload the offline runs of every segment, from a machine with internet"))
        else:
            uri = (log.get("mlflow") or {}).get("tracking_uri")
            views.append(TrackerView(
                tracker.value, stored.run_id if stored else None,
                None if uri else f"MLFLOW_ALLOW_FILE_STORE=true mlflow ui --backend-store-uri "
                                 f"file:{run}/mlruns",
                f"logged to {uri}" if uri else "the run's MLflow file store"))
    return views


def read_views(paths: RunPaths, spec: Mapping | None) -> list[TrackerView]:
    """The run's trackers, from its saved spec and trackers.json."""
    log = (spec or {}).get("log")
    return tracker_views(log if isinstance(log, Mapping) else {}, paths, tracker_state.read(paths))


def follow_lines(views: list[TrackerView]) -> list[str]:
    """One indented line per tracker command, with what it is for."""
    return [f"  {view.command}   # {view.what}" for view in views if view.command]

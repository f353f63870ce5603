"""What the experiment trackers of a run keep across requeues: their run ids and logged steps.

One run directory is one tracker run. `trackers.json` in the run directory holds, per tracker,
the id of its run (made at the first start: W&B's is derived from the run directory, MLflow's is
the one its store gave) and the last step it logged per split ("train", "val"). Rank 0 rewrites
it whole (write_atomic) after each record it logged, so every requeue and resume goes on with the
same tracker run.

Resume semantics: a resumed segment re-trains the steps after its checkpoint, which the
previous segment may have logged already. W&B refuses a step lower than its run's current one
and MLflow keeps both values of a repeated step, so those trackers log a record only when its
step is past the tracker's last logged step of that split (`should_log`); with exact resume the
skipped values are the ones already logged. Each step is then logged once, in order. (TensorBoard
rewrites the steps instead: its readers drop the old points, purge_step; train/trackers.)
"""

from __future__ import annotations

import hashlib
import json
import logging
from dataclasses import dataclass, field, replace
from enum import Enum
from pathlib import Path

from hpc_train.rundir import RunPaths, parse_json, write_atomic

log = logging.getLogger(__name__)

NOTHING_LOGGED = -1     # the last step of a split that a tracker has not logged yet


class Tracker(str, Enum):
    """An experiment tracker that rank 0 can write the metrics to (log.trackers)."""
    TENSORBOARD = "tensorboard"
    WANDB = "wandb"
    MLFLOW = "mlflow"

    def __str__(self) -> str:
        return self.value


# The package each tracker imports where it logs (the optional extras of pyproject.toml).
TRACKER_PACKAGE = {Tracker.TENSORBOARD: "tensorboard", Tracker.WANDB: "wandb",
                   Tracker.MLFLOW: "mlflow"}


@dataclass(frozen=True)
class TrackerRun:
    """One tracker's run of this run directory: its id and the last step logged per split."""
    run_id: str
    logged: dict[str, int] = field(default_factory=dict)

    def last_step(self, split: str) -> int:
        return self.logged.get(split, NOTHING_LOGGED)

    def with_logged(self, split: str, step: int) -> TrackerRun:
        return replace(self, logged={**self.logged, split: max(step, self.last_step(split))})


def should_log(run: TrackerRun, split: str, step: int) -> bool:
    """Whether a tracker that cannot take a step twice logs this record: only steps past its
    last logged step of the split, so a resumed segment skips what the previous one logged."""
    return step > run.last_step(split)


def wandb_run_id(run_dir: Path) -> str:
    """A W&B run id fixed by the run directory: 16 hex digits of its absolute path's sha256
    (W&B ids are letters and digits; the directory name's timestamp keeps them apart)."""
    return hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def parse(data) -> dict[Tracker, TrackerRun]:
    """trackers.json's JSON -> {tracker: run}; entries that are not such a run are left out."""
    runs = {}
    for name, entry in (data.items() if isinstance(data, dict) else ()):
        if name not in {t.value for t in Tracker} or not isinstance(entry, dict) \
                or not isinstance(entry.get("run_id"), str):
            continue
        logged = entry.get("logged") if isinstance(entry.get("logged"), dict) else {}
        runs[Tracker(name)] = TrackerRun(entry["run_id"], {
            split: step for split, step in logged.items()
            if isinstance(step, int) and not isinstance(step, bool)})
    return runs


def read(paths: RunPaths) -> dict[Tracker, TrackerRun]:
    """The run's tracker runs; a missing file is none yet, a damaged one is said and read as
    none (its trackers then start new runs: better than no curves)."""
    try:
        return parse(parse_json(paths.trackers.read_bytes().decode(errors="replace")))
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        log.warning("the tracker state %s is damaged (%s): trackers start new runs",
                    paths.trackers, exc)
        return {}


def write(paths: RunPaths, runs: dict[Tracker, TrackerRun]) -> None:
    """Write the tracker runs whole (rank 0); raises OSError when it cannot."""
    data = {tracker.value: {"run_id": run.run_id, "logged": run.logged}
            for tracker, run in runs.items()}
    write_atomic(paths.trackers, (json.dumps(data, indent=1, sort_keys=True) + "\n").encode())

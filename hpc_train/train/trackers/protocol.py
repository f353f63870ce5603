"""The seam between the trainer and an experiment tracker, and the records' shape for trackers.

Every tracker takes the same calls: the spec as parameters once per tracker run, the metrics of
a step, the final checkpoint's path, close. `Opened` says what a tracker's opening found: its
run (the id and logged steps kept in trackers.json) and whether that run is new.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from hpc_train.rundir import RunPaths
from hpc_train.runtime.tracker_state import TrackerRun

Param = float | str | bool

# metrics.jsonl fields that are not curves.
_NOT_SCALARS = ("time", "step", "epoch", "split")


class MetricsTracker(Protocol):
    """One experiment tracker's run, written by rank 0."""

    # True: a step logged again replaces the old point (TensorBoard's purge_step), so a resumed
    # segment logs every step it trains; False: each step may be logged once (W&B refuses lower
    # steps, MLflow keeps both values), so steps already logged are skipped (tracker_state).
    rewrites_steps: bool

    def log_params(self, params: Mapping[str, Param]) -> None: ...

    def log_metrics(self, step: int, metrics: Mapping[str, float], walltime: float | None) -> None: ...

    def log_final_checkpoint(self, path: Path) -> None: ...

    def close(self) -> None: ...


@dataclass(frozen=True)
class TrackerContext:
    """What a tracker is opened with: the run's spec and directory, where this segment starts,
    and the tracker's run kept from an earlier segment (None at its first start)."""
    spec: object
    paths: RunPaths
    first_step: int
    spec_text: str
    stored: TrackerRun | None


@dataclass
class Opened:
    """A tracker opened for this segment. run: its id and logged steps, kept in trackers.json
    (None for a tracker that keeps no state: TensorBoard). is_new: a new tracker run, which
    gets the spec as parameters. held: the last step of each split that the tracker's own store
    holds, read back at the open (None: it cannot tell, and trackers.json is trusted). A killed
    segment's trackers may have lost records they had taken (W&B buffers its offline file for
    up to 15 s), so what the store holds, not what was sent, says where to go on."""
    tracker: MetricsTracker
    run: TrackerRun | None
    is_new: bool
    held: dict[str, int] | None = None


def scalar_tags(record: Mapping) -> dict[str, float]:
    """A metrics.jsonl record -> {"train/loss": ..., "val/accuracy": ...} (pure)."""
    prefix = split_of(record)
    return {f"{prefix}/{name}": float(value) for name, value in record.items()
            if name not in _NOT_SCALARS and isinstance(value, (int, float))
            and not isinstance(value, bool)}


def split_of_key(key: str) -> str:
    """The split of a tracker's key: "val/accuracy" -> "val" (scalar_tags' inverse)."""
    return key.split("/", 1)[0]


def last_steps(steps_by_key: Mapping[str, int]) -> dict[str, int]:
    """{key: its last step} -> {split: its last step} (pure)."""
    last: dict[str, int] = {}
    for key, step in steps_by_key.items():
        split = split_of_key(key)
        last[split] = max(step, last.get(split, step))
    return last


def split_of(record: Mapping) -> str:
    """The curve family of a metrics.jsonl record: "train", or its split ("val")."""
    return record.get("split") or "train"


def flat_params(spec: Mapping, prefix: str = "") -> dict[str, Param]:
    """The spec's settings as flat parameters: {"optim.base_lr": 0.4, "optim.step_milestones":
    "[30, 60]", ...}; lists as their JSON text, nulls left out (pure)."""
    flat: dict[str, Param] = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_params(value, f"{name}."))
        elif isinstance(value, list):
            flat[name] = json.dumps(value)
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
    return flat

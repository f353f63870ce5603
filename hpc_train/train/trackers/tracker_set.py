"""Rank 0's chosen trackers as one: opened per segment, each record to each, best effort.

A tracker that fails (a missing package, a full disk, a server that does not answer) is said
once in rank 0's log and dropped for the rest of the segment: it costs its curves, never the
training. After each record, the trackers' logged steps are written to trackers.json, so the
next segment logs each step once (runtime/tracker_state.py).

A tracker that can read back what its store holds (Opened.held) is believed over trackers.json:
the steps a killed segment sent but the store lost, up to where this segment starts, are
replayed from metrics.jsonl (`replay_records`), and the segment goes on from there.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Mapping
from dataclasses import replace
from pathlib import Path

from hpc_train.rundir import read_jsonl
from hpc_train.runtime import tracker_state
from hpc_train.runtime.tracker_state import Tracker, TrackerRun, should_log
from hpc_train.train.trackers.mlflow_tracker import open_mlflow
from hpc_train.train.trackers.protocol import (Opened, TrackerContext, flat_params, scalar_tags,
                                               split_of)
from hpc_train.train.trackers.tensorboard_tracker import open_tensorboard
from hpc_train.train.trackers.wandb_tracker import open_wandb

log = logging.getLogger("hpc_train.trackers")

OPENERS: dict[Tracker, Callable[[TrackerContext], Opened | None]] = {
    Tracker.TENSORBOARD: open_tensorboard, Tracker.WANDB: open_wandb, Tracker.MLFLOW: open_mlflow}


class TrackerSet:
    """The open trackers of this segment, by kind, with the runs to keep in trackers.json."""

    def __init__(self, paths, opened: dict[Tracker, Opened], kept: dict[Tracker, TrackerRun]):
        self.paths, self.opened, self.kept = paths, opened, kept

    @classmethod
    def open(cls, spec, paths, first_step: int, spec_dict: Mapping, spec_text: str) -> TrackerSet:
        """Open spec.log.chosen_trackers; a new tracker run gets the spec as parameters."""
        kept = tracker_state.read(paths)
        trackers = cls(paths, {}, kept)
        for kind in spec.log.chosen_trackers:
            context = TrackerContext(spec, paths, first_step, spec_text, kept.get(kind))
            opened = trackers._guard(kind, "open", lambda: OPENERS[kind](context))
            if opened is not None:
                trackers.opened[kind] = opened
                if opened.run is not None:
                    trackers.kept[kind] = opened.run
        trackers._go_on_from_what_stores_hold(first_step)
        trackers._save()        # a new run's id, before anything is logged to it
        params = flat_params(spec_dict)
        for kind, opened in list(trackers.opened.items()):
            if opened.is_new:
                trackers._call(kind, "log the spec", lambda t: t.log_params(params))
        return trackers

    def write(self, record: Mapping) -> None:
        """One metrics.jsonl record to each tracker that has not logged its step yet."""
        split, logged = split_of(record), False
        for kind, opened in list(self.opened.items()):
            run = opened.run
            if run is not None and not opened.tracker.rewrites_steps \
                    and not should_log(run, split, record["step"]):
                continue
            if self._log(kind, record, "log metrics") and run is not None:
                logged = True
        if logged:
            self._save()

    def _log(self, kind: Tracker, record: Mapping, what: str) -> bool:
        """One record to one tracker, its logged step advanced; False when the tracker failed
        (and was dropped)."""
        step, split = record["step"], split_of(record)
        if not self._call(kind, what, lambda t: t.log_metrics(step, scalar_tags(record), record.get("time"))):
            return False
        opened = self.opened[kind]
        if opened.run is not None:
            opened.run = self.kept[kind] = opened.run.with_logged(split, step)
        return True

    def _go_on_from_what_stores_hold(self, first_step: int) -> None:
        """Each tracker that read back its store goes on from there: what it lost before
        `first_step` is replayed from metrics.jsonl (read once, only when needed)."""
        records = None
        for kind, opened in list(self.opened.items()):
            if opened.held is None or opened.run is None:
                continue
            opened.run = self.kept[kind] = replace(opened.run, logged=dict(opened.held))
            records = read_jsonl(self.paths.metrics) if records is None else records
            self._replay(kind, replay_records(records, opened.run, first_step))

    def _replay(self, kind: Tracker, records: list[Mapping]) -> None:
        """Log to one tracker what its store lost (replay_records), in order."""
        for record in records:
            if not self._log(kind, record, "replay metrics"):
                return
        if records:
            log.info("log.trackers %s: replayed %d records its store had lost (steps %d-%d)", kind,
                     len(records), records[0]["step"], records[-1]["step"])

    def final_checkpoint(self, path: Path) -> None:
        for kind in list(self.opened):
            self._call(kind, "log the final checkpoint", lambda t: t.log_final_checkpoint(path))

    def close(self) -> None:
        for kind in list(self.opened):
            self._call(kind, "close", lambda t: t.close())
        self.opened.clear()

    def _call(self, kind: Tracker, what: str, call) -> bool:
        """call(tracker); False (and the tracker dropped) when it fails."""
        opened = self.opened[kind]
        done = self._guard(kind, what, lambda: call(opened.tracker) or True)
        if done is None:
            self.opened.pop(kind, None)
        return done is not None

    @staticmethod
    def _guard(kind: Tracker, what: str, call):
        """call(), or None after saying why it failed: a tracker's libraries raise anything."""
        try:
            return call()
        except Exception as exc:     # noqa: BLE001 -- best effort, see the module docstring
            log.warning("log.trackers %s: could not %s (%s: %s); no more %s for this segment",
                        kind, what, type(exc).__name__, exc, kind)
            return None

    def _save(self) -> None:
        if not self.kept:
            return
        try:
            tracker_state.write(self.paths, self.kept)
        except OSError as exc:
            log.warning("log.trackers: %s not written (%s); a resume may log steps again",
                        self.paths.trackers, exc)


def replay_records(records: Iterable[Mapping], run: TrackerRun, first_step: int) -> list[Mapping]:
    """The metrics.jsonl records a tracker's store lacks that this segment will not train
    again: steps before `first_step` past the store's last step of their split; of a step
    recorded twice (trained again after an earlier resume), the later record (pure)."""
    latest: dict[tuple[str, int], Mapping] = {}
    for record in records:
        step = record.get("step")
        if isinstance(step, int) and step < first_step and should_log(run, split_of(record), step):
            latest[(split_of(record), step)] = record
    return [latest[key] for key in sorted(latest, key=lambda k: (k[1], k[0] != "train", k[0]))]

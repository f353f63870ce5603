"""The run state: what the driver and the ranks decide from, in one small file (`state.json`).

events.jsonl is the record, for people and inspection: a lost line there changes no decision,
since decisions read this file, and only this module reads or writes it. It is replaced whole
(`rundir.write_atomic`), so readers take no lock; an update reads, changes and writes it under an
flock, since the driver, rank 0 and the login node's `resume` may each update it. Keys this
version does not know are kept. A run made before the file existed has only events.jsonl: its
state is derived from those events until the first update writes the file. A damaged file is
logged and read the same way; the next update replaces it.
"""

from __future__ import annotations

import fcntl
import json
import logging
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import Callable

from hpc_train import events
from hpc_train.rundir import RunPaths, parse_json, write_atomic

log = logging.getLogger("hpc_train.run_state")


@dataclass(frozen=True)
class RunState:
    # Requeues spent per cause; the driver counts a failure's or a stall's before it requeues.
    retries: dict[str, int] = field(default_factory=dict)
    # (from, to) spec hashes `resume --allow-spec-change` accepted: a checkpoint made under
    # `from` may be loaded under `to`.
    consented_specs: tuple[tuple[str | None, str], ...] = ()
    # Blocks per stage: a timed balance reuses its cut after a requeue (the checkpoints hold it).
    pipeline_cut: tuple[int, ...] | None = None
    # Restarts of the ranks inside their job per cause, over the whole run (launch.restarts_in_job
    # bounds them per job: the driver counts its own).
    restarts_in_job: dict[str, int] = field(default_factory=dict)
    # Where the last checkpoint stands (train/state.Progress: step, epoch, consumed, samples,
    # samples_per_step, world_size): `resume` tells a change of world size from it.
    last_save: dict[str, int] | None = None
    # Runs ended by a stop, per what asked for it (events.STOP_KINDS: time_limit, preempted,
    # signal): preemptions counted apart from time limits. No decision reads it yet.
    stops: dict[str, int] = field(default_factory=dict)

    def failed_runs(self) -> int:
        """Runs that failed or stalled and were retried: what checkpoint.retries_on_failure bounds."""
        return sum(self.retries.get(cause, 0) for cause in events.FAILURE_CAUSES)

    def allows(self, from_hash: str | None, to_hash: str) -> bool:
        """Whether the user consented to go from spec `from_hash` to `to_hash`, at once or through
        resumes in between: a resume with a change whose run died before its first checkpoint,
        then another resume with a change (A -> B, then B -> C), consents to A -> C."""
        reached, frontier = {from_hash}, [from_hash]
        while frontier:
            at = frontier.pop()
            for start, end in self.consented_specs:
                if start == at and end not in reached:
                    reached.add(end)
                    frontier.append(end)
        return to_hash in reached

    def with_retry(self, cause: str) -> RunState:
        return replace(self, retries=_plus_one(self.retries, cause))

    def with_restart_in_job(self, cause: str) -> RunState:
        return replace(self, restarts_in_job=_plus_one(self.restarts_in_job, cause))

    def with_consent(self, from_hash: str | None, to_hash: str) -> RunState:
        return replace(self, consented_specs=(*self.consented_specs, (from_hash, to_hash)))

    def with_pipeline_cut(self, sizes) -> RunState:
        return replace(self, pipeline_cut=tuple(sizes))

    def with_last_save(self, position: dict) -> RunState:
        return replace(self, last_save=_counts(position))

    def with_stop(self, kind: str) -> RunState:
        return replace(self, stops=_plus_one(self.stops, kind))


def parse(data) -> RunState:
    """The file's JSON -> RunState; ValueError when it is not a run state."""
    try:
        cut, save = data.get("pipeline_cut"), data.get("last_save")
        return RunState(_counts(data.get("retries", {})),
                        tuple((a, str(b)) for a, b in data.get("consented_specs", [])),
                        None if cut is None else tuple(int(n) for n in cut),
                        _counts(data.get("restarts_in_job", {})),
                        None if save is None else _counts(save),
                        _counts(data.get("stops", {})))
    except (AttributeError, TypeError, ValueError) as exc:
        raise ValueError(f"not a run state: {exc}") from exc


def _counts(data) -> dict[str, int]:
    return {str(k): int(n) for k, n in data.items()}


def _plus_one(counts: dict[str, int], key: str) -> dict[str, int]:
    return {**counts, key: counts.get(key, 0) + 1}


def from_events(history: list[dict]) -> RunState:
    """The state that the events of a run made before state.json imply."""
    retries = Counter(e.get("cause") for e in events.named(history, events.REQUEUED)
                      if e.get("cause") in events.FAILURE_CAUSES)
    restarts = Counter(e.get("cause") for e in events.named(history, events.RESTARTED))
    consents = tuple((e.get("from_hash"), e.get("to_hash"))
                     for e in events.named(history, events.SPEC_CHANGE_ALLOWED))
    cuts = events.named(history, events.PIPELINE_CUT)
    return RunState(dict(retries), consents, tuple(cuts[0]["sizes"]) if cuts else None,
                    dict(restarts), stops=events.stops(history))


def _load(paths: RunPaths) -> tuple[RunState, dict]:
    """(the state, the file's JSON: {} when the state came from the events)."""
    try:
        raw = parse_json(paths.run_state.read_text())
        return parse(raw), raw
    except FileNotFoundError:
        pass
    except (OSError, ValueError) as exc:
        log.warning("the run state %s is damaged (%s): reading it from %s until the next update "
                    "replaces it", paths.run_state, exc, paths.events.name)
    return from_events(events.read(paths)), {}


def read(paths: RunPaths) -> RunState:
    """The run's state; a missing or damaged file is not an error (see the module docstring)."""
    return _load(paths)[0]


def update(paths: RunPaths, change: Callable[[RunState], RunState]) -> RunState:
    """Apply `change` under the run's lock and write the state whole; raises OSError when it
    cannot be written (the file is then as it was)."""
    with open(paths.run_state.with_name(".state.lock"), "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)           # released when the file closes
        state, raw = _load(paths)
        new = change(state)
        write_atomic(paths.run_state, (json.dumps({**raw, **asdict(new)}, indent=1) + "\n").encode())
        return new

"""A run directory -> RunStatus: what `status` shows. Reading is here; the summary is pure.

Everything comes from the run directory (events, metrics, heartbeats, checkpoints); a Slurm
state, when given, only replaces the state the events imply.
"""

from __future__ import annotations

import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpc_train import events as ev
from hpc_train import run_state
from hpc_train.checkpoint.layout import MARKER, list_complete, step_dir_name
from hpc_train.inspection.health import Beat, Health, assess
from hpc_train.inspection.trackers import TrackerView, read_views
from hpc_train.job.straggler import slowest_rank
from hpc_train.rundir import RunPaths, read_jsonl
from hpc_train.run_state import RunState
from hpc_train.runtime import heartbeat
from hpc_train.scheduler import Job
from hpc_train.spec.schema import DEFAULT_STALL_SECONDS, LaunchSpec

# Throughput fields a trainer may log, with their unit (pipeline runs log samples or tokens).
THROUGHPUT_FIELDS = (("images_per_s", "images/s"), ("samples_per_s", "samples/s"),
                     ("tokens_per_s", "tokens/s"))
log = logging.getLogger(__name__)
RATE_WINDOW = 10          # metric lines of the current run that set the recent step rate


@dataclass
class Throughput:
    field: str
    unit: str
    recent: float
    mean: float


@dataclass
class RunStatus:
    name: str
    run_dir: str
    job_id: str | None
    state: str
    state_source: str                 # "squeue", "sacct" or "events"
    requeues: int
    requeue_reasons: list[str]
    step: int | None
    total_steps: int | None
    epoch: int | None
    loss: float | None
    accuracy: float | None
    lr: float | None
    throughput: Throughput | None
    efficiency: float | None          # mean throughput / (baseline per rank x ranks)
    world_size: int | None
    eta_seconds: float | None
    checkpoint_step: int | None
    checkpoint_age_seconds: float | None
    health: Health
    slowest: dict | None = None       # the rank the others wait for (`slowest`), from the beats
    restarts_in_job: dict[str, int] = field(default_factory=dict)   # per cause (the run state)
    stops: dict[str, int] = field(default_factory=dict)   # runs ended by a stop, per kind (the run state)
    lost_nodes: dict[str, str] = field(default_factory=dict)  # the job's nodes Slurm shows lost: state
    diagnosis: dict | None = None     # set by the caller for failed or stalled runs
    # The run's experiment trackers: tracker, run_id, command (W&B: `wandb sync`), what.
    trackers: list[TrackerView] = field(default_factory=list)
    updated: float = field(default_factory=time.time)

    def to_json(self) -> dict:
        return asdict(self)


def throughput(train: list[dict]) -> Throughput | None:
    for name, unit in THROUGHPUT_FIELDS:
        values = [m[name] for m in train if isinstance(m.get(name), (int, float))]
        if values:
            return Throughput(name, unit, values[-1], sum(values) / len(values))
    return None


def step_rate(train: list[dict], since: float) -> float | None:
    """Steps per second over the last metric lines of the current run (after `since`)."""
    recent = [m for m in train if m.get("time", 0) >= since][-RATE_WINDOW:]
    if len(recent) >= 2 and recent[-1]["time"] > recent[0]["time"]:
        return (recent[-1]["step"] - recent[0]["step"]) / (recent[-1]["time"] - recent[0]["time"])
    if recent and recent[-1].get("step_time"):
        return 1.0 / recent[-1]["step_time"]
    return None


def total_steps(events: list[dict], spec: dict | None) -> int | None:
    """From `training_started`; a later accepted spec change (more epochs) recomputes it."""
    started = ev.last(events, ev.TRAINING_STARTED)
    if started is None:
        return None
    total, per_epoch = started.get("total_steps"), started.get("steps_per_epoch")
    changed = ev.spec_changed_after(events, started["time"])
    optim = (spec or {}).get("optim") or {}
    if changed and per_epoch and isinstance(optim.get("epochs"), int):
        total = per_epoch * optim["epochs"]
        if optim.get("max_steps"):
            total = min(total, optim["max_steps"])
    return total


@dataclass
class RunFiles:
    """What `status` reads of one run directory, as `summarize` judges it."""
    paths: RunPaths
    events: list[dict]
    metrics: list[dict]
    beats: dict[int, Beat]                  # the current run's heartbeats (older: earlier runs')
    checkpoint: tuple[int, float] | None    # the latest complete one: step, when it was marked
    spec: dict | None = None                # spec.yaml as saved
    waiting_ranks: list[int] = field(default_factory=list)  # missing at a collective (Horovod)
    state: RunState = field(default_factory=RunState)
    trackers: list[TrackerView] = field(default_factory=list)

    @classmethod
    def read(cls, paths: RunPaths) -> RunFiles:
        events = ev.read(paths)
        beats = heartbeat.read_beats(paths.heartbeat, ev.start_time(events))  # the current run's
        spec = read_spec(paths)
        return cls(paths, events, read_jsonl(paths.metrics), beats, latest_checkpoint(paths),
                   spec, state=run_state.read(paths), trackers=read_views(paths, spec))


def summarize(run: RunFiles, now: float, slurm: Job | None = None,
              baseline_per_rank: float | None = None, quiet_seconds: float = 600) -> RunStatus:
    """Pure: the files' contents (and the clock) -> the status of one run.

    quiet_seconds: no progress and no metric line for this long reads "no progress" (status
    --stall-minutes). Stalled ranks follow the run's own launch.stall_seconds (its `started`
    event)."""
    events, checkpoint = run.events, run.checkpoint
    train = [m for m in run.metrics if m.get("split") is None and "step" in m]
    val = [m for m in run.metrics if m.get("split") == "val"]
    last = train[-1] if train else {}
    submission = ev.last_submission(events)
    state = slurm.label if slurm else ev.state(events)
    running = state == "RUNNING"
    requeued = ev.named(events, ev.REQUEUED)
    world = ev.world_size(events)
    launched = ev.start_time(events)
    # Slurm may show RUNNING before the driver's next `started` (after a requeue): no ranks then.
    ended = ev.ending(ev.in_window(events, launched, float("inf"))) is not None
    rate = step_rate(train, launched)
    total = total_steps(events, run.spec)
    flow = throughput(train)
    eta = None
    if running and rate and total is not None and last:
        eta = max(0, total - last["step"]) / rate
    efficiency = None
    if flow and baseline_per_rank and world:
        efficiency = flow.mean / (baseline_per_rank * world)
    return RunStatus(
        name=run.paths.root.name, run_dir=str(run.paths.root),
        job_id=submission[0] if submission else None,
        state=state, state_source=slurm.source if slurm else "events",
        requeues=max(len(requeued), ev.restarts(events)), requeue_reasons=ev.requeue_reasons(events),
        step=last.get("step"), total_steps=total, epoch=last.get("epoch"), loss=last.get("loss"),
        accuracy=val[-1].get("accuracy") if val else None, lr=last.get("lr"), throughput=flow,
        efficiency=efficiency, world_size=world, eta_seconds=eta,
        checkpoint_step=checkpoint[0] if checkpoint else None,
        checkpoint_age_seconds=now - checkpoint[1] if checkpoint else None,
        health=assess(run.beats, last.get("time"), now, running and not ended, quiet_seconds,
                      run.waiting_ranks, world_size=world, launched=launched,
                      stall_seconds=ev.stall_seconds(events, DEFAULT_STALL_SECONDS),
                      start_seconds=ev.start_seconds(events, heartbeat.AUTO_START_SECONDS)),
        restarts_in_job=dict(run.state.restarts_in_job), stops=dict(run.state.stops),
        slowest=slowest(run.beats, run.spec),
        trackers=list(run.trackers),
        updated=now)


def slowest(beats: dict[int, Beat], spec: dict | None) -> dict | None:
    """The slowest rank against the others (job/straggler.py), with `words`, the run's
    launch.straggler_warn as `warn`, and `over` it; None without step times of two ranks."""
    found = slowest_rank(beats)
    if found is None:
        return None
    launch = (spec or {}).get("launch") or {}
    warn = launch.get("straggler_warn", LaunchSpec().straggler_warn)
    return {**found.to_json(), "words": found.words(), "warn": warn, "over": found.over(warn)}


def latest_checkpoint(paths: RunPaths) -> tuple[int, float] | None:
    steps = list_complete(paths.checkpoints)
    if not steps:
        return None
    marker = paths.checkpoints / step_dir_name(steps[-1]) / MARKER
    return steps[-1], marker.stat().st_mtime


def read_spec(paths: RunPaths) -> dict | None:
    """The run's spec.yaml as plain data, read with the spec loader's bounds (no aliases that
    expand past its limit, no nesting past its depth); None when missing or damaged."""
    import yaml

    from hpc_train.spec.yaml_io import parse_yaml

    try:
        loaded = parse_yaml(paths.spec.read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError, yaml.YAMLError) as exc:    # ValueError: bytes that are not UTF-8
        log.warning("%s is damaged (%s): read as if it were missing", paths.spec, type(exc).__name__)
        return None
    return loaded if isinstance(loaded, dict) else None


def baseline_per_rank(run_dir: str | Path) -> float | None:
    """Mean throughput per rank of another run (the single-rank baseline of `--baseline`)."""
    paths = RunPaths(Path(run_dir))
    train = [m for m in read_jsonl(paths.metrics) if m.get("split") is None]
    flow = throughput(train)
    world = ev.world_size(ev.read(paths))
    return flow.mean / (world or 1) if flow else None

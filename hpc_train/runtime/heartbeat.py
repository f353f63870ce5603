"""A rank's heartbeat: where it is (step, phase) and that it is alive, for the driver's watchdog
and for `status` on the login node.

The training loop only notes progress (two assignments per step, no I/O); a daemon thread writes
the rank's beat every `interval` seconds, to a file on its node (runtime/node_local.py), from
where the node's writer puts the beats of all its ranks in one file, heartbeat/node-<host>.json
(runtime/node_beats.py): one shared-file-system write per node per interval. A beat:

    {"rank", "host", "pid", "step", "phase", "progress": time of the last progress,
     "time": time of this write, "beat": how many beats the thread has written (the intervals
     this rank has beaten in this start; 0 before the first), "times": the rank's recent step
     times (`RankTimes`), "first_step_time": when it began its first step in this start
     (absent before)}

Two clocks tell two stories: an old `progress` with a fresh `time` is a rank alive but stuck
(in a collective waiting for a peer, or in a slow call); an old `time` is a rank that stopped
running altogether (SIGSTOP, a frozen node, a process holding the GIL forever). A rank stuck for
half of `stall_seconds` writes the Python stack of every thread to its log once, so `diagnose`
can show where it hangs (a frozen process cannot; the driver reports its process state).

`times` holds medians of the rank's last steps (train/timing.py: StepTimes, the loop's clock),
for the straggler comparison (job/straggler.py), and the longest time without progress in a
step and in a checkpoint save since its first step, from which `launch.stall_seconds: auto`
derives the stall bound (`stall_bound`).

The reader of the format is here too (`Beat`, `parse_beat`, `read_beats`): the driver's watchdog
(job/watchdog.py) and `status`/`diagnose` on the login node read the node files with it, and
the heartbeat/rank-N files (one beat each) of runs made before them.
"""

from __future__ import annotations

import faulthandler
import json
import os
import socket
import sys
import threading
import time
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import Callable, Iterable

from hpc_train.rundir import HEARTBEAT_GLOB, NODE_HEARTBEAT_GLOB, parse_json, write_atomic

STACK_DUMP_HEADER = "hpc_train watchdog: no progress"


class Phase(str, Enum):
    """Where a rank is. The values are the words in heartbeat files (and old runs' files)."""

    STARTING = "starting"
    NETWORK = "network"
    COPYING = "copying"        # copying shards to node-local disk
    BUILDING = "building"
    RESUMING = "resuming"
    DATA = "data"
    TRAIN = "train"
    SYNC = "sync"
    EVALUATE = "evaluate"
    CHECKPOINT = "checkpoint"
    SAVED = "saved"
    STOPPING = "stopping"      # the stop's checkpoint is complete; the rank is exiting
    BENCH = "bench"

    def __str__(self) -> str:
        return self.value


# The phases of one training step, in the order a rank goes through them: fetching the batch,
# forward/backward/optimizer (gradient collectives included), then the collectives between
# steps (logged loss, stop agreement, evaluation totals). A rank in an earlier phase of the same
# step than the others is the one they wait for. They change several times a step: in memory only.
STEP_PHASES = (Phase.DATA, Phase.TRAIN, Phase.SYNC)
# `launch.stall_seconds: auto`: the phases whose silences a step's bound covers (an evaluation
# batch is shorter than a step; a save's end is a moment); a save has its own; any other phase
# (start-up, resuming) gets AUTO_START_SECONDS.
STEP_BOUND_PHASES = (*STEP_PHASES, Phase.EVALUATE, Phase.SAVED)
AUTO = "auto"
AUTO_START_SECONDS = 600.0   # before the first step: staging, building, resuming, the first step
AUTO_FLOOR_SECONDS = 60.0    # never tighter: a busy file system, a slow collective now and then
AUTO_MARGIN = 5.0            # times the longest silence seen (ft_launcher's safety factor)


def beat_interval(stall_seconds: float | str) -> float:
    """Often enough to tell a frozen rank well within the stall bound, rarely enough for a
    shared file system with thousands of ranks (with `auto`: the start-up bound's)."""
    seconds = AUTO_START_SECONDS if stall_seconds == AUTO else float(stall_seconds)
    return min(5.0, max(1.0, seconds / 10))


def silent_after(interval: float) -> float:
    """How long without a write before a rank counts as frozen: a few missed beats."""
    return max(3 * interval, 10.0)


def derived_stall_seconds(phases: Iterable[str], longest_step: float | None,
                          longest_save: float | None) -> float:
    """`auto`'s bound, given the ranks' phases now and the longest silences seen in a step and
    in a save: AUTO_MARGIN times the one that covers where the ranks are, at least
    AUTO_FLOOR_SECONDS; AUTO_START_SECONDS where nothing covers it (no step seen yet, a rank in
    start-up, a first save)."""
    phases = {str(phase) for phase in phases}     # the words: a Phase hashes by its name
    if longest_step is None or not phases <= {str(p) for p in (*STEP_BOUND_PHASES, Phase.CHECKPOINT)}:
        return AUTO_START_SECONDS
    longest = longest_step
    if str(Phase.CHECKPOINT) in phases:
        if longest_save is None:
            return AUTO_START_SECONDS
        longest = max(longest, longest_save)
    return max(AUTO_FLOOR_SECONDS, AUTO_MARGIN * longest)


def starting(beats: Iterable[Beat], world_size: int = 0, now: float | None = None,
             interval: float = 5.0) -> bool:
    """Are the ranks still starting: has one not begun its first step in this start (one of
    `world_size` without a beat has not), while every beat is still being rewritten (at `now`;
    a rank gone silent is frozen or its node dead, not slow to start)? Then
    launch.start_seconds bounds the silence, where longer."""
    beats = list(beats)
    if now is not None and any(now - b.time >= silent_after(interval) for b in beats):
        return False
    return not beats or len(beats) < world_size or any(b.first_step_time is None for b in beats)


def stall_bound(setting: float | str, beats: Iterable[Beat], start_seconds: float = AUTO_START_SECONDS,
                world_size: int = 0, now: float | None = None) -> float:
    """The watchdog's bound in seconds now: launch.stall_seconds (a number as given; `auto`
    from the beats), or launch.start_seconds where that is longer while the ranks are
    `starting` (judged at `now` where given)."""
    beats = list(beats)
    if setting != AUTO:
        bound = float(setting)
    else:
        steps = [b.times.longest_step if b.times else None for b in beats]
        saves = [b.times.longest_save for b in beats if b.times and b.times.longest_save is not None]
        bound = (AUTO_START_SECONDS if not beats or None in steps else
                 derived_stall_seconds((b.phase for b in beats), max(steps), max(saves, default=None)))
    return (max(bound, start_seconds) if starting(beats, world_size, now, beat_interval(setting))
            else bound)


class Heartbeat:
    """path: where this rank's beat goes (the node-local directory's file); after_beat: called
    after each beat of the thread, after_close: after the last (the node's writer: NodeWriter's
    tick and close, runtime/node_beats.py)."""

    def __init__(self, path: Path, rank: int, stall_seconds: float | str, clock=time.time,
                 host: str | None = None, after_beat: Callable[[], object] | None = None,
                 start_seconds: float = AUTO_START_SECONDS):
        self.path, self.rank, self.stall_seconds, self.clock = Path(path), rank, stall_seconds, clock
        self.start_seconds = start_seconds
        self.host = host or socket.gethostname()
        self.after_beat = after_beat
        self.after_close: Callable[[], object] | None = None
        # Called after this rank's stacks are dumped: the trainer's asks its data workers for
        # theirs (a rank waiting for a batch is stuck where its worker is).
        self.after_dump: Callable[[], object] | None = None
        self.interval = beat_interval(stall_seconds)
        self.step, self.phase = 0, Phase.STARTING
        self.progress_time = clock()
        self.step_times: Callable[[], dict | None] = lambda: None   # the loop's clock's medians
        self.first_step: int | None = None
        self.first_step_time: float | None = None   # when this start's first step began
        # The thread's beats so far: a count of intervals by the rank's own clock, against which
        # the node's shared-file-system writes are counted (tests/e2e/test_node_writes_e2e.py).
        self.beats = 0
        self.longest: dict[str, float] = {}     # "step", "save": the longest silence since it
        self.synced_seconds = 0.0               # in phase sync so far: waiting between steps
        self._dumped_at: float | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="hpc_train-heartbeat", daemon=True)

    def start(self) -> Heartbeat:
        self.write()
        self._thread.start()
        return self

    def progress(self, step: int | None = None, phase: Phase | None = None) -> None:
        """Called by the loop: cheap enough for every step and every evaluation batch (no I/O,
        except a beat written at once when the phase changes, a few times per run: a rank that
        freezes right after, before the thread's next beat, is then still shown where it is)."""
        now = self.clock()
        if self.phase == Phase.SYNC:
            self.synced_seconds += now - self.progress_time
        if self.first_step is not None and self.step > self.first_step:
            self._note_silence(now - self.progress_time)
        if step is not None:
            if self.first_step is None:
                self.first_step, self.first_step_time = step, now
            self.step = step
        self.progress_time = now
        if phase is not None and phase != self.phase:
            rare = not (phase in STEP_PHASES and self.phase in STEP_PHASES)
            self.phase = phase
            if rare:
                self.write()

    def _note_silence(self, seconds: float) -> None:
        kind = "save" if self.phase == Phase.CHECKPOINT else "step" if self.phase in STEP_BOUND_PHASES else None
        if kind and seconds > self.longest.get(kind, 0.0):
            self.longest[kind] = seconds

    def record(self) -> dict:
        record = {"rank": self.rank, "host": self.host, "pid": os.getpid(),
                  "step": self.step, "phase": self.phase, "progress": self.progress_time,
                  "time": self.clock(), "beat": self.beats}
        if self.first_step_time is not None:
            record["first_step_time"] = self.first_step_time
        times = {**(self.step_times() or {}),
                 **{f"longest_{kind}": round(s, 4) for kind, s in self.longest.items()}}
        if times:
            record["times"] = times
        return record

    def write(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_atomic(self.path, json.dumps(self.record()).encode(), durable=False)
        except OSError:
            pass     # a full disk must not kill the rank; the watchdog then sees no beat

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.beats += 1
            self.write()
            if self.after_beat is not None:
                self.after_beat()
            self._dump_if_stuck()

    def _bound(self) -> float:
        """The stall bound as this rank alone can tell it (with `auto`, from its own silences;
        before its first step, launch.start_seconds where that is longer)."""
        if self.stall_seconds != AUTO:
            bound = float(self.stall_seconds)
        else:
            bound = derived_stall_seconds([self.phase], self.longest.get("step"), self.longest.get("save"))
        return max(bound, self.start_seconds) if self.first_step_time is None else bound

    def _dump_if_stuck(self) -> None:
        idle = self.clock() - self.progress_time
        if idle < self._bound() / 2 or self._dumped_at == self.progress_time:
            return
        self._dumped_at = self.progress_time
        print(f"{STACK_DUMP_HEADER} for {idle:.0f} s on rank {self.rank} at step {self.step} "
              f"(phase {self.phase}); Python stacks of every thread follow", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)
        if self.after_dump is not None:
            self.after_dump()

    def close(self) -> None:
        """Stop the thread; the last beat then says where the rank ended."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.interval)
        self.write()
        if self.after_close is not None:
            self.after_close()


# -- reading the beats (the driver's watchdog, `status` and `diagnose` on the login node) ----------

@dataclass(frozen=True)
class RankTimes:
    """A rank's `times`: medians over its last steps (seconds; None: not measured)."""
    step: float | None = None          # from one step's start to the next's
    data: float | None = None          # waiting for the loader
    busy: float | None = None          # the step less the time blocked in the gradient reduction
    steps: int = 0                     # how many steps the medians are of
    longest_step: float | None = None  # the longest silence in a step since the first step
    longest_save: float | None = None  # ... in a checkpoint save


@dataclass(frozen=True)
class Beat:
    """One rank's heartbeat file, as read back."""
    rank: int
    step: int
    phase: str
    progress: float      # when the rank last progressed
    time: float          # when the beat was written (the rank was alive)
    pid: int | None = None
    host: str | None = None
    times: RankTimes | None = None
    first_step_time: float | None = None   # when the rank began its first step in this start


def parse_beat(text: str) -> Beat | None:
    """A rank's heartbeat file's text -> Beat; None for anything else (a partial or foreign file)."""
    try:
        return parse_record(parse_json(text))
    except ValueError:
        return None


def parse_record(record) -> Beat | None:
    """One beat record (a rank file's, or one of a node file's) -> Beat; None if it is not one."""
    try:
        times = record.get("times")
        return Beat(int(record["rank"]), int(record["step"]), str(record.get("phase", "?")),
                    float(record["progress"]), float(record["time"]), record.get("pid"),
                    record.get("host"), RankTimes(**times) if isinstance(times, dict) else None,
                    _time_or_none(record.get("first_step_time")))
    except (ValueError, KeyError, TypeError, AttributeError):
        return None


def _time_or_none(value) -> float | None:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


def read_beats(directory: Path, since: float = 0.0) -> dict[int, Beat]:
    """The ranks' beats written at or after `since` (older ones are an earlier run's): from the
    node files (one per node, every rank of the node in it) and an old run's rank files; the
    latest beat of a rank where two files have it."""
    beats: dict[int, Beat] = {}
    if not directory.is_dir():
        return beats
    for path in directory.glob(NODE_HEARTBEAT_GLOB):
        try:
            records = _node_records(path.read_text(errors="replace"))   # damaged: skipped
        except OSError:
            continue
        _keep_latest(beats, (parse_record(r) for r in records), since)
    for path in directory.glob(HEARTBEAT_GLOB):
        try:
            _keep_latest(beats, [parse_beat(path.read_text(errors="replace"))], since)
        except OSError:
            continue
    return beats


def _node_records(text: str) -> list:
    try:
        record = parse_json(text)
    except ValueError:
        return []
    beats = record.get("beats") if isinstance(record, dict) else None
    return beats if isinstance(beats, list) else []


def _keep_latest(beats: dict[int, Beat], found: Iterable[Beat | None], since: float) -> None:
    for beat in found:
        if beat is not None and beat.time >= since and (beat.rank not in beats or beat.time > beats[beat.rank].time):
            beats[beat.rank] = beat


class NoHeartbeat:
    """For code that trains outside a run (benchmarks, tests of one process)."""

    synced_seconds = 0.0
    after_dump = None

    def progress(self, step: int | None = None, phase: Phase | None = None) -> None:
        pass

    def close(self) -> None:
        pass

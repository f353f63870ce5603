"""A rank's heartbeat: where it is (step, phase) and that it is alive, for the driver's watchdog
and for `status` on the login node.

The training loop only notes progress (two assignments per step, no I/O); a daemon thread writes
heartbeat/rank-N every `interval` seconds:

    {"rank", "host", "pid", "step", "phase", "progress": time of the last progress,
     "time": time of this write}

Two clocks tell two stories: an old `progress` with a fresh `time` is a rank alive but stuck
(in a collective waiting for a peer, or in a slow call); an old `time` is a rank that stopped
running altogether (SIGSTOP, a frozen node, a process holding the GIL forever). A rank stuck for
half of `stall_seconds` writes the Python stack of every thread to its log once, so `diagnose`
can show where it hangs (a frozen process cannot; the driver reports its process state).

The reader of the format is here too (`Beat`, `parse_beat`, `read_beats`): the driver's watchdog
(job/watchdog.py) and `status`/`diagnose` on the login node read the files with it.
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

from hpc_train.rundir import HEARTBEAT_GLOB

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
    BENCH = "bench"

    def __str__(self) -> str:
        return self.value


# The phases of one training step, in the order a rank goes through them: fetching the batch,
# forward/backward/optimizer (gradient collectives included), then the collectives between
# steps (logged loss, stop agreement, evaluation totals). A rank in an earlier phase of the same
# step than the others is the one they wait for. They change several times a step: in memory only.
STEP_PHASES = (Phase.DATA, Phase.TRAIN, Phase.SYNC)


def beat_interval(stall_seconds: float) -> float:
    """Often enough to tell a frozen rank well within the stall bound, rarely enough for a
    shared file system with thousands of ranks."""
    return min(5.0, max(1.0, stall_seconds / 10))


class Heartbeat:
    def __init__(self, path: Path, rank: int, stall_seconds: float, clock=time.time):
        self.path, self.rank, self.stall_seconds, self.clock = Path(path), rank, stall_seconds, clock
        self.interval = beat_interval(stall_seconds)
        self.step, self.phase = 0, Phase.STARTING
        self.progress_time = clock()
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
        if step is not None:
            self.step = step
        self.progress_time = self.clock()
        if phase is not None and phase != self.phase:
            rare = not (phase in STEP_PHASES and self.phase in STEP_PHASES)
            self.phase = phase
            if rare:
                self.write()

    def record(self) -> dict:
        return {"rank": self.rank, "host": socket.gethostname(), "pid": os.getpid(),
                "step": self.step, "phase": self.phase, "progress": self.progress_time,
                "time": self.clock()}

    def write(self) -> None:
        tmp = self.path.with_name(f".{self.path.name}.tmp")
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps(self.record()))
            os.replace(tmp, self.path)
        except OSError:
            pass     # a full disk must not kill the rank; the watchdog then sees no beat

    def _run(self) -> None:
        while not self._stop.wait(self.interval):
            self.write()
            self._dump_if_stuck()

    def _dump_if_stuck(self) -> None:
        idle = self.clock() - self.progress_time
        if idle < self.stall_seconds / 2 or self._dumped_at == self.progress_time:
            return
        self._dumped_at = self.progress_time
        print(f"{STACK_DUMP_HEADER} for {idle:.0f} s on rank {self.rank} at step {self.step} "
              f"(phase {self.phase}); Python stacks of every thread follow", file=sys.stderr, flush=True)
        faulthandler.dump_traceback(file=sys.stderr, all_threads=True)

    def close(self) -> None:
        """Stop the thread; the last beat then says where the rank ended."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=2 * self.interval)
        self.write()


# -- reading the beats (the driver's watchdog, `status` and `diagnose` on the login node) ----------

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


def parse_beat(text: str) -> Beat | None:
    """A heartbeat file's text -> Beat; None for anything else (a partial or foreign file)."""
    try:
        record = json.loads(text)
        return Beat(int(record["rank"]), int(record["step"]), str(record.get("phase", "?")),
                    float(record["progress"]), float(record["time"]), record.get("pid"),
                    record.get("host"))
    except (ValueError, KeyError, TypeError):
        return None


def read_beats(directory: Path, since: float = 0.0) -> dict[int, Beat]:
    """The ranks' beats written at or after `since` (older ones are an earlier run's)."""
    beats = {}
    if directory.is_dir():
        for path in directory.glob(HEARTBEAT_GLOB):
            try:
                beat = parse_beat(path.read_text())
            except OSError:
                continue
            if beat is not None and beat.time >= since:
                beats[beat.rank] = beat
    return beats


class NoHeartbeat:
    """For code that trains outside a run (benchmarks, tests of one process)."""

    def progress(self, step: int | None = None, phase: Phase | None = None) -> None:
        pass

    def close(self) -> None:
        pass

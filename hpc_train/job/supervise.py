"""Supervising the launcher (mpirun or srun): pass stop signals on, wait in bounded slices, and tear the ranks down
when the watchdog (watchdog.py) finds them stalled or deaf to a stop; warn of a straggler
(straggler.py) on the way."""

from __future__ import annotations

import collections
import logging
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field, replace

from hpc_train import events
from hpc_train.job import watchdog
from hpc_train.job.requeue import PREEMPTED
from hpc_train.job.straggler import StragglerWarnings
from hpc_train.rundir import RunPaths
from hpc_train.runtime.heartbeat import AUTO_START_SECONDS, Beat, beat_interval, stall_bound, starting

log = logging.getLogger("hpc_train.driver")

STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)
POLL_SECONDS = 1.0           # between looks at the heartbeats while mpirun runs
TEARDOWN_SECONDS = 30        # mpirun's own SIGTERM -> SIGKILL of its ranks, before we step in
# Before the job's end: ranks that saved their stop are ended then if still exiting, for the
# driver's requeue (a few scontrol calls) to come before Slurm's kill.
REQUEUE_SECONDS = 15


class StopForwarder:
    """Signal handlers that pass a stop on to the launcher once, and remember why and when.
    They stay for the whole job: a stop between two starts of the ranks reaches the next."""

    def __init__(self, process: subprocess.Popen | None = None):
        self.process = process
        self.reason: str | None = None
        self.source = "driver signal"
        self.at: float | None = None
        self.previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}

    def follow(self, process: subprocess.Popen) -> None:
        """Forward to this launcher from now on (at once if the stop came already)."""
        self.process = process
        if self.reason is not None:
            self._forward()

    def _handle(self, signum, _frame) -> None:
        if self.reason is None:
            self.reason, self.at = signal.Signals(signum).name, time.time()
            self._forward()

    def preempted(self) -> None:
        """The sentinel's word (another thread): a stop like a signal's, while ranks run. Heard
        between two starts of the ranks, or after they ended (our own requeue signals the steps
        too), it is not a stop of theirs: ignored."""
        if self.reason is None and self.process is not None and self.process.poll() is None:
            self.reason, self.source, self.at = PREEMPTED, "preemption sentinel step", time.time()
            self._forward()

    def _forward(self) -> None:
        # Always USR2 to the launcher: mpirun and srun pass USR1/USR2 on to the ranks, but
        # Open MPI treats a SIGTERM as "abort the job" and kills the ranks (and their data
        # workers) before they can save. The ranks stop at a step boundary either way.
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGUSR2)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


class LauncherOutput:
    """The launcher's stderr, passed on to ours line by line, its last lines kept: where mpirun
    and srun report a lost node (node_fault.py)."""

    def __init__(self, stream, keep: int = 200):
        self.lines: collections.deque[str] = collections.deque(maxlen=keep)
        self.thread = threading.Thread(target=self._copy, args=(stream,), daemon=True)
        self.thread.start()

    def _copy(self, stream) -> None:
        for line in stream:       # drained to the end whatever happens: a full pipe would block mpirun
            self.lines.append(line.rstrip("\n"))
            try:
                sys.stderr.write(line)
                sys.stderr.flush()
            except (OSError, ValueError):
                pass

    def tail(self, wait: float = 2.0) -> list[str]:
        """The last lines, once the launcher's stderr is closed (or after `wait` seconds: a
        process it left behind may hold it open)."""
        self.thread.join(wait)
        return list(self.lines)


@dataclass
class Watch:
    """What the supervision loop needs to judge the ranks."""
    paths: RunPaths
    world_size: int
    stall_seconds: float | str    # launch.stall_seconds: seconds, or "auto"
    grace: float
    launched: float
    method: str = "mpirun"   # the launcher: how the ranks are torn down
    straggler_warn: float | None = None   # launch.straggler_warn
    end: float | None = None  # the job's planned end (None outside Slurm)
    start_seconds: float = AUTO_START_SECONDS   # launch.start_seconds
    warnings: StragglerWarnings = field(init=False)
    _beats: dict[int, Beat] = field(init=False, default_factory=dict)
    _read_at: float | None = field(init=False, default=None)

    def __post_init__(self):
        self.warnings = StragglerWarnings(self.straggler_warn)

    @property
    def interval(self) -> float:
        return beat_interval(self.stall_seconds)

    def beats(self, now: float, fresh: bool = False) -> dict[int, Beat]:
        """The ranks' beats, read at most once per beat interval (they change no oftener) unless
        `fresh`: one file per node, whatever the ranks per node."""
        if fresh or self._read_at is None or now - self._read_at >= self.interval:
            self._beats = watchdog.read_beats(self.paths.heartbeat, since=self.launched)
            self._read_at = now
        return self._beats

    def stall(self, forwarder: StopForwarder, now: float) -> watchdog.Stall | None:
        if self.end is not None and self.end - now <= REQUEUE_SECONDS:
            late = watchdog.out_of_time(self.beats(now, fresh=True), self.world_size, now,
                                        self.end, REQUEUE_SECONDS, self.launched)
            if late:
                return late
        beats = self.beats(now)
        self.warn_straggler(beats, now)
        if forwarder.at is not None:
            found = watchdog.stop_ignored(beats, self.world_size, now, forwarder.at, self.grace,
                                          self.interval, self.launched)
            if found and self._read_at != now:     # judge where they stand on the newest beats
                found = watchdog.stop_ignored(self.beats(now, fresh=True), self.world_size, now,
                                              forwarder.at, self.grace, self.interval,
                                              self.launched)
            if found:
                return found
        bound = stall_bound(self.stall_seconds, beats.values(), self.start_seconds, self.world_size, now)
        setting = ("launch.start_seconds" if bound == self.start_seconds != self.stall_seconds
                   and starting(beats.values(), self.world_size, now, self.interval) else "launch.stall_seconds")
        return watchdog.find_stall(beats, self.world_size, self.launched, now, bound, self.interval, setting)

    def warn_straggler(self, beats: dict[int, Beat], now: float) -> None:
        """Record a `straggler` event when one is due (bounded per rank)."""
        if found := self.warnings.due(beats, now):
            log.warning("straggler: %s", found.words())
            events.try_record(self.paths, events.straggler(found.words(), **found.to_json()))


def supervise(process: subprocess.Popen, forwarder: StopForwarder,
               watch: Watch) -> tuple[int, watchdog.Stall | None]:
    """Wait for mpirun in bounded slices; on a stall, record it and tear the ranks down."""
    while True:
        try:
            return process.wait(timeout=POLL_SECONDS), None
        except subprocess.TimeoutExpired:
            pass
        stall = watch.stall(forwarder, time.time())
        if stall is not None:
            stall = _with_process_states(stall)
            log.error("watchdog: %s; stalled: %s", stall.why, "; ".join(
                f"rank {r.rank} on {r.host} pid {r.pid} step {r.step} ({r.why}"
                f"{', state ' + r.state if r.state else ''})" for r in stall.ranks))
            events.try_record(watch.paths, events.ranks_stalled(
                stall.why, stall.ranks_json(), round(stall.idle_seconds, 1), str(stall.standing)))
            return _tear_down(process, stall, watch.method), stall


def _with_process_states(stall: watchdog.Stall) -> watchdog.Stall:
    """Add /proc's state (e.g. 'T (stopped)') for stalled ranks on this host."""
    here = socket.gethostname()
    return replace(stall, ranks=tuple(
        replace(r, state=watchdog.process_state(r.pid)) if r.host == here else r
        for r in stall.ranks))


def _tear_down(process: subprocess.Popen, stall: watchdog.Stall, method: str) -> int:
    """End every rank on every node, in bounded stages.

    mpirun: SIGTERM (it kills its ranks, SIGCONT and SIGKILL included, on every node). srun: two
    SIGINTs within a second, which make srun cancel the step, so slurmstepd kills the tasks on
    every node (a single SIGTERM would only be passed on to the ranks). If the launcher has not
    finished within TEARDOWN_SECONDS, SIGKILL the stalled ranks we can reach, then the launcher.
    Ranks that all saved their stop lose nothing: mpirun is killed at once (its ranks, left
    without it, are ended with the job's steps when Slurm requeues it).
    """
    if method == "srun":
        process.send_signal(signal.SIGINT)
        time.sleep(0.3)
        process.send_signal(signal.SIGINT)
    elif stall.standing is watchdog.Standing.EXITING:
        process.kill()
        _kill_local(stall.ranks)
    else:
        process.terminate()
    try:
        return process.wait(timeout=TEARDOWN_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    _kill_local(stall.ranks)
    try:
        return process.wait(timeout=TEARDOWN_SECONDS)
    except subprocess.TimeoutExpired:
        log.error("%s did not end %d s after the teardown began; killing it", method,
                  2 * TEARDOWN_SECONDS)
        process.kill()
        return process.wait(timeout=TEARDOWN_SECONDS)


def _kill_local(ranks: tuple[watchdog.StalledRank, ...]) -> None:
    """SIGKILL the ranks among `ranks` that run on this host."""
    here = socket.gethostname()
    for rank in ranks:
        if rank.pid and rank.host == here:
            try:
                os.kill(rank.pid, signal.SIGKILL)
            except OSError:
                pass

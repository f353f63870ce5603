"""Has the job stopped making progress, and which ranks hold it? Pure functions of the ranks'
heartbeats (runtime/heartbeat.py) and the clock; the driver reads the files and acts.

A stall is no rank progressing for `stall_seconds` (every rank waits at a collective for the
one that is stuck, so nobody progresses). The ranks named are, in order of evidence:
  1. ranks that stopped beating altogether (frozen process, dead node) or never beat at all;
  2. otherwise the ranks behind the others: a lower step, or an earlier phase of the same step
     (fetching data, computing, or waiting between steps: runtime/heartbeat.STEP_PHASES);
  3. otherwise every rank (all alive at the same step: a collective hang, no single culprit).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path

# The heartbeat format's reader lives next to its writer; re-exported for the driver.
from hpc_train.runtime.heartbeat import (STEP_PHASES, Beat, Phase, parse_beat, read_beats,
                                         silent_after)

__all__ = ["Beat", "Stall", "StalledRank", "Standing", "began_training", "culprits", "exiting",
           "find_stall", "out_of_time", "parse_beat", "process_state", "read_beats", "silent_after",
           "stop_ignored"]


@dataclass(frozen=True)
class StalledRank:
    rank: int
    host: str | None
    pid: int | None
    step: int | None
    phase: str | None
    idle_seconds: float
    why: str
    state: str | None = None    # the process state, where the driver can see it (same host)


class Standing(str, Enum):
    """Where the ranks stood when the watchdog ended them: what ending them cost, and so whether
    the code is at fault. The values are the words in `ranks_stalled` events."""

    TRAINING = "training"   # stuck, or deaf to a stop they had the whole grace to obey: a failure
    STARTING = "starting"   # the stop came while they still started: too late for them to obey
    EXITING = "exiting"     # every rank had saved the stop and was exiting: nothing is lost

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class Stall:
    why: str
    idle_seconds: float
    ranks: tuple[StalledRank, ...]
    standing: Standing = Standing.TRAINING

    def ranks_json(self) -> list[dict]:
        return [asdict(r) for r in self.ranks]


def find_stall(beats: dict[int, Beat], world_size: int, launched: float, now: float,
               stall_seconds: float, interval: float, setting: str = "launch.stall_seconds") -> Stall | None:
    """None while some rank progressed within `stall_seconds` of `now` (a rank that has not
    beaten yet counts from the launch); `setting`: the spec key the bound came from."""
    progress = [beats[r].progress if r in beats else launched for r in range(world_size)]
    idle = now - max(max(progress), launched)
    if idle < stall_seconds:
        return None
    why = f"no rank progressed for {idle:.0f} s ({setting}={stall_seconds:g})"
    standing = Standing.EXITING if exiting(beats, world_size) else Standing.TRAINING
    if standing is Standing.EXITING:
        why += " (they had saved their stop and were exiting)"
    return Stall(why, idle, culprits(beats, world_size, now, interval, launched), standing)


def culprits(beats: dict[int, Beat], world_size: int, now: float, interval: float,
             launched: float) -> tuple[StalledRank, ...]:
    """The ranks holding the job (see the module's docstring); launched: when this run started
    (a rank that never beat has been idle since then)."""
    silent = silent_after(interval)

    def named(rank: int, why: str) -> StalledRank:
        beat = beats.get(rank)
        if beat is None:
            return StalledRank(rank, None, None, None, None, round(now - launched, 1), why)
        return StalledRank(rank, beat.host, beat.pid, beat.step, beat.phase,
                           round(now - beat.progress, 1), why)

    missing = [named(r, "no heartbeat from this run") for r in range(world_size) if r not in beats]
    frozen = [named(r, f"no heartbeat for {now - b.time:.0f} s: the process is not running")
              for r, b in sorted(beats.items()) if now - b.time >= silent]
    if missing or frozen:
        return tuple(missing + frozen)
    low = min(b.step for b in beats.values())
    if any(b.step > low for b in beats.values()):
        return tuple(named(r, f"behind the others at step {b.step}")
                     for r, b in sorted(beats.items()) if b.step == low)
    phases = {b.phase for b in beats.values()}
    if len(phases) > 1 and phases <= set(STEP_PHASES):
        first = min(phases, key=STEP_PHASES.index)
        return tuple(named(r, f"still in phase {first} of step {low} while the others wait for it "
                              "further on")
                     for r, b in sorted(beats.items()) if b.phase == first)
    return tuple(named(r, "alive but not progressing (all ranks at the same step)")
                 for r in sorted(beats))


def exiting(beats: dict[int, Beat], world_size: int) -> bool:
    """Every rank has saved its stop (the checkpoint is complete) and is exiting."""
    return all(r in beats and beats[r].phase == Phase.STOPPING for r in range(world_size))


def began_training(beats: dict[int, Beat], world_size: int) -> float | None:
    """When the last rank began its first step in this start; None while one has not."""
    times = [beats[r].first_step_time if r in beats else None for r in range(world_size)]
    return None if None in times else max(times)


def stop_ignored(beats: dict[int, Beat], world_size: int, now: float, signalled_at: float,
                 grace: float, interval: float, launched: float) -> Stall | None:
    """A forwarded stop that the ranks have not obeyed (exited) within `grace` seconds. Judged
    no sooner than two beats after the stop, so every live rank's beat says where it waits.

    The ranks only stop at a step boundary, after agreeing and saving, so a stop that came
    before every rank began training (Slurm sends --signal up to a minute early, and a loaded
    node takes 20 s to start them) gave them less than the grace to obey: ending them is an
    interruption, not their fault. Ranks that all saved the stop and are exiting lose nothing."""
    waited = now - signalled_at
    if waited < max(grace, 2 * interval):
        return None
    why = f"the ranks did not stop within {grace:g} s of the forwarded stop"
    began = began_training(beats, world_size)
    if exiting(beats, world_size):
        standing, why = Standing.EXITING, why + " (they had saved it and were exiting)"
    elif began is None or began > signalled_at:
        standing, why = Standing.STARTING, why + " (it came while they still started)"
    else:
        standing = Standing.TRAINING
    return Stall(why, waited, culprits(beats, world_size, now, interval, launched), standing)


def out_of_time(beats: dict[int, Beat], world_size: int, now: float, end: float | None,
                margin: float, launched: float) -> Stall | None:
    """Every rank has saved its stop, but the launcher has not returned and the job ends within
    `margin` seconds: the driver must requeue before Slurm's kill, and ending the exiting ranks
    loses nothing. (A loaded node took 9 s and more to end ranks after their save, and a slow
    first step after a start can bring the save itself close to the end.)"""
    if end is None or end - now > margin or not exiting(beats, world_size):
        return None
    saved = max(beats[r].time for r in range(world_size))
    why = (f"every rank had saved its stop and was exiting, {now - saved:.0f} s after, but the "
           f"launcher had not returned {max(end - now, 0):.0f} s before the job's end")
    ranks = tuple(StalledRank(r, b.host, b.pid, b.step, b.phase, round(now - b.time, 1),
                              "saved its stop; exiting") for r, b in sorted(beats.items()))
    return Stall(why, now - saved, ranks, Standing.EXITING)


def process_state(pid: int | None, proc: Path = Path("/proc")) -> str | None:
    """'T (stopped)', 'R (running)', ... of a process on this host, from /proc; None elsewhere."""
    if pid is None:
        return None
    try:
        text = (proc / str(pid) / "status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("State:"):
            return line.split(":", 1)[1].strip()
    return None

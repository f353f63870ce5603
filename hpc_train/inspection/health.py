"""Is a running job making progress, and which ranks hold it? Pure functions of the heartbeats
and the clock, by the driver's own rules (job/watchdog.py), so `status`, `diagnose` and the
driver name the same ranks.

Each rank's heartbeat thread rewrites heartbeat/rank-N every few seconds (runtime/heartbeat.py)
with `progress` (when the rank last moved) and `time` (when it was last alive). While the run is
RUNNING:
  - a rank whose beat has not been rewritten for `watchdog.silent_after(beat_interval)` is frozen
    (SIGSTOP, a dead node, a process holding the GIL): shown at once, for as long as it lasts;
  - when no rank has progressed for half of launch.stall_seconds (when a stuck rank dumps its
    stacks to its log), the ranks behind the others, or every rank if none is behind;
the ranks named are `watchdog.culprits`' (frozen or missing, else behind, else all). Ranks that
Horovod's stall inspector lists as missing at a collective are added. The driver itself tears
the ranks down after a whole launch.stall_seconds without progress.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from hpc_train.job.watchdog import StalledRank, culprits, silent_after
from hpc_train.runtime.heartbeat import AUTO_START_SECONDS, Beat, beat_interval, stall_bound
from hpc_train.spec.schema import DEFAULT_STALL_SECONDS

__all__ = ["Beat", "Health", "assess", "describe", "stalled_now"]


@dataclass
class Health:
    ok: bool
    message: str
    stalled_ranks: list[int] = field(default_factory=list)
    idle_seconds: float | None = None     # since the newest progress of a rank, or metric line
    stalled: list[dict] = field(default_factory=list)   # rank, host, pid, step, phase, idle_seconds, why


def stalled_now(beats: dict[int, Beat], world_size: int | None, launched: float, now: float,
                stall_seconds: float | str,
                start_seconds: float = AUTO_START_SECONDS) -> tuple[StalledRank, ...]:
    """The ranks holding a running job now; () while it progresses. launched: when the current
    run started (a rank that never beat counts from then); stall_seconds: a number or "auto";
    start_seconds: the bound before the first step, where longer."""
    interval = beat_interval(stall_seconds)
    world = world_size or (max(beats) + 1 if beats else 0)
    stall_seconds = stall_bound(stall_seconds, beats.values(), start_seconds, world, now)
    if not world:
        return ()
    frozen = any(now - b.time >= silent_after(interval) for b in beats.values())
    newest = max([b.progress for b in beats.values()] + [launched])
    if not frozen and now - newest < stall_seconds / 2:
        return ()
    return culprits(beats, world, now, interval, launched)


def describe(rank: StalledRank) -> str:
    """"1 on vm pid 4242 at step 36 (train), 45 s without progress: <why>"."""
    where = f" on {rank.host}" if rank.host else ""
    pid = f" pid {rank.pid}" if rank.pid else ""
    at = f" at step {rank.step} ({rank.phase})" if rank.step is not None else ""
    return f"{rank.rank}{where}{pid}{at}, {rank.idle_seconds:.0f} s without progress: {rank.why}"


def assess(beats: dict[int, Beat], last_metric_time: float | None, now: float, running: bool,
           quiet_seconds: float, waiting_ranks: list[int] | None = None, *,
           world_size: int | None = None, launched: float = 0.0,
           stall_seconds: float | str = DEFAULT_STALL_SECONDS,
           start_seconds: float = AUTO_START_SECONDS) -> Health:
    """beats: this run's (written since `launched`); quiet_seconds: no progress and no metric
    line for this long is "no progress" (status --stall-minutes); waiting_ranks: ranks a
    collective library reported missing (Horovod's stall warning)."""
    times = [b.progress for b in beats.values()] + ([last_metric_time] if last_metric_time else [])
    idle = now - max(times) if times else None
    if not running:
        return Health(True, "not running", [], idle)
    held = stalled_now(beats, world_size, launched, now, stall_seconds, start_seconds)
    named = {r.rank for r in held}
    waiting = sorted(set(waiting_ranks or []) - named)
    parts = [describe(r) for r in held]
    parts += [f"{r} (Horovod lists it missing at a collective)" for r in waiting]
    message = []
    if parts:
        message.append(f"stalled rank(s): {'; '.join(parts)}")
    if idle is not None and idle >= quiet_seconds:
        message.append(f"no progress for {idle / 60:.1f} min")
    if not message:
        return Health(True, "ok", [], idle)
    return Health(False, "; ".join(message), sorted(named | set(waiting)), idle,
                  [{k: v for k, v in asdict(r).items() if k != "state"} for r in held])

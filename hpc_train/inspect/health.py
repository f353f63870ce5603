"""Is a running job making progress? Pure functions of the heartbeats and the clock.

Each rank rewrites heartbeat/rank-N ({"step", "time", "pid"}) at every logged step. A rank whose
step is behind the others', or whose heartbeat went quiet while others' are fresh, is stalled;
no fresh heartbeat and no metric line for `stall_seconds` means the whole run made no progress.
"""

from __future__ import annotations

from dataclasses import dataclass, field

LAG_GRACE = 10.0   # seconds between a lagging rank's beat and the leaders'


@dataclass(frozen=True)
class Beat:
    step: int
    time: float


@dataclass
class Health:
    ok: bool
    message: str
    stalled_ranks: list[int] = field(default_factory=list)
    idle_seconds: float | None = None     # since the newest heartbeat or metric line


def assess(beats: dict[int, Beat], last_metric_time: float | None, now: float, running: bool,
           stall_seconds: float, waiting_ranks: list[int] | None = None) -> Health:
    """waiting_ranks: ranks a collective library reported missing (Horovod's stall warning)."""
    times = [b.time for b in beats.values()] + ([last_metric_time] if last_metric_time else [])
    idle = now - max(times) if times else None
    if not running:
        return Health(True, "not running", [], idle)
    stalled = set(waiting_ranks or [])
    if beats:
        # Behind: a lower step, written well before the leaders' beat (ranks that all passed
        # the same logged step write within milliseconds of each other).
        top = max(b.step for b in beats.values())
        top_time = max(b.time for b in beats.values() if b.step == top)
        stalled |= {r for r, b in beats.items() if b.step < top and top_time - b.time > LAG_GRACE}
        fresh = [r for r, b in beats.items() if now - b.time < stall_seconds]
        if fresh:
            stalled |= {r for r, b in beats.items() if now - b.time >= stall_seconds}
    parts = []
    if stalled:
        ranks = sorted(stalled)
        detail = ", ".join(f"{r} (step {beats[r].step})" if r in beats else str(r) for r in ranks)
        parts.append(f"stalled rank(s): {detail}; the others wait at a collective")
    if idle is not None and idle >= stall_seconds:
        parts.append(f"no progress for {idle / 60:.1f} min")
    if not parts:
        return Health(True, "ok", [], idle)
    return Health(False, "; ".join(parts), sorted(stalled), idle)

"""`bench scale`'s numbers, read from what a run recorded itself (pure: events and metric lines in).

Every interval ends at a time the job wrote (an event's or a metric line's `time`), never at
the moment a poll noticed it: a first step is the first training metric line (rank 0 writes
one per step with `log.every_steps: 1`), and a stop or a requeue starts at the moment the
benchmark sent it (its own clock, the same as the job's on one machine, NTP-close on a cluster).
"""

from __future__ import annotations

from hpc_train import events


def _training_times(metrics: list[dict]) -> list[float]:
    """When rank 0 logged each training step (validation lines are not steps)."""
    return [m["time"] for m in metrics if m.get("split") is None and "step" in m and "time" in m]


def first_step_after(metrics: list[dict], since: float) -> float | None:
    """When the first training step after `since` was logged; None before there is one."""
    return next((t for t in _training_times(metrics) if t > since), None)


def launch_seconds(history: list[dict], metrics: list[dict]) -> float | None:
    """From the submission (the `submitted` event, written by `submit`) to the first step."""
    submitted = events.last(history, events.SUBMITTED)
    if submitted is None:
        return None
    first = first_step_after(metrics, submitted["time"])
    return None if first is None else first - submitted["time"]


def training_again_at(history: list[dict], metrics: list[dict], sent: float) -> float | None:
    """When the ranks trained again after a stop sent at `sent`: the first step of the first
    start of the ranks after it (steps logged meanwhile by the stopping ranks do not count)."""
    start = next((e["time"] for e in events.named(history, events.STARTED) if e["time"] > sent), None)
    return None if start is None else first_step_after(metrics, start)


def back_to_training_seconds(history: list[dict], metrics: list[dict], sent: float) -> float | None:
    again = training_again_at(history, metrics, sent)
    return None if again is None else again - sent


def staging_seconds(history: list[dict]) -> float | None:
    """The slowest node's copy to node-local disk (`data_copied.seconds`, its own clock) of the
    first start: the others' copies run at the same time, so this is what the job waited."""
    copies = events.named(history, events.DATA_COPIED)
    if not copies:
        return None
    first = [e for e in copies if e.get("restart", 0) == copies[0].get("restart", 0)]
    return max(e["seconds"] for e in first)


def naming_seconds(history: list[dict], metrics: list[dict], rank: int) -> float | None:
    """From a frozen rank's last progress to the watchdog's `ranks_stalled` event naming it:
    that rank's idle seconds as the driver wrote them in the event. Only a stall after the
    first step counts (one in a slow start-up names ranks that never froze)."""
    first = first_step_after(metrics, 0.0)
    if first is None:
        return None
    for stall in events.named(history, events.RANKS_STALLED):
        if stall["time"] < first:
            continue
        for named in stall.get("ranks", []):
            if named.get("rank") == rank and named.get("idle_seconds") is not None:
                return float(named["idle_seconds"])
    return None


def driver_cpu_per_second(history: list[dict]) -> float | None:
    """The driver's CPU seconds per second of watching the ranks, over the first start of the
    ranks that recorded both (a `requeued` or `finished` event of the driver)."""
    for ending in events.named(history, events.REQUEUED, events.FINISHED):
        cpu, seconds = ending.get("driver_cpu_seconds"), ending.get("seconds")
        if cpu is not None and seconds:
            return cpu / seconds
    return None

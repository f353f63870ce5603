"""The arithmetic of `report` (pure): what a run used and what it lost, from sacct's segments
and the run directory's events and metrics.

A run is a list of windows on the wall clock, one per start of its job (sacct's segments, or the
driver's `started` events when there is no accounting). Between two windows the run loses the
time from the first one's end to training again in the next (queue wait, then start-up:
Python, the backend, the checkpoint load), plus the steps trained after the last checkpoint
before the stop, which the next window trains again.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from hpc_train import events as ev
from hpc_train.inspection.sacct import Segment


@dataclass(frozen=True)
class Window:
    """One start of the run's job."""
    job_id: str | None
    start: float
    end: float | None             # None: still running
    state: str                    # sacct's State, or what the events say (REQUEUED, COMPLETED, ...)
    cpus: int | None
    gpus: int | None

    def elapsed(self, now: float) -> float:
        return max(0.0, (self.end if self.end is not None else now) - self.start)


@dataclass(frozen=True)
class Usage:
    core_hours: float
    gpu_hours: float
    cpu_efficiency: float | None  # TotalCPU / (elapsed x allocated CPUs), all segments
    peak_rss: int | None          # bytes: the largest step task's peak (sacct MaxRSS)
    req_mem: int | None           # bytes per node (sacct ReqMem)
    source: str                   # "sacct", or "spec and events" (an estimate)


@dataclass(frozen=True)
class Restart:
    """The gap between window `after` and the next one."""
    after: int
    stopped: float                # when window `after` ended
    started: float                # when the next window started
    training: float | None        # when it trained again (None: it never did)
    last_step: int                # the highest step reached before the stop
    resumed_step: int | None      # where training went on (0: from scratch; None: never trained)
    step_seconds: float | None    # median seconds per step, to turn redone steps into time
    resubmitted: bool             # a new job (resume), not a requeue of the same one

    @property
    def wait(self) -> float:
        return max(0.0, self.started - self.stopped)

    @property
    def startup(self) -> float | None:
        return None if self.training is None else max(0.0, self.training - self.started)

    @property
    def redone_steps(self) -> int | None:
        return None if self.resumed_step is None else max(0, self.last_step - self.resumed_step)

    @property
    def redone_seconds(self) -> float | None:
        if self.redone_steps is None or self.step_seconds is None:
            return None
        return self.redone_steps * self.step_seconds

    @property
    def lost(self) -> float:
        """Seconds lost to this restart: queue wait (not after a resume, where a person chose
        when), start-up, and the redone steps; unknown parts count as 0."""
        return ((0.0 if self.resubmitted else self.wait) + (self.startup or 0.0)
                + (self.redone_seconds or 0.0))


def windows_from_sacct(segments: list[Segment]) -> list[Window]:
    return [Window(s.job_id, s.start, s.end, s.state, s.cpus, s.gpus) for s in segments]


def windows_from_events(events: list[dict], cpus: int, gpus: int) -> list[Window]:
    """Without accounting: the driver's `started` events, each ending at its `requeued` or
    `finished` event, else at the run's last record before the next start (None for the last)."""
    starts = sorted(ev.named(events, ev.STARTED), key=lambda e: e["time"])
    windows = []
    for k, start in enumerate(starts):
        until = starts[k + 1]["time"] if k + 1 < len(starts) else float("inf")
        inside = ev.in_window(events, start["time"], until)
        ending = ev.ending(inside)
        if ending is not None:
            end, state = ending["time"], _state_of(ending)
        elif k + 1 < len(starts):
            end, state = max(e["time"] for e in inside), "UNKNOWN"
        else:
            end, state = None, "RUNNING"
        windows.append(Window(start.get("job_id"), start["time"], end, state, cpus, gpus))
    return windows


def _state_of(ending: dict) -> str:
    if ev.was_requeued(ending):
        return "REQUEUED"
    return ev.FINISHED_STATES.get(ending.get("status"), "FAILED")


def usage_from_sacct(segments: list[Segment]) -> Usage:
    allocated = sum(s.cpus * s.elapsed for s in segments)
    used = [s.total_cpu for s in segments]
    efficiency = sum(used) / allocated if allocated > 0 and None not in used else None
    peaks = [s.max_rss for s in segments if s.max_rss is not None]
    requests = [s.req_mem for s in segments if s.req_mem]
    return Usage(allocated / 3600, sum(s.gpus * s.elapsed for s in segments) / 3600, efficiency,
                 max(peaks) if peaks else None, max(requests) if requests else None, "sacct")


def usage_from_windows(windows: list[Window], now: float) -> Usage:
    """An estimate from the spec's allocation and the events' times: no CPU time, no memory."""
    core = sum((w.cpus or 0) * w.elapsed(now) for w in windows) / 3600
    gpu = sum((w.gpus or 0) * w.elapsed(now) for w in windows) / 3600
    return Usage(core, gpu, None, None, None, "spec and events")


def _steps(events: list[dict], metrics: list[dict]) -> list[tuple[float, int]]:
    """(time, step) of every step the run is known to have reached."""
    found = [(m["time"], m["step"]) for m in metrics
             if m.get("split") is None and isinstance(m.get("step"), int) and "time" in m]
    found += [(e["time"], e["step"]) for e in ev.named(events, ev.CHECKPOINT_SAVED, ev.STOP_SAVED,
                                                       ev.RANK_FINISHED) if isinstance(e.get("step"), int)]
    return found


def step_seconds(metrics: list[dict]) -> float | None:
    times = [m["step_time"] for m in metrics if m.get("split") is None
             and isinstance(m.get("step_time"), (int, float))]
    return statistics.median(times) if times else None


def restarts(windows: list[Window], events: list[dict], metrics: list[dict]) -> list[Restart]:
    """One Restart per window after the first, in order."""
    steps = _steps(events, metrics)
    per_step = step_seconds(metrics)
    found = []
    for k in range(1, len(windows)):
        before, window = windows[k - 1], windows[k]
        until = windows[k + 1].start if k + 1 < len(windows) else float("inf")
        began = ev.named(ev.in_window(events, window.start, until), ev.RESUMED, ev.TRAINING_STARTED)
        first_metric = min((t for t, _ in steps if window.start <= t < until), default=None)
        training = began[0]["time"] if began else first_metric
        if began:
            resumed = began[0]["step"] if began[0]["event"] == ev.RESUMED else 0
        else:
            resumed = None
        reached = max((s for t, s in steps if t < window.start), default=0)
        stopped = before.end if before.end is not None else window.start
        found.append(Restart(k - 1, stopped, window.start, training, reached, resumed, per_step,
                             before.job_id != window.job_id))
    return found


def checkpoint_time(events: list[dict]) -> tuple[int, float]:
    """(saves, seconds spent saving) from the `checkpoint_saved` events."""
    saves = ev.named(events, ev.CHECKPOINT_SAVED)
    return len(saves), sum(float(e.get("seconds") or 0.0) for e in saves)


def samples_trained(events: list[dict], metrics: list[dict]) -> tuple[int, int | None]:
    """(the run's last step, samples per step): useful work, redone steps not counted twice."""
    last = max((s for _, s in _steps(events, metrics)), default=0)
    started = ev.last(events, ev.TRAINING_STARTED)
    return last, (started or {}).get("global_batch")


def gpu_summary(samples: list[dict]) -> dict | None:
    """NVML samples (runtime/gpu_sampler.py) -> mean utilisation and peak memory; None if none."""
    rows = [s for s in samples if isinstance(s.get("util"), (int, float))]
    if not rows:
        return None
    return {"samples": len(rows), "gpus": len({(s.get("host"), s.get("gpu")) for s in rows}),
            "mean_util": statistics.fmean(s["util"] for s in rows),
            "peak_mem": max(int(s.get("mem_used") or 0) for s in rows),
            "mem_total": max(int(s.get("mem_total") or 0) for s in rows)}

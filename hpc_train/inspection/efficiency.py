"""The arithmetic of `report` (pure): what a run used and what it lost, from sacct's segments
and the run directory's events and metrics.

A run is a list of windows on the wall clock, one per start of its job (sacct's segments, or the
driver's `started` events when there is no accounting). Between two windows the run loses the
time from the first one's end to training again in the next (queue wait, then start-up:
Python, the backend, the checkpoint load), plus the steps trained after the last checkpoint
before the stop, which the next window trains again. A restart of the ranks inside a window
(launch.restarts_in_job) loses the same, without the queue wait.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from hpc_train import events as ev
from hpc_train.scheduler import Segment


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


REQUEUE, RESUME, IN_JOB = "requeue", "resume", "in job"     # Restart.kind
# sacct's record of a job before Slurm took a node out of it (--no-kill): the job goes on in
# the next record, under the same id.
RESIZED = "RESIZING"


@dataclass(frozen=True)
class Restart:
    """The gap between window `after` and the next one, or (kind IN_JOB) between two starts of
    the ranks inside window `after`."""
    after: int
    stopped: float                # when window `after` ended
    started: float                # when the next window started
    training: float | None        # when it trained again (None: it never did)
    last_step: int                # the highest step reached before the stop
    resumed_step: int | None      # where training went on (0: from scratch; None: never trained)
    step_seconds: float | None    # median seconds per step, to turn redone steps into time
    kind: str                     # REQUEUE; RESUME: a new job; IN_JOB: in the same allocation
    cause: str | None = None      # IN_JOB: the `restarted` event's (failure, stall)

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
        """Seconds lost to this restart: the wait (not after a resume, where a person chose
        when), start-up, and the redone steps; unknown parts count as 0."""
        return ((0.0 if self.kind == RESUME else self.wait) + (self.startup or 0.0)
                + (self.redone_seconds or 0.0))


def windows_from_sacct(segments: list[Segment]) -> list[Window]:
    return [Window(s.job_id, s.start, s.end, s.state, s.cpus, s.gpus) for s in segments]


def windows_from_events(events: list[dict], cpus: int, gpus: int) -> list[Window]:
    """Without accounting: the driver's `started` events of each job start, each ending at its
    `requeued` or `finished` event, else at the run's last record before the next start (None
    for the last)."""
    starts = ev.job_starts(events)
    windows = []
    for k, start in enumerate(starts):
        until = starts[k + 1]["time"] if k + 1 < len(starts) else float("inf")
        inside = ev.in_window(events, start["time"], until)
        ending = ev.job_ending(inside)
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
    """One Restart per window after the first (but the record after a resize), and one per
    restart of the ranks inside a window, in time order."""
    steps, per_step = _steps(events, metrics), step_seconds(metrics)
    found = []
    for k in range(1, len(windows)):
        before, window = windows[k - 1], windows[k]
        if before.state == RESIZED and before.job_id == window.job_id:
            continue        # the same job, shrunk (a node lost under --no-kill): no restart
        until = windows[k + 1].start if k + 1 < len(windows) else float("inf")
        stopped = before.end if before.end is not None else window.start
        found.append(_gap(k - 1, stopped, (window.start, until), events, steps, per_step,
                          RESUME if before.job_id != window.job_id else REQUEUE))
    starts = ev.run_starts(events)
    for restarted in ev.named(events, ev.RESTARTED):
        later = [t for t in starts if t >= restarted["time"]]
        if later:
            inside = [k for k, w in enumerate(windows) if w.start <= restarted["time"]]
            found.append(_gap(inside[-1] if inside else 0, restarted["time"],
                              (later[0], later[1] if len(later) > 1 else float("inf")),
                              events, steps, per_step, IN_JOB, restarted.get("cause")))
    return sorted(found, key=lambda r: r.stopped)


def _gap(after: int, stopped: float, span: tuple[float, float], events: list[dict],
         steps: list[tuple[float, int]], per_step: float | None, kind: str,
         cause: str | None = None) -> Restart:
    """From the stop at `stopped` to training again in `span`, [the next start, the one after)."""
    started, until = span
    began = ev.named(ev.in_window(events, started, until), ev.RESUMED, ev.TRAINING_STARTED)
    first_metric = min((t for t, _ in steps if started <= t < until), default=None)
    training = began[0]["time"] if began else first_metric
    resumed = None if not began else began[0]["step"] if began[0]["event"] == ev.RESUMED else 0
    reached = max((s for t, s in steps if t < started), default=0)
    return Restart(after, stopped, started, training, reached, resumed, per_step, kind, cause)


def checkpoint_time(events: list[dict]) -> tuple[int, float]:
    """(saves, seconds spent saving) from the `checkpoint_saved` events."""
    saves = ev.named(events, ev.CHECKPOINT_SAVED)
    return len(saves), sum(float(e.get("seconds") or 0.0) for e in saves)


def samples_trained(events: list[dict], metrics: list[dict]) -> tuple[int, int | None, int | None]:
    """(the run's last step, samples per step, samples trained): useful work, redone steps not
    counted twice. Samples trained are the trainer's own count (metrics' `samples`), which holds
    across a change of world size; None for a run from before it was logged."""
    last = max((s for _, s in _steps(events, metrics)), default=0)
    started = ev.last(events, ev.TRAINING_STARTED)
    counted = [m["samples"] for m in metrics if m.get("split") is None and "samples" in m]
    return last, (started or {}).get("global_batch"), max(counted, default=None)


def gpu_summary(samples: list[dict]) -> dict | None:
    """NVML samples (runtime/gpu_sampler.py) -> mean utilisation and peak memory; None if none."""
    rows = [s for s in samples if isinstance(s.get("util"), (int, float))]
    if not rows:
        return None
    return {"samples": len(rows), "gpus": len({(s.get("host"), s.get("gpu")) for s in rows}),
            "mean_util": statistics.fmean(s["util"] for s in rows),
            "peak_mem": max(int(s.get("mem_used") or 0) for s in rows),
            "mem_total": max(int(s.get("mem_total") or 0) for s in rows)}

"""`report RUN_DIR`: how efficiently a run used what it was given, across all its requeues.

Gathers sacct's segments (when Slurm's accounting knows the run's jobs) and the run directory
(events, metrics, NVML samples), does the arithmetic in efficiency.py, and writes the timeline
PNG into the run directory. What cannot be known (no accounting, nothing sampled) is listed in
`unknown` with the reason; nothing here fails for want of it.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from hpc_train import events as ev
from hpc_train import run_state, scheduler
from hpc_train.inspection import efficiency
from hpc_train.inspection.efficiency import Restart, Usage, Window
from hpc_train.inspection.summary import read_spec, slowest
from hpc_train.rundir import RunPaths, read_jsonl
from hpc_train.runtime.heartbeat import read_beats


@dataclass
class Report:
    run: str
    job_ids: list[str]
    windows: list[Window]
    usage: Usage
    restarts: list[Restart]
    checkpoint_saves: int
    checkpoint_seconds: float
    last_step: int
    samples_per_step: int | None
    gpu: dict | None
    now: float
    sample_name: str = "images"       # what one sample is: images, or sequences (gpt)
    slowest: dict | None = None       # the last run's slowest rank (summary.slowest)
    straggler_warnings: int = 0       # `straggler` events over the whole run
    samples_counted: int | None = None    # the trainer's own count (holds across a resize)
    unknown: list[str] = field(default_factory=list)
    timeline: str | None = None
    stops: dict[str, int] = field(default_factory=dict)   # runs ended by a stop, per kind (the run state)

    @property
    def requeues(self) -> int:
        return sum(1 for r in self.restarts if r.kind == efficiency.REQUEUE)

    @property
    def restarts_in_job(self) -> dict[str, int]:
        """Restarts of the ranks inside their job, per cause."""
        return dict(Counter(r.cause or "?" for r in self.restarts if r.kind == efficiency.IN_JOB))

    @property
    def samples(self) -> int | None:
        if self.samples_counted is not None:
            return self.samples_counted
        return None if self.samples_per_step is None else self.last_step * self.samples_per_step

    @property
    def samples_per_hour(self) -> tuple[float, str] | None:
        """Samples per GPU-hour on GPU jobs, per core-hour on CPU jobs."""
        hours, unit = ((self.usage.gpu_hours, "GPU-hour") if self.usage.gpu_hours > 0
                       else (self.usage.core_hours, "core-hour"))
        if self.samples is None or hours <= 0:
            return None
        return self.samples / hours, unit

    @property
    def lost_seconds(self) -> dict[str, float]:
        """Wall-clock seconds lost, by cause (unknown parts count as 0; see `unknown`)."""
        requeued = [r for r in self.restarts if r.kind == efficiency.REQUEUE]
        return {"queue_wait": sum(r.wait for r in requeued),
                "startup": sum(r.startup or 0.0 for r in self.restarts),
                "redone_steps": sum(r.redone_seconds or 0.0 for r in self.restarts),
                "checkpoint_saves": self.checkpoint_seconds}

    def to_json(self) -> dict:
        rate = self.samples_per_hour
        return {
            "run": self.run, "job_ids": self.job_ids, "segments": [
                {**w.__dict__, "elapsed": w.elapsed(self.now)} for w in self.windows],
            "requeues": self.requeues, "stops": self.stops, "restarts_in_job": self.restarts_in_job,
            "usage": self.usage.__dict__,
            "checkpoints": {"saves": self.checkpoint_saves, "seconds": self.checkpoint_seconds},
            "restarts": [{**r.__dict__, "wait": r.wait, "startup": r.startup,
                          "redone_steps": r.redone_steps, "redone_seconds": r.redone_seconds,
                          "lost": r.lost} for r in self.restarts],
            "lost_seconds": self.lost_seconds, "last_step": self.last_step,
            "sample_name": self.sample_name, "samples_per_step": self.samples_per_step,
            "samples": self.samples,
            "samples_per_hour": None if rate is None else {"value": rate[0], "per": rate[1]},
            "gpu": self.gpu, "slowest": self.slowest, "straggler_warnings": self.straggler_warnings,
            "unknown": self.unknown, "timeline": self.timeline}


def _sample_name(spec: dict | None) -> str:
    """What one sample of the run is: a token sequence for gpt, token data or a causal_lm task
    (a user's language model), an image otherwise; from the spec's dict as written."""
    def section(name: str) -> dict:
        value = (spec or {}).get(name)
        return value if isinstance(value, dict) else {}

    language = (section("model").get("name") == "gpt" or section("task").get("name") == "causal_lm"
                or section("data").get("kind") in ("text", "tokens"))
    return "sequences" if language else "images"


def _allocation(spec: dict | None) -> tuple[int | None, int | None]:
    """(CPUs, GPUs) the spec asks for over all nodes; None without a readable spec."""
    slurm = (spec or {}).get("slurm")
    if not isinstance(slurm, dict):
        return None, None
    nodes = slurm.get("nodes") or 1
    return (nodes * (slurm.get("tasks_per_node") or 1) * (slurm.get("cpus_per_task") or 1),
            nodes * (slurm.get("gpus_per_node") or 0))


def _gpu_samples(paths: RunPaths) -> list[dict]:
    return [s for path in sorted(paths.gpu.glob("*.jsonl")) for s in read_jsonl(path)]


def build_report(paths: RunPaths, slurm: bool = True, now: float | None = None,
                 plot: bool = True) -> Report:
    now = time.time() if now is None else now
    events, metrics, spec = ev.read(paths), read_jsonl(paths.metrics), read_spec(paths)
    job_ids = ev.job_ids(events) or sorted({e["job_id"] for e in ev.named(events, ev.STARTED) if e.get("job_id")})
    unknown = []
    segments, problem = [], "not asked (--no-slurm)"
    if slurm and (ev.last_submission(events) or ("", "slurm"))[1] == "slurm":
        segments, problem = scheduler.segments(job_ids)
    elif slurm:
        problem = "the run used submitit's local executor: no Slurm accounting"
    if segments:
        windows, usage = efficiency.windows_from_sacct(segments), efficiency.usage_from_sacct(segments)
    else:
        cpus, gpus = _allocation(spec)
        windows = efficiency.windows_from_events(events, cpus or 0, gpus or 0)
        usage = efficiency.usage_from_windows(windows, now)
        unknown.append(f"accounting: {problem}; segments from the run's events, core- and GPU-hours "
                       "estimated from the spec's allocation, no CPU time or memory")
    unknown += _usage_gaps(usage, bool(segments))
    saves, seconds = efficiency.checkpoint_time(events)
    last_step, per_step, counted = efficiency.samples_trained(events, metrics)
    restarts = efficiency.restarts(windows, events, metrics)
    if any(r.redone_steps for r in restarts) and efficiency.step_seconds(metrics) is None:
        unknown.append("redone steps as time: no step_time in metrics.jsonl")
    gpu = efficiency.gpu_summary(_gpu_samples(paths))
    if gpu is None:
        unknown.append("GPU utilisation and memory: not sampled (" + (
            "no GPUs allocated" if usage.gpu_hours == 0 else
            "no NVML samples in gpu/: nvidia-ml-py not importable on the nodes, or no GPU visible") + ")")
    report = Report(paths.root.name, job_ids, windows, usage, restarts, saves, seconds, last_step,
                    per_step, gpu, now, _sample_name(spec),
                    slowest(read_beats(paths.heartbeat, ev.start_time(events)), spec),
                    len(ev.named(events, ev.STRAGGLER)), counted, unknown,
                    stops=dict(run_state.read(paths).stops))
    if plot and windows:
        from hpc_train.inspection.timeline import build_timeline, write_timeline

        figure = build_timeline(windows, restarts, events, now, f"{paths.root.name}: run segments")
        report.timeline = str(write_timeline(figure, paths.timeline))
    elif plot:
        unknown.append("timeline: the run never started (no segment to draw)")
    return report


def _usage_gaps(usage: Usage, accounted: bool) -> list[str]:
    if not accounted:
        return []
    gaps = []
    if usage.cpu_efficiency is None:
        gaps.append("CPU efficiency: sacct gave no TotalCPU for some segment")
    if usage.peak_rss is None:
        gaps.append("peak memory: sacct sampled none (steps shorter than the accounting interval, "
                    "JobAcctGatherFrequency, 30 s by default)")
    if usage.req_mem is None:
        gaps.append("memory request: none in sacct (slurm.mem not set)")
    return gaps

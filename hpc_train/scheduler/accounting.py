"""What Slurm's accounting knows of a run's jobs (pure): one `Segment` per start of a job (sacct -D
lists every requeued run as its own record), with its steps, from the client's `sacct -D -P -n -o
FIELDS` (the parsable format: `--json`'s layout changes between Slurm releases)."""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from hpc_train.scheduler.parse import JobState, parse_count, job_state, parse_duration, parse_time

FIELDS = ("JobID", "State", "Start", "End", "ElapsedRaw", "AllocCPUS", "AllocTRES", "ReqMem",
          "MaxRSS", "TotalCPU", "NNodes", "NodeList")
_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4, "P": 1024 ** 5}
_MEMORY = re.compile(r"([\d.]+)([KMGTP]?)([nc]?)")
_GPUS = re.compile(r"gres/gpu(?::[^=,]+)?=(\d+)")


@dataclass(frozen=True)
class Step:
    name: str                   # batch, extern, 0, 1, ...
    max_rss: int | None         # bytes, the largest task's peak (None: not sampled)
    total_cpu: float | None     # seconds, user + system


@dataclass(frozen=True)
class Segment:
    job_id: str
    state: JobState             # REQUEUED, COMPLETED, FAILED, RUNNING, ...
    start: float                # UNIX time
    end: float | None           # None while it runs
    elapsed: float              # seconds
    cpus: int
    gpus: int
    nodes: int
    node_list: str
    req_mem: int | None         # bytes per node
    total_cpu: float | None     # seconds, all steps
    steps: tuple[Step, ...] = ()

    @property
    def max_rss(self) -> int | None:
        return max((s.max_rss for s in self.steps if s.max_rss is not None), default=None)


def parse_memory(text: str, bare: str = "") -> int | None:
    """Bytes from a sacct size (MaxRSS: 3301704K); a number without a unit is in `bare` units."""
    match = _MEMORY.fullmatch(text.strip())
    if not match or match.group(3):
        return None
    number, unit, _ = match.groups()
    return int(float(number) * _UNITS[unit or bare])


def parse_req_mem(text: str, cpus: int, nodes: int) -> int | None:
    """ReqMem as bytes per node. Slurm 21.08+ prints the job's total (2 nodes of --mem=2G: 4G);
    older releases per node (2Gn) or per CPU (500Mc). A bare number is MB, as --mem reads it."""
    per = text.strip()[-1:] if text.strip()[-1:] in ("n", "c") else ""
    value = parse_memory(text.strip().rstrip("nc"), bare="M")
    if value is None:
        return None
    return int(value * {"c": cpus / max(nodes, 1), "n": 1}.get(per, 1 / max(nodes, 1)))


def gpus_of(tres: str) -> int:
    """GPUs in an AllocTRES list: the untyped gres/gpu count (typed ones repeat it)."""
    untyped = re.search(r"gres/gpu=(\d+)", tres)
    return int(untyped.group(1)) if untyped else sum(int(n) for n in _GPUS.findall(tres))


def parse_segments(text: str) -> list[Segment]:
    """sacct -D -P -n -o FIELDS rows -> the segments that started, in start order. A step row
    belongs to the latest allocation row of its job above it (sacct lists a segment's steps
    right after it)."""
    segments: list[Segment] = []
    steps: list[list[Step]] = []
    latest: dict[str, int] = {}          # job id -> index of its latest segment so far
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) < len(FIELDS):
            continue
        row = dict(zip(FIELDS, cells))
        job_id, _, step = row["JobID"].partition(".")
        if step:
            if job_id in latest:
                steps[latest[job_id]].append(
                    Step(step, parse_memory(row["MaxRSS"]), parse_duration(row["TotalCPU"])))
            continue
        start = parse_time(row["Start"])
        if start is None:                # never started (cancelled while pending): no segment
            latest.pop(job_id, None)
            continue
        cpus, nodes = parse_count(row["AllocCPUS"]) or 0, parse_count(row["NNodes"]) or 0
        segments.append(Segment(
            job_id=job_id, state=job_state(row["State"]), start=start,
            end=parse_time(row["End"]), elapsed=float(parse_count(row["ElapsedRaw"]) or 0), cpus=cpus,
            gpus=gpus_of(row["AllocTRES"]), nodes=nodes, node_list=row["NodeList"],
            req_mem=parse_req_mem(row["ReqMem"], cpus, nodes), total_cpu=parse_duration(row["TotalCPU"])))
        steps.append([])
        latest[job_id] = len(segments) - 1
    done = [replace(s, steps=tuple(found)) for s, found in zip(segments, steps)]
    return sorted(done, key=lambda s: s.start)

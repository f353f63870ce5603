"""What Slurm's accounting knows of a run's jobs: one `Segment` per start of a job (sacct -D lists
every requeued run of a job as its own record), with its steps.

The query is `sacct -D -P -n -o FIELDS -j IDS`; `parse` is pure and takes its text. The
parsable format is used, not `--json`, whose layout changes between Slurm releases.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from hpc_train import _proc

FIELDS = ("JobID", "State", "Start", "End", "ElapsedRaw", "AllocCPUS", "AllocTRES", "ReqMem",
          "MaxRSS", "TotalCPU", "NNodes", "NodeList")
_UNITS = {"": 1, "K": 1024, "M": 1024 ** 2, "G": 1024 ** 3, "T": 1024 ** 4, "P": 1024 ** 5}
_MEMORY = re.compile(r"([\d.]+)([KMGTP]?)([nc]?)")
_CPU_TIME = re.compile(r"(?:(\d+)-)?(?:(\d+):)?(\d+):(\d+(?:\.\d+)?)")
_GPUS = re.compile(r"gres/gpu(?::[^=,]+)?=(\d+)")


@dataclass(frozen=True)
class Step:
    name: str                   # batch, extern, 0, 1, ...
    max_rss: int | None         # bytes, the largest task's peak (None: not sampled)
    total_cpu: float | None     # seconds, user + system


@dataclass(frozen=True)
class Segment:
    job_id: str
    state: str                  # REQUEUED, COMPLETED, FAILED, RUNNING, ... (first word)
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
        found = [s.max_rss for s in self.steps if s.max_rss is not None]
        return max(found) if found else None


def parse_time(text: str) -> float | None:
    """sacct's local time (2026-11-30T11:10:39) as UNIX time; None for None/Unknown."""
    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        return None


def parse_memory(text: str, cpus: int = 1, nodes: int = 1, bare: str = "") -> int | None:
    """Bytes from sacct's sizes: MaxRSS (3301704K), ReqMem (2G; older releases: 2Gn per node,
    500Mc per CPU, turned into per node with `cpus` over `nodes`). A number without a unit is
    in `bare` units ("" bytes, "M" for a request, as sbatch --mem reads one)."""
    match = _MEMORY.fullmatch(text.strip())
    if not match:
        return None
    number, unit, per = match.groups()
    value = float(number) * _UNITS[unit or bare]
    if per == "c":
        value *= cpus / max(nodes, 1)
    return int(value)


def parse_cpu_time(text: str) -> float | None:
    """TotalCPU ([D-][HH:]MM:SS[.mmm]) in seconds."""
    match = _CPU_TIME.fullmatch(text.strip())
    if not match:
        return None
    days, hours, minutes, seconds = match.groups()
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes) * 60 + float(seconds)


def gpus_of(tres: str) -> int:
    """GPUs in an AllocTRES list: the untyped gres/gpu count (typed ones repeat it)."""
    untyped = re.search(r"gres/gpu=(\d+)", tres)
    if untyped:
        return int(untyped.group(1))
    return sum(int(n) for n in _GPUS.findall(tres))


def _int(text: str) -> int:
    return int(text) if text.strip().isdigit() else 0


def parse(text: str) -> list[Segment]:
    """sacct -D -P -n -o FIELDS rows -> segments that started, in start order; a step row
    belongs to the allocation row before it (sacct lists them so)."""
    segments: list[Segment] = []
    steps: list[list[Step]] = []
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) < len(FIELDS):
            continue
        row = dict(zip(FIELDS, cells))
        job_id, _, step = row["JobID"].partition(".")
        if step:
            if segments and segments[-1].job_id == job_id and steps[-1] is not None:
                steps[-1].append(Step(step, parse_memory(row["MaxRSS"]), parse_cpu_time(row["TotalCPU"])))
            continue
        start = parse_time(row["Start"])
        if start is None:                       # never started (cancelled while pending)
            continue
        cpus, nodes = _int(row["AllocCPUS"]), _int(row["NNodes"])
        segments.append(Segment(
            job_id=job_id, state=(row["State"].split() or ["UNKNOWN"])[0], start=start,
            end=parse_time(row["End"]), elapsed=float(_int(row["ElapsedRaw"])), cpus=cpus,
            gpus=gpus_of(row["AllocTRES"]), nodes=nodes, node_list=row["NodeList"],
            req_mem=parse_memory(row["ReqMem"], cpus, nodes, bare="M"), total_cpu=parse_cpu_time(row["TotalCPU"])))
        steps.append([])
    done = [Segment(**{**s.__dict__, "steps": tuple(found)}) for s, found in zip(segments, steps)]
    return sorted(done, key=lambda s: s.start)


def query(job_ids: list[str], timeout: float = 20.0) -> tuple[list[Segment], str | None]:
    """(segments, None), or ([], why there are none) when sacct fails or knows nothing."""
    if not job_ids:
        return [], "no Slurm job id in the run's events"
    out = _proc.run(["sacct", "-D", "-P", "-n", "-o", ",".join(FIELDS), "-j", ",".join(job_ids)],
                    timeout=timeout)
    if not out.ok:
        first = (out.stderr.strip().splitlines() or ["no output"])[0]
        return [], f"sacct failed ({first})"
    segments = parse(out.stdout)
    if not segments:
        return [], f"sacct has no record of job {', '.join(job_ids)} (accounting off, or purged)"
    return segments, None

"""Why did a run fail or stall? The first failed rank from the logs, and known signatures.

The failed rank is found from the rank logs (the first traceback by time), not from events:
a rank killed by the OOM killer or a hard exit writes no event, and ranks that fail because
another one died (connection closed, Horovod shut down) write theirs too. `rank_failed` events
are only a cross-check. A rank that died without a traceback is named by mpirun's report in the
driver log (launcher.py) when no rank raised first, or only raised because a peer had gone.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpc_train.inspect import logs
from hpc_train.inspect.launcher import RankExit, exit_hint, rank_exits
from hpc_train.inspect.logparse import Line, Traceback, run_index, tracebacks
from hpc_train.inspect.signatures import Match, match_signatures, missing_ranks
from hpc_train.inspect.slurm_state import SlurmInfo
from hpc_train.rundir import RunPaths, read_jsonl

# Exceptions that are consequences of another rank's failure, not causes.
_CONSEQUENCES = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                 "Horovod has been shut down", "HorovodInternalError")


@dataclass
class Failure:
    rank: int
    time: float
    exception: str
    traceback: str


@dataclass
class Diagnosis:
    run: int                               # 0-based index of the run (start or restart)
    runs: int
    first_failure: Failure | None
    event_rank: int | None                 # first rank_failed event of this run (cross-check)
    signatures: list[dict] = field(default_factory=list)   # id, title, fix, source, line
    stalled_ranks: list[int] = field(default_factory=list)  # from the collective library's warning
    failed_ranks: list[int] = field(default_factory=list)   # every rank with a traceback
    found_by: str | None = None            # "traceback" or "mpirun" (a rank that died silently)
    launcher: dict | None = None           # mpirun's report of the first rank to end: rank, how, hint

    @property
    def events_agree(self) -> bool | None:
        if self.first_failure is None or self.event_rank is None:
            return None
        return self.first_failure.rank == self.event_rank

    def to_json(self) -> dict:
        data = asdict(self)
        data["events_agree"] = self.events_agree
        return data


def _consequence(found: Traceback) -> bool:
    return any(c in found.text for c in _CONSEQUENCES)


def first_failure(per_rank: dict[int, list[Traceback]]) -> Failure | None:
    """The earliest first-traceback of any rank; a consequence error loses a tie (same ms)."""
    firsts = [found[0] for found in per_rank.values() if found]
    if not firsts:
        return None
    best = min(firsts, key=lambda t: (t.time, _consequence(t), t.rank))
    return Failure(best.rank, best.time, best.exception, best.text)


def silent_failure(per_rank: dict[int, list[Traceback]], ended: RankExit | None,
                   lines: dict[int, list[Line]]) -> Failure | None:
    """The rank mpirun saw end first, when it left no traceback and no rank raised first for a
    reason of its own (only "connection closed"-style consequences, or nothing)."""
    if ended is None or per_rank.get(ended.rank):
        return None
    firsts = [found[0] for found in per_rank.values() if found]
    if any(not _consequence(found) for found in firsts):
        return None
    own = lines.get(ended.rank, [])
    crash = [i for i, line in enumerate(own) if line.text.startswith("Fatal Python error")]
    tail = own[crash[-1]:crash[-1] + 80] if crash else own[-12:]    # faulthandler's whole report
    text = "\n".join(line.text for line in tail) or "(its log is empty)"
    return Failure(ended.rank, tail[-1].time if tail else 0.0,
                   f"no traceback: the rank ended with {ended.how} (mpirun's report)", text)


def driver_logs(paths: RunPaths, job_id: str | None) -> list[Path]:
    """The driver's output: submitit's logs of this job (all jobs if unknown) and slurm-*.out."""
    pattern = f"{job_id}_*" if job_id else "*"
    found = [p for p in sorted(paths.submitit.glob(pattern)) if p.suffix in (".out", ".err")]
    return found + sorted(paths.root.glob(f"slurm-{job_id or '*'}.out"))


def diagnose(paths: RunPaths, run: int | None = None, slurm: SlurmInfo | None = None) -> Diagnosis:
    """run: index of the run to look at (default: the last one)."""
    events = read_jsonl(paths.events)
    starts = logs.run_starts(events)
    index = logs.resolve_run(-1 if run is None else run, starts)
    lines: dict[int, list[Line]] = {}
    for rank, path in logs.rank_logs(paths).items():
        lines[rank] = list(logs.in_run(logs.read_rank(path, rank), starts, index))
    per_rank = {rank: tracebacks(found) for rank, found in lines.items()}
    started = [e for e in events if e.get("event") == "started"]
    job_id = started[index].get("job_id") if started else None
    driver = list(_driver_lines(paths, job_id))
    sources = _signature_lines(driver, lines, slurm)
    begin = starts[index] if starts else 0.0
    end = starts[index + 1] if index + 1 < len(starts) else float("inf")
    failed_events = [e for e in events if e.get("event") == "rank_failed" and begin <= e["time"] < end]
    stalled = sorted({r for found in lines.values() for r in missing_ranks(line.text for line in found)})
    ended = next((e for e in rank_exits(driver) if _exit_in_run(e, starts, index)), None)
    traced, silent = first_failure(per_rank), silent_failure(per_rank, ended, lines)
    return Diagnosis(run=index, runs=max(1, len(starts)), first_failure=silent or traced,
                     event_rank=failed_events[0].get("rank") if failed_events else None,
                     signatures=[_describe(m) for m in match_signatures(sources)],
                     stalled_ranks=stalled, failed_ranks=sorted(r for r, t in per_rank.items() if t),
                     found_by="mpirun" if silent else "traceback" if traced else None,
                     launcher=None if ended is None else {
                         "rank": ended.rank, "how": ended.how, "source": ended.source,
                         "line": ended.line[:300], "hint": exit_hint(ended.how)})


def _exit_in_run(ended: RankExit, starts: list[float], index: int) -> bool:
    """Whether mpirun's report belongs to run `index`: by the driver's "starting" line before it
    (logged just after the `started` event); a report without one counts for the last run."""
    if ended.started is None or not starts:
        return index == max(0, len(starts) - 1)
    return run_index(ended.started + 0.5, starts) == index


def _driver_lines(paths: RunPaths, job_id: str | None):
    for path in driver_logs(paths, job_id):
        for text in path.read_text(errors="replace").splitlines():
            yield path.name, text


def _signature_lines(driver: list[tuple[str, str]], lines: dict[int, list[Line]],
                     slurm: SlurmInfo | None):
    if slurm is not None:
        yield "sacct", f"State={slurm.state}"
    yield from driver
    for rank, found in lines.items():
        name = f"rank-{rank:05d}.log"
        for line in found:
            yield name, line.text


def _describe(match: Match) -> dict:
    sig = match.signature
    return {"id": sig.id, "title": sig.title, "fix": sig.fix, "source": match.source,
            "line": match.line[:300]}

"""Why did a run fail, stall or stop? The first failed rank from the logs, stalled ranks with
their stacks, a deliberate stop told apart from a failure, and known signatures.

The failed rank is found from the rank logs (the first traceback by time), not from events:
a rank killed by the OOM killer or a hard exit writes no event, and ranks that fail because
another one died (connection closed, Horovod shut down) write theirs too. `rank_failed` events
are only a cross-check. A rank that died without a traceback is named by mpirun's report in the
driver log (launcher.py) when no rank raised first, or only raised because a peer had gone.

A run whose ranks stopped on purpose (`stop_saved`, or mpirun reporting STOP_EXIT) did not fail:
`stop` says why, at which step, and how the run ended. A run the driver's watchdog found stuck
(`ranks_stalled`) is diagnosed as a stall first: the ranks it named, their process state and the
stacks each stuck rank dumped to its log; mpirun's report of the teardown and a time limit hit
afterwards are consequences. Ranks it ended after a stop that came before they trained, or that
they had saved and were exiting from (its `standing`), stopped: that is the diagnosis. While a
run is still RUNNING and no rank raised, a rank held up now is named from the heartbeats by the
same rule as `status` (health.py).
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpc_train import events
from hpc_train.inspection import health, logs
from hpc_train.inspection.launcher import RankExit, exit_hint, rank_exits
from hpc_train.inspection.logparse import (Line, Traceback, rank_host, run_index, stack_dump,
                                           tracebacks)
from hpc_train.inspection.signatures import (BY_ID, STALL_ADVICE, STALL_DONE, STALL_LIVE, Match,
                                          match_signatures, missing_ranks)
from hpc_train.job.watchdog import Standing
from hpc_train.scheduler import Job
from hpc_train.rundir import EVENTS_FILE, RunPaths
from hpc_train.runtime import heartbeat
from hpc_train.spec.schema import DEFAULT_STALL_SECONDS

# Exceptions that are consequences of another rank's failure, not causes.
_CONSEQUENCES = ("Connection closed by peer", "Connection reset by peer", "Broken pipe",
                 "Horovod has been shut down", "HorovodInternalError")
_STALL_SIGNATURE = BY_ID["rank_stalled"]
_AFTER_A_STALL = ("rank_stalled", "slurm_time_limit")   # replaced by the recorded stall


@dataclass
class Failure:
    rank: int
    time: float
    exception: str
    traceback: str
    host: str | None = None    # the node the rank ran on, from its log


@dataclass
class Diagnosis:
    run: int                               # 0-based index of the run (start or restart)
    runs: int
    first_failure: Failure | None
    event_rank: int | None                 # first rank_failed event of this run (cross-check)
    signatures: list[dict] = field(default_factory=list)   # id, title, fix, source, line, file
    stalled_ranks: list[int] = field(default_factory=list)  # the collective library's, the stall's
    failed_ranks: list[int] = field(default_factory=list)   # every rank with a traceback
    found_by: str | None = None            # "traceback"; "mpirun" or "srun": a rank that died
                                           # silently, named by its launcher's report
    launcher: dict | None = None           # the launcher's report of the first rank to end: rank, how, hint
    stop: dict | None = None               # stopped on purpose: reason, step, ending, detail
    stall: dict | None = None              # source (driver/heartbeats), why, ranks (with stacks), ending

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


def first_failure(per_rank: dict[int, list[Traceback]], before: float = float("inf")) -> Failure | None:
    """The earliest first-traceback of any rank (raised before `before`: after a stall, the
    teardown's); a consequence error loses a tie (same ms)."""
    firsts = [found[0] for found in per_rank.values() if found and found[0].time < before]
    if not firsts:
        return None
    best = min(firsts, key=lambda t: (t.time, _consequence(t), t.rank))
    return Failure(best.rank, best.time, best.exception, best.text)


def silent_failure(per_rank: dict[int, list[Traceback]], ended: RankExit | None,
                   lines: dict[int, list[Line]]) -> Failure | None:
    """The rank mpirun saw end first, when it left no traceback and no rank raised first for a
    reason of its own (only "connection closed"-style consequences, or nothing). A rank that
    exited with STOP_EXIT stopped on purpose: no failure."""
    if ended is None or ended.stopped or per_rank.get(ended.rank):
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


def stop_summary(window: list[dict], ended: RankExit | None) -> dict | None:
    """A run that stopped on purpose, from its events: the ranks' agreed stop (`stop_saved`), a
    stop signal the driver got, an ending the driver counted as a stop; or mpirun reporting
    STOP_EXIT. With the reason, the step saved at, and how the run ended."""
    saved, asked = events.last(window, events.STOP_SAVED), events.last(window, events.STOP_REQUESTED)
    end = events.ending(window)
    if not (saved or asked or events.ended_by_stop(end) or (ended is not None and ended.stopped)):
        return None
    reason = saved.get("reason") if saved else asked.get("reason") if asked else None
    return {"reason": reason, "step": saved.get("step") if saved else None,
            "ending": events.ending_words(end) or "not recorded (the driver may still be running)",
            "detail": end.get("reason") if end else None}


def recorded_stall(window: list[dict], lines: dict[int, list[Line]], begin: float = 0.0) -> dict | None:
    """The watchdog's last `ranks_stalled` of the run, each rank with the stacks it dumped.
    begin: the run's start; no rank was idle for longer than the run had run."""
    found = events.last(window, events.RANKS_STALLED)
    if found is None:
        return None
    end = events.ending(window)
    ranks = [_with_stacks(dict(rank), lines) for rank in found.get("ranks") or []]
    for rank in ranks:
        if isinstance(rank.get("idle_seconds"), (int, float)) and begin and found.get("time"):
            rank["idle_seconds"] = round(min(rank["idle_seconds"], found["time"] - begin), 1)
    return {"source": "driver", "time": found.get("time"), "why": found.get("why", "?"),
            "standing": str(found.get("standing", Standing.TRAINING)),
            "idle_seconds": found.get("idle_seconds"), "ranks": ranks,
            "ending": events.ending_words(end), "detail": end.get("reason") if end else None,
            "was_requeued": events.was_requeued(end), "restarted": events.was_restarted(end),
            "time_limit": events.ended_by_time_limit(end)}


def live_stall(beats: dict[int, heartbeat.Beat], history: list[dict], now: float,
               lines: dict[int, list[Line]]) -> dict | None:
    """Ranks holding a RUNNING run now, from its heartbeats (health.stalled_now, as `status`)."""
    launched = events.start_time(history)
    setting = events.stall_seconds(history, DEFAULT_STALL_SECONDS)
    start = events.start_seconds(history, heartbeat.AUTO_START_SECONDS)
    held = health.stalled_now(beats, events.world_size(history), launched, now, setting, start)
    stall_seconds = heartbeat.stall_bound(setting, beats.values(), start, events.world_size(history) or 0, now)
    if not held:
        return None
    newest = max([b.progress for b in beats.values()] + [launched])
    return {"source": "heartbeats", "time": now,
            "why": f"no rank progressed for {now - newest:.0f} s or a rank stopped beating "
                   f"(launch.stall_seconds={stall_seconds:g}); still running",
            "idle_seconds": round(now - newest, 1),
            "ranks": [_with_stacks(asdict(rank), lines) for rank in held],
            "ending": None, "detail": None, "was_requeued": False, "restarted": False,
            "time_limit": False}


def _with_stacks(rank: dict, lines: dict[int, list[Line]]) -> dict:
    rank.setdefault("state", None)
    rank["stacks"] = stack_dump(lines.get(rank.get("rank"), []))
    return rank


def stall_signature(stall: dict) -> dict:
    """The stall as the first signature: what the driver did, the ranks, where to look."""
    ranks = "; ".join(_rank_words(r) for r in stall["ranks"]) or "no rank named"
    if stall["source"] == "heartbeats":
        return _signature("a rank is not progressing (the run is still running)",
                          f"{STALL_LIVE}; {STALL_ADVICE}", "heartbeats", f"{stall['why']}; {ranks}")
    line = stall["why"]
    if stall["ending"]:
        line += f"; then {stall['ending']}"
    if stall["time_limit"]:
        line += " (Slurm's time limit ended the job: a consequence of the stall)"
    line += f"; {ranks}"
    done = STALL_DONE
    if stall["ending"] and not (stall["was_requeued"] or stall["restarted"]):
        done = (f"the driver tore the ranks down; the job was not requeued "
                f"({stall['detail'] or stall['ending']})")
    return _signature(_STALL_SIGNATURE.title, f"{done}; {STALL_ADVICE}", EVENTS_FILE, line)


def _rank_words(rank: dict) -> str:
    state = f", state {rank['state']}" if rank.get("state") else ""
    return (f"rank {rank.get('rank')} on {rank.get('host') or '?'} pid {rank.get('pid') or '?'} "
            f"step {rank.get('step')} ({rank.get('phase') or '?'}{state}): {rank.get('why')}")


def _signature(title: str, fix: str, source: str, line: str) -> dict:
    return {"id": _STALL_SIGNATURE.id, "title": title, "fix": fix, "source": source,
            "line": line[:300], "file": None}


def driver_logs(paths: RunPaths, job_id: str | None) -> list[Path]:
    """The driver's output: submitit's logs of this job (all jobs if unknown) and a rendered
    script's batch output."""
    pattern = f"{job_id}_*" if job_id else "*"
    found = [p for p in sorted(paths.submitit.glob(pattern)) if p.suffix in (".out", ".err")]
    return found + sorted(paths.root.glob(paths.slurm_output(job_id or "*").name))


def diagnose(paths: RunPaths, run: int | None = None, slurm: Job | None = None,
             now: float | None = None) -> Diagnosis:
    """run: index of the run to look at (default: the last one); now: the clock, for a live
    stall of a running run."""
    history = events.read(paths)
    starts = events.run_starts(history)
    index = logs.resolve_run(-1 if run is None else run, starts)
    begin, end = events.run_window(starts, index)
    window = events.in_window(history, begin, end)
    lines: dict[int, list[Line]] = {}
    rank_logs = logs.rank_logs(paths)
    for rank, log in rank_logs.items():
        lines[rank] = list(logs.in_run(logs.read_rank(log), starts, index))
    per_rank = {rank: tracebacks(found) for rank, found in lines.items()}
    started = events.named(history, events.STARTED)
    job_id = started[index].get("job_id") if index < len(started) else None
    driver = list(_driver_lines(paths, job_id))
    ended = next((e for e in rank_exits(driver) if _exit_in_run(e, starts, index)), None)
    torn_down = recorded_stall(window, lines, begin)     # by the driver's watchdog
    # Ranks it ended after a stop that came too early for them to obey, or that they had saved
    # and were exiting from (job/watchdog.py: Standing): part of the stop, not a stall.
    stall = torn_down if torn_down and torn_down["standing"] == Standing.TRAINING else None
    running = (slurm.state if slurm else events.state(history)) == "RUNNING"
    raised = any(per_rank.values())     # a rank that raised explains more than the heartbeats
    if (stall is None and running and not raised and starts and index == len(starts) - 1
            and events.ending(window) is None):
        clock = time.time() if now is None else now
        stall = live_stall(heartbeat.read_beats(paths.heartbeat, starts[-1]), history, clock, lines)
    stop = stop_summary(window, ended)
    if torn_down is not None:
        # The teardown ends the ranks: mpirun's report and later tracebacks are its doing.
        traced, silent = first_failure(per_rank, before=torn_down["time"] or float("inf")), None
    else:
        traced = first_failure(per_rank)
        silent = None if stop else silent_failure(per_rank, ended, lines)
    names = {rank: log.name for rank, log in rank_logs.items()}
    signatures = [_describe(m) for m in match_signatures(_signature_lines(driver, lines, names, slurm, window))]
    if stall is not None:
        if stall["source"] == "driver" and any(s["id"] == "slurm_time_limit" for s in signatures):
            stall["time_limit"] = True
        signatures = [stall_signature(stall)] + [s for s in signatures if s["id"] not in _AFTER_A_STALL]
    stalled = {r for found in lines.values() for r in missing_ranks(line.text for line in found)}
    stalled |= {r["rank"] for r in (stall or {}).get("ranks", []) if isinstance(r.get("rank"), int)}
    failed_events = events.named(window, events.RANK_FAILED)   # the first is the cause as a rank saw it
    failure = silent or traced
    if failure is not None:
        failure.host = rank_host(lines.get(failure.rank, [])) or (ended.node if ended else None)
    return Diagnosis(run=index, runs=max(1, len(starts)), first_failure=failure,
                     event_rank=failed_events[0].get("rank") if failed_events else None,
                     signatures=signatures, stalled_ranks=sorted(stalled),
                     failed_ranks=sorted(r for r, t in per_rank.items() if t),
                     found_by=ended.launcher if silent else "traceback" if traced else None,
                     launcher=None if ended is None else {
                         "rank": ended.rank, "how": ended.how, "source": ended.source,
                         "line": ended.line[:300], "hint": exit_hint(ended.how)},
                     stop=stop, stall=stall)


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
                     names: dict[int, str], slurm: Job | None, window: list[dict]):
    if slurm is not None:
        yield "sacct", f"State={slurm.label}"
    yield from driver
    for rank, found in lines.items():
        name = names[rank]
        for line in found:
            yield name, line.text
    for error in events.checkpoint_errors(window):     # a checkpoint that did not load
        for text in error.splitlines():
            yield EVENTS_FILE, text
    for lost in events.named(window, events.NODE_LOST):  # the driver's verdict: a node died
        yield EVENTS_FILE, f"node_lost: {', '.join(lost.get('nodes') or ['?'])} ({lost.get('why')})"


def _describe(match: Match) -> dict:
    sig = match.signature
    return {"id": sig.id, "title": sig.title, "fix": sig.fix, "source": match.source,
            "line": match.line[:300], "file": match.file}

"""Text for people: rich tables and colours on a terminal, plain `key: value` lines when piped."""

from __future__ import annotations

import sys

from hpc_train.inspection.diagnose import Diagnosis
from hpc_train.inspection.launcher import LAUNCHERS, STOPPED_ON_PURPOSE
from hpc_train.inspection.summary import RunStatus

_STATE_STYLE = {"RUNNING": "green", "COMPLETED": "bold green", "PENDING": "yellow",
                "REQUEUED": "yellow", "FAILED": "bold red", "TIMEOUT": "red", "CANCELLED": "red",
                "NODE_FAIL": "red", "OUT_OF_MEMORY": "red", "STOPPED": "yellow"}


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    seconds = round(seconds)
    if seconds < 60:
        return f"{seconds}s"
    minutes, seconds = divmod(seconds, 60)
    if minutes < 60:
        return f"{minutes}m{seconds:02d}s"
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m"


def _num(value: float | None, spec: str = ".4g") -> str:
    return "-" if value is None else format(value, spec)


def counts_by_cause(per_cause: dict[str, int]) -> str:
    """"3  (failure 2, stall 1)", or "0"."""
    total = sum(per_cause.values())
    return f"{total}  ({', '.join(f'{c} {n}' for c, n in sorted(per_cause.items()))})" if total else "0"


def status_rows(s: RunStatus) -> list[tuple[str, str]]:
    steps = "-" if s.step is None else f"{s.step}/{s.total_steps or '?'}"
    if s.epoch is not None:
        steps += f"  epoch {s.epoch}"
    flow = "-"
    if s.throughput:
        flow = f"{s.throughput.recent:,.0f} recent, {s.throughput.mean:,.0f} mean {s.throughput.unit}"
    requeues = str(s.requeues) + (f"  ({'; '.join(s.requeue_reasons)})" if s.requeue_reasons else "")
    ckpt = "-" if s.checkpoint_step is None else \
        f"step {s.checkpoint_step}, {duration(s.checkpoint_age_seconds)} ago"
    rows = [("run", s.name), ("job", s.job_id or "-"), ("state", f"{s.state}  (from {s.state_source})"),
            ("requeues", requeues), ("stops", counts_by_cause(s.stops).replace("_", " ")),
            ("restarts", f"{counts_by_cause(s.restarts_in_job)} in the job"),
            ("step", steps), ("loss", _num(s.loss)),
            ("accuracy", _num(s.accuracy, ".3f")), ("lr", _num(s.lr)), ("throughput", flow)]
    if s.efficiency is not None:
        rows.append(("scaling", f"{s.efficiency:.0%} of {s.world_size} x the baseline per rank"))
    if s.slowest:
        rows.append(("slowest", slowest_words(s.slowest)))
    rows += [("eta", duration(s.eta_seconds)), ("checkpoint", ckpt), ("health", s.health.message)]
    if s.lost_nodes:
        rows.append(("nodes", "; ".join(f"{node} not responding or down (Slurm: {state})"
                                        for node, state in sorted(s.lost_nodes.items()))))
    if s.diagnosis and (stop := s.diagnosis.get("stop")):
        rows.append(("stopped", stop_words(stop)))
    if s.diagnosis and (stall := s.diagnosis.get("stall")) and stall.get("source") == "driver":
        rows.append(("stall", f"{stall['why']}: rank(s) {[r.get('rank') for r in stall['ranks']]}"))
    if s.diagnosis and (failure := s.diagnosis.get("first_failure")):
        rows.append(("failure", f"rank {failure['rank']}: {failure['exception']}"))
    for sig in (s.diagnosis or {}).get("signatures", []):
        rows.append(("signature", f"{sig['title']}: {sig['fix']}"))
    rows += [(view.tracker, view.command) for view in s.trackers if view.command]
    return rows


def slowest_words(slowest: dict) -> str:
    """The slowest rank's comparison, marked when it is over launch.straggler_warn."""
    over = f"  STRAGGLER (over launch.straggler_warn={slowest['warn']:g})" if slowest["over"] else ""
    return slowest["words"] + over


def _console(out):
    from rich.console import Console

    return Console(file=out or sys.stdout, highlight=False)


def print_status(statuses: list[RunStatus], out=None) -> None:
    console = _console(out)
    for s in statuses:
        rows = status_rows(s)
        if not console.is_terminal:
            console.file.write("".join(f"{k + ':':<12}{v}\n" for k, v in rows) + "\n")
            continue
        from rich.table import Table

        table = Table(show_header=False, title=s.name, title_justify="left")
        table.add_column(style="bold")
        table.add_column()
        for key, value in rows:
            style = _STATE_STYLE.get(s.state, "") if key == "state" else \
                ("red" if key in ("failure", "health") and value not in ("ok", "not running") else
                 "yellow" if key == "slowest" and s.slowest["over"] else "")
            table.add_row(key, value, style=style)
        console.print(table)


def print_table(header, rows, styles=None, title: str | None = None, out=None):
    """`rows` under `header`: a rich table on a terminal (`styles`: one per row), else
    tab-separated lines, the title first. Returns the console, for what follows the table."""
    console = _console(out)
    if not console.is_terminal:
        lines = [*([title] if title else []), "\t".join(header), *("\t".join(row) for row in rows)]
        console.file.write("".join(line + "\n" for line in lines))
        return console
    from rich.table import Table

    table = Table(*header, title=title, title_justify="left")
    for row, style in zip(rows, styles or [""] * len(rows)):
        table.add_row(*row, style=style)
    console.print(table)
    return console


def print_runs(statuses: list[RunStatus], out=None) -> None:
    """`status --all`: one line per run."""
    header = ("run", "job", "state", "step", "loss", "throughput", "eta", "health")
    rows = [(s.name, s.job_id or "-", s.state,
             "-" if s.step is None else f"{s.step}/{s.total_steps or '?'}", _num(s.loss),
             f"{s.throughput.recent:,.0f} {s.throughput.unit}" if s.throughput else "-",
             duration(s.eta_seconds), s.health.message) for s in statuses]
    print_table(header, rows, [_STATE_STYLE.get(s.state, "") for s in statuses], out=out)


def stop_words(stop: dict) -> str:
    """"SIGUSR2 at step 40 (saved); then requeued (cause stop, by driver)": a stop, no failure."""
    what = stop.get("reason") or "a stop"
    if stop.get("step") is not None:
        what += f" at step {stop['step']} (checkpoint saved)"
    words = f"on purpose: {what}; then {stop.get('ending')}"
    return words + (f": {stop['detail']}" if stop.get("detail") else "")


def _stall_lines(stall: dict) -> list[str]:
    if stall["source"] == "driver":
        lines = [f"stalled: {stall['why']} (the driver's watchdog; idle {duration(stall.get('idle_seconds'))})"]
    else:
        lines = [f"stalled now (from the heartbeats, the run is still running): {stall['why']}"]
    for rank in stall["ranks"]:
        state = f", process state {rank['state']}" if rank.get("state") else ""
        lines.append(f"  rank {rank.get('rank')} on {rank.get('host') or '?'} pid {rank.get('pid') or '?'}"
                     f" at step {rank.get('step')} (phase {rank.get('phase') or '?'}){state}, "
                     f"{duration(rank.get('idle_seconds'))} without progress: {rank.get('why')}")
        if rank.get("stacks"):
            lines.append(f"  its stacks (the last dump in rank {rank.get('rank')}'s log of this run):")
            lines += ["    " + text for text in rank["stacks"].splitlines()]
        else:
            lines.append("  no stack dump in its log (a frozen or stopped process cannot write one;"
                         " a stuck one writes it after half of launch.stall_seconds)")
    if stall.get("ending"):
        lines.append(f"then: {stall['ending']}" + (f" ({stall['detail']})" if stall.get("detail") else ""))
    return lines + [""]


def diagnosis_text(d: Diagnosis) -> str:
    lines = [f"run {d.run} of runs 0..{d.runs - 1} (--run K picks another)"]
    if d.stop:
        lines.append(f"stopped {stop_words(d.stop)}")
        lines.append("this is not a failure: the ranks saved and exited on purpose")
    if d.stall:
        lines += _stall_lines(d.stall)
    if d.first_failure:
        f = d.first_failure
        how = ("first traceback by time in the rank logs" if d.found_by == "traceback" else
               f"it left no traceback; {d.found_by} named it in the driver log")
        where = f" on {f.host}" if f.host else ""
        lines.append(f"first failed rank: {f.rank}{where} ({how})")
        lines.append(f"exception: {f.exception}")
        if d.found_by in LAUNCHERS:
            lines.append(f"hint: {d.launcher['hint']}")
        if d.event_rank is not None:
            agree = "agrees" if d.events_agree else f"DISAGREES: event names rank {d.event_rank}"
            lines.append(f"rank_failed event: {agree}")
        if len(d.failed_ranks) > 1:
            lines.append(f"ranks with a traceback: {d.failed_ranks}")
        lines.append("")
        if d.found_by in LAUNCHERS:
            lines.append(f"the last lines of rank {f.rank}'s log:")
        lines += [f.traceback, ""]
    elif not d.stop and not d.stall:
        lines.append("no traceback in the rank logs")
    if d.launcher and d.found_by not in LAUNCHERS:
        why = ""
        if d.launcher["how"] == STOPPED_ON_PURPOSE:
            why = " = STOP_EXIT, stopped on purpose"
        elif d.stall and d.stall["source"] == "driver":
            why = ", in the driver's teardown of the stalled ranks"
        lines.append(f"mpirun: rank {d.launcher['rank']} ended first, {d.launcher['how']}{why} "
                     f"({d.launcher['source']})")
    if d.stalled_ranks and not d.stall:
        lines.append(f"stalled rank(s) {d.stalled_ranks}: the others waited for them at a collective")
    for sig in d.signatures:
        lines.append(f"* {sig['title']} [{sig['id']}]  ({sig['source']}: {sig['line'][:160]})")
        if sig.get("file"):
            lines.append(f"  file: {sig['file']}")
        lines.append(f"  fix: {sig['fix']}")
    if not (d.signatures or d.first_failure or d.stalled_ranks or d.stop or d.stall):
        lines.append("no known failure signature found")
    return "\n".join(lines)

"""`report` for people: a rich summary table, the segments and the restarts on a terminal;
plain `key: value` lines when piped (the same rows)."""

from __future__ import annotations

from datetime import datetime

from hpc_train.inspection.efficiency import IN_JOB, RESUME
from hpc_train.inspection.text import _STATE_STYLE, _console, counts_by_cause, duration, slowest_words
from hpc_train.inspection.report import Report

_GIB = 1024 ** 3


def _size(value: int | None) -> str:
    return "-" if value is None else f"{value / _GIB:.2f} GiB"


def _clock(t: float | None) -> str:
    return "running" if t is None else datetime.fromtimestamp(t).strftime("%Y-%m-%d %H:%M:%S")


def summary_rows(r: Report) -> list[tuple[str, str]]:
    u = r.usage
    resumes = sum(1 for x in r.restarts if x.kind == RESUME)
    source = "" if u.source == "sacct" else f"  (estimate: {u.source})"
    rows = [("run", r.run), ("jobs", ", ".join(r.job_ids) or "-"),
            ("segments", f"{len(r.windows)}  ({r.requeues} requeue(s)"
             + (f", {resumes} resubmission(s)" if resumes else "") + ")"),
            ("stops", counts_by_cause(r.stops).replace("_", " ")),
            ("restarts in job", counts_by_cause(r.restarts_in_job)),
            ("core-hours", f"{u.core_hours:.4f}{source}"), ("GPU-hours", f"{u.gpu_hours:.4f}{source}"),
            ("CPU efficiency", "-" if u.cpu_efficiency is None else
             f"{u.cpu_efficiency:.1%}  (TotalCPU / elapsed x allocated CPUs)")]
    memory = _size(u.peak_rss)
    if u.peak_rss is not None and u.req_mem:
        memory += f" of {_size(u.req_mem)} requested per node ({u.peak_rss / u.req_mem:.0%})"
    rows.append(("peak memory", memory))
    if r.gpu:
        rows.append(("GPU utilisation", f"{r.gpu['mean_util']:.0f}% mean over {r.gpu['samples']} samples "
                     f"of {r.gpu['gpus']} GPU(s)"))
        rows.append(("GPU memory", f"{_size(r.gpu['peak_mem'])} peak of {_size(r.gpu['mem_total'])}"))
    else:
        rows.append(("GPU utilisation", "not sampled"))
    trained = "-" if r.samples is None else f"{r.samples:,} ({r.last_step} steps x {r.samples_per_step})"
    rows.append((f"{r.sample_name} trained", trained))
    rate = r.samples_per_hour
    rows.append((f"{r.sample_name} per {rate[1] if rate else 'hour'}", "-" if rate is None else f"{rate[0]:,.0f}"))
    lost = r.lost_seconds
    redone = sum(x.redone_steps or 0 for x in r.restarts)
    rows += [("checkpoint saves", f"{r.checkpoint_saves} in {duration(r.checkpoint_seconds)} "
              f"({r.checkpoint_seconds:.1f} s)"),
             ("lost to restarts", f"{duration(lost['queue_wait'])} queue wait + "
              f"{duration(lost['startup'])} start-up + {duration(lost['redone_steps'])} redoing "
              f"{redone} step(s)"),
             ("slowest rank", slowest_words(r.slowest) if r.slowest else "-"),
             ("straggler warnings", str(r.straggler_warnings)),
             ("timeline", r.timeline or "-")]
    return rows


def segment_rows(r: Report) -> list[tuple[str, ...]]:
    return [(str(k), w.job_id or "-", w.state, _clock(w.start), _clock(w.end), duration(w.elapsed(r.now)),
             "-" if w.cpus is None else str(w.cpus), "-" if w.gpus is None else str(w.gpus))
            for k, w in enumerate(r.windows)]


def restart_rows(r: Report) -> list[tuple[str, ...]]:
    return [(f"in {x.after}" if x.kind == IN_JOB else f"{x.after} -> {x.after + 1}",
             x.kind + (f" ({x.cause})" if x.cause else ""), duration(x.wait),
             duration(x.startup), f"{x.last_step} -> {x.resumed_step if x.resumed_step is not None else '?'}",
             "-" if x.redone_steps is None else f"{x.redone_steps} ({duration(x.redone_seconds)})",
             duration(x.lost)) for x in r.restarts]


SEGMENT_HEADER = ("#", "job", "state", "start", "end", "elapsed", "CPUs", "GPUs")
RESTART_HEADER = ("segments", "kind", "wait", "start-up", "step before -> after", "redone", "lost")


def print_report(r: Report, out=None) -> None:
    console = _console(out)
    summary, segments, restarts = summary_rows(r), segment_rows(r), restart_rows(r)
    if not console.is_terminal:
        text = "".join(f"{k + ':':<24}{v}\n" for k, v in summary)
        for header, rows in ((SEGMENT_HEADER, segments), (RESTART_HEADER, restarts)):
            if rows:
                text += "\n" + "\t".join(header) + "\n" + "".join("\t".join(row) + "\n" for row in rows)
        text += "".join(f"not known: {line}\n" for line in r.unknown)
        console.file.write(text)
        return
    from rich.table import Table

    table = Table(show_header=False, title=f"report {r.run}", title_justify="left")
    table.add_column(style="bold")
    table.add_column()
    for key, value in summary:
        table.add_row(key, value)
    console.print(table)
    for title, header, rows in (("segments", SEGMENT_HEADER, segments),
                                ("restarts", RESTART_HEADER, restarts)):
        if rows:
            part = Table(*header, title=title, title_justify="left")
            for row in rows:
                part.add_row(*row, style=_STATE_STYLE.get(row[2], "") if title == "segments" else "")
            console.print(part)
    for line in r.unknown:
        console.print(f"[yellow]not known:[/yellow] {line}")

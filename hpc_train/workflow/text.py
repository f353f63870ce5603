"""Text for people: `workflow status` as one rich table (tab-separated lines when piped), and the
stage graph of a dry run."""

from __future__ import annotations

from hpc_train.inspection.text import duration, print_table
from hpc_train.workflow import graph
from hpc_train.workflow.status import StageStatus, WorkflowStatus

STYLE = {"COMPLETED": "green", "RUNNING": "cyan", "PENDING": "yellow", "FAILED": "bold red",
         "TIMEOUT": "red", "OUT_OF_MEMORY": "red", "NODE_FAIL": "red", "CANCELLED": "red"}
HEADER = ("stage", "kind", "state", "job", "elapsed", "metric", "detail")


def _metric(name: str | None, value: float | None) -> str:
    return "-" if value is None else f"{name} {value:.4f}"


def _detail(s: StageStatus) -> str:
    parts = [s.failure and f"failed: {s.failure}", s.reason]
    if s.kind == "train" and len(s.run_dirs) == 1:
        parts.append(s.run_dirs[0])
    if s.kind == "evaluate" and s.run_dirs:
        parts.append(f"on {s.run_dirs[0]}")
    if s.best is not None:
        parts.append(f"best: member {s.best}")
    return "; ".join(p for p in parts if p)


def rows(status: WorkflowStatus) -> list[tuple[tuple[str, ...], str]]:
    """(cells, state) per line: stages, each sweep's members under it (ranked, 1 = best)."""
    out = []
    for s in status.stages:
        out.append(((s.name, s.kind, s.state, ",".join(s.job_ids) or "-", duration(s.elapsed),
                     _metric(s.metric_name, s.metric), _detail(s)), s.state))
        for m in s.members:
            rank = f"#{m.rank}" if m.rank else ""
            detail = "; ".join(p for p in (m.failure and f"failed: {m.failure}", m.reason,
                                           m.label, m.run_dir) if p)
            out.append(((f"  [{m.index}] {rank}".rstrip(), "member", m.state, m.job_id or "-",
                         duration(m.elapsed), _metric(s.metric_name, m.metric), detail), m.state))
    return out


def footer(status: WorkflowStatus) -> list[str]:
    lines = []
    if status.failed_stage:
        stage = next(s for s in status.stages if s.name == status.failed_stage)
        lines.append(f"failed stage: {stage.name}" + (f" ({stage.failure})" if stage.failure else ""))
        lines.append(f"after fixing it: python -m hpc_train workflow resume {status.dir}")
    if status.submission_error:
        lines.append(f"submission failed midway: {status.submission_error}")
    if status.executor == "local":
        lines.append("ran here with the local executor (no Slurm)")
    return lines


def print_status(status: WorkflowStatus, out=None) -> None:
    lines = rows(status)
    console = print_table(HEADER, [cells for cells, _ in lines], [STYLE.get(state, "") for _, state in lines],
                          f"workflow {status.name}: {status.dir}", out)
    for line in footer(status):
        if console.is_terminal:
            console.print(line, style="bold red" if line.startswith("failed") else "")
        else:
            console.file.write(line + "\n")


def graph_text(needs: graph.Needs, after_any: dict[str, list[str]], jobs: dict[str, list[str]]) -> str:
    """The stage graph by depth: each stage with what it waits for and its jobs."""
    lines = ["stage graph (each stage waits for the ones after <-):"]
    for depth, names in enumerate(graph.layers(needs)):
        for name in names:
            waits = [f"{b} (any end)" if b in after_any.get(name, []) else b for b in needs[name]]
            arrow = f" <- {', '.join(waits)}" if waits else ""
            lines.append(f"  {'  ' * depth}{name}{arrow}   [{'; '.join(jobs[name])}]")
    return "\n".join(lines)

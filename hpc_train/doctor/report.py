"""Run the doctor's checks and show them: a rich table on a terminal, plain text or JSON otherwise."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

from hpc_train.argtypes import print_result
from hpc_train.doctor.checks import ALL_CHECKS, Check, Status

_COLOURS = {Status.OK: "green", Status.WARN: "yellow", Status.FAIL: "bold red"}


def run_checks(checks=ALL_CHECKS) -> list[Check]:
    # The slow checks wait on subprocesses (torch import, mpirun, sinfo): run them side by side.
    with ThreadPoolExecutor(max_workers=len(checks)) as pool:
        return [row for rows in pool.map(lambda check: check(), checks) for row in rows]


def exit_code(rows: list[Check]) -> int:
    return 1 if any(row.status is Status.FAIL for row in rows) else 0


def as_json(rows: list[Check]) -> str:
    counts = {s.value: sum(r.status is s for r in rows) for s in Status}
    return json.dumps({"ok": exit_code(rows) == 0, "counts": counts,
                       "checks": [r.to_dict() for r in rows]}, indent=2)


def as_text(rows: list[Check]) -> str:
    width = max(len(r.name) for r in rows)
    lines = []
    for r in rows:
        lines.append(f"{r.status.value:<4}  {r.name:<{width}}  {r.detail}")
        if r.fix:
            lines.append(f"{'':<4}  {'':<{width}}  fix: {r.fix}")
    return "\n".join(lines)


def print_table(rows: list[Check]) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title="hpc_train doctor")
    for column in ("check", "status", "detail", "fix"):
        table.add_column(column, overflow="fold")
    for r in rows:
        colour = _COLOURS[r.status]
        table.add_row(r.name, f"[{colour}]{r.status.value}[/]", r.detail, r.fix)
    Console().print(table)


def main(json_output: bool) -> int:
    rows = run_checks()
    print_result(json_output, as_json(rows), lambda: print_table(rows), lambda: as_text(rows))
    return exit_code(rows)

"""Show a `doctor --allocation` report (compare.compare's dict): a rich table on a terminal,
plain text in a pipe, JSON on request. One column per node, so a differing value stands out in
its row; the problems, then the one-line verdict, come last, where a terminal leaves the eye."""

from __future__ import annotations

import json
from collections.abc import Mapping

from hpc_train.argtypes import print_result
from hpc_train.doctor.compare import FACTS, describe


def _rank_cells(entry: Mapping) -> tuple[str, str]:
    """(MASTER_ADDR, allreduce) for one node, over its ranks."""
    ranks = len(entry["ranks"])
    if not entry["master"]:
        return "no report", "no report"
    reached = sum(entry["master"])
    master = "reached" if reached == ranks else f"FAIL ({ranks - reached} of {ranks} ranks)"
    times = entry["allreduce"]
    if len(times) < ranks or any(t is None for t in times):
        allreduce = "FAIL"
    else:
        allreduce = f"ok, {max(times) * 1e3:.2f} ms"
    return master, allreduce


def rows(report: Mapping) -> tuple[list[str], list[list[tuple[str, bool]]]]:
    """(column headers, rows of (text, bad) cells): one row per fact, one column per node."""
    nodes = report["nodes"]
    header = ["check", *(f"{n['node']} (rank{'s' * (len(n['ranks']) > 1)} "
                         f"{','.join(map(str, n['ranks']))})" for n in nodes)]
    table = []
    for fact in FACTS:
        table.append([(fact, False), *((n["facts"].get(fact, "no report"),
                                        fact in n["differs"] or not n["facts"]) for n in nodes)])
    cells = [_rank_cells(n) for n in nodes]
    for index, name in enumerate(("MASTER_ADDR", "allreduce")):
        table.append([(name, False), *((c[index], not c[index].startswith(("reached", "ok")))
                                       for c in cells)])
    return header, table


def as_text(report: Mapping) -> str:
    """Columns aligned with spaces; a bad cell ends in " !"."""
    lines = []
    if report["nodes"]:
        header, table = rows(report)
        texts = [header, *([text + (" !" if bad else "") for text, bad in row] for row in table)]
        widths = [max(len(row[i]) for row in texts) for i in range(len(header))]
        lines = ["  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in texts]
    return "\n".join([*lines, *(f"problem: {describe(p)}" for p in report["problems"]),
                      report["verdict"]])


def print_table(report: Mapping) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = Console()
    if report["nodes"]:
        header, table = rows(report)
        grid = Table(title="hpc_train doctor --allocation")
        for column in header:
            grid.add_column(escape(column), overflow="fold")
        for row in table:
            grid.add_row(*(f"[bold red]{escape(text)}[/]" if bad else escape(text) for text, bad in row))
        console.print(grid)
    for problem in report["problems"]:
        console.print(f"[bold red]problem[/] {escape(describe(problem))}")
    colour = "green" if report["ok"] else "bold red"
    console.print(f"[{colour}]{escape(report['verdict'])}[/]")


def show(report: Mapping, json_output: bool) -> int:
    print_result(json_output, json.dumps(report, indent=2), lambda: print_table(report), lambda: as_text(report))
    return 0 if report["ok"] else 1

"""`logs`: per-rank logs of a run directory, one run (start or restart) at a time, merged by time.

Rank logs are appended across requeues and resumes. A run begins at each `started` event (the
driver writes it just before mpirun starts the ranks), so a line belongs to the last run that
started before its timestamp: no marker in the log is needed.
"""

from __future__ import annotations

import heapq
import re
import sys
import time
from collections.abc import Iterable, Iterator
from pathlib import Path

from hpc_train import events
from hpc_train.errors import InspectError
from hpc_train.inspection.logparse import Line, run_index, timed_lines
from hpc_train.rundir import RANK_LOG, RunPaths


def rank_logs(paths: RunPaths) -> dict[int, Path]:
    found = {}
    if paths.logs.is_dir():
        for path in paths.logs.iterdir():
            if match := RANK_LOG.fullmatch(path.name):
                found[int(match.group(1))] = path
    return dict(sorted(found.items()))


def resolve_run(run: int | None, starts: list[float]) -> int | None:
    """--run K (negative: from the end) -> a run index; None = every run."""
    if run is None:
        return None
    count = max(1, len(starts))
    if not -count <= run < count:
        raise InspectError(f"--run {run}: this run directory has {count} run(s): 0..{count - 1} "
                           "(or -1 for the last)")
    return run % count


def read_rank(path: Path, rank: int) -> list[Line]:
    return list(timed_lines(rank, path.read_text(errors="replace").splitlines()))


def in_run(lines: Iterable[Line], starts: list[float], run: int | None) -> Iterator[Line]:
    if run is None:
        yield from lines
        return
    for line in lines:
        if run_index(line.time, starts) == run:
            yield line


def merged(per_rank: list[Iterable[Line]]) -> Iterator[Line]:
    """Lines of several ranks in time order; a rank's own lines keep their file order."""
    return heapq.merge(*per_rank, key=lambda line: line.time)


def select(paths: RunPaths, ranks: list[int] | None, run: int | None,
           pattern: str | None = None) -> Iterator[Line]:
    """The lines `logs` prints: chosen ranks (None = all), one run or all, filtered by a regex."""
    files = rank_logs(paths)
    if not files:
        raise InspectError(f"{paths.logs}: no rank logs (has the job started?)")
    chosen = sorted(files) if ranks is None else ranks
    missing = [r for r in chosen if r not in files]
    if missing:
        raise InspectError(f"no log for rank(s) {missing}; ranks with logs: {sorted(files)}")
    starts = events.run_starts(events.read(paths))
    index = resolve_run(run, starts)
    streams = [in_run(read_rank(files[r], r), starts, index) for r in chosen]
    lines = streams[0] if len(streams) == 1 else merged(streams)
    if pattern:
        regex = _compile(pattern)
        lines = (line for line in lines if regex.search(line.text))
    return lines


def _compile(pattern: str) -> re.Pattern:
    try:
        return re.compile(pattern)
    except re.error as exc:
        raise InspectError(f"--grep {pattern!r}: not a regular expression ({exc})") from None


def format_line(line: Line, prefix: bool) -> str:
    return f"[rank {line.rank}] {line.text}" if prefix else line.text


def write(lines: Iterable[Line], prefix: bool, out=None) -> int:
    """Print lines in blocks (one write per thousand lines keeps 100k lines well under a second)."""
    out = out or sys.stdout
    count, block = 0, []
    for line in lines:
        block.append(format_line(line, prefix))
        count += 1
        if len(block) >= 1000:
            out.write("\n".join(block) + "\n")
            block = []
    if block:
        out.write("\n".join(block) + "\n")
    return count


def follow(paths: RunPaths, ranks: list[int] | None, pattern: str | None, prefix: bool,
           interval: float = 0.5) -> None:
    """Print lines as the ranks append them (new rank logs included) until interrupted."""
    regex = _compile(pattern) if pattern else None
    offsets = {rank: path.stat().st_size for rank, path in rank_logs(paths).items()}
    partial: dict[int, str] = {}
    while True:
        for rank, path in rank_logs(paths).items():
            if ranks is not None and rank not in ranks:
                continue
            with open(path, "rb") as handle:
                handle.seek(offsets.get(rank, 0))
                chunk = handle.read().decode(errors="replace")
                offsets[rank] = handle.tell()
            *complete, partial[rank] = (partial.get(rank, "") + chunk).split("\n")
            for text in complete:
                if regex is None or regex.search(text):
                    sys.stdout.write(format_line(Line(0.0, rank, text), prefix) + "\n")
        sys.stdout.flush()
        time.sleep(interval)

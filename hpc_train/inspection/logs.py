"""`logs`: per-rank logs of a run directory, one run (start or restart) at a time, merged by time.

A rank's lines are in its own file, logs/rank-N.log, or in its node's, logs/node-<host>.log,
each line there prefixed "[rank N] " (log.rank_logs: per_node, runtime/node_log.py); `RankLog`
reads either as the rank's own stream. Rank logs are appended across requeues and resumes. A run
begins at each `started` event (the driver writes it just before mpirun starts the ranks), so a
line belongs to the last run that started before its timestamp: no marker in the log is needed.
"""

from __future__ import annotations

import functools
import heapq
import re
import sys
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from hpc_train import events
from hpc_train.errors import InspectError
from hpc_train.inspection.logparse import Line, run_index, timed_lines
from hpc_train.rundir import NODE_LOG, RANK_LOG, RunPaths
from hpc_train.runtime.node_log import split_node_log

TAIL_BYTES = 64 * 1024     # of each log file: a running job's stall warning is near the end


@dataclass(frozen=True)
class RankLog:
    """Where one rank's lines are: its own files, and its part of node logs (prefix removed)."""
    rank: int
    own: tuple[Path, ...] = ()
    nodes: tuple[Path, ...] = ()

    @property
    def name(self) -> str:
        """The file to name for the rank's lines (its own, else its node's)."""
        return (self.own or self.nodes)[0].name

    def texts(self) -> list[str]:
        found = [t for path in self.own for t in path.read_text(errors="replace").splitlines()]
        return found + [t for path in self.nodes for t in _node_ranks(path, _version(path)).get(self.rank, [])]


def _version(path: Path) -> tuple[int, int]:
    stat = path.stat()
    return stat.st_size, stat.st_mtime_ns


@functools.lru_cache(maxsize=16)
def _node_ranks(path: Path, version: tuple[int, int]) -> dict[int, list[str]]:
    """A node log split into its ranks' lines, read once per version of the file."""
    return split_node_log(path.read_text(errors="replace").splitlines())


def rank_logs(paths: RunPaths) -> dict[int, RankLog]:
    """Every rank with lines in the run directory, rank files and node logs alike."""
    own: dict[int, list[Path]] = {}
    nodes: dict[int, list[Path]] = {}
    for path in _log_files(paths):
        if match := RANK_LOG.fullmatch(path.name):
            own.setdefault(int(match.group(1)), []).append(path)
            continue
        for rank in _node_ranks(path, _version(path)):
            nodes.setdefault(rank, []).append(path)
    return {rank: RankLog(rank, tuple(own.get(rank, ())), tuple(nodes.get(rank, ())))
            for rank in sorted(own.keys() | nodes.keys())}


def tails(paths: RunPaths, limit: int = TAIL_BYTES) -> Iterator[list[str]]:
    """The last lines of each rank's stream, from the last `limit` bytes of each log file."""
    for path in _log_files(paths):
        if RANK_LOG.fullmatch(path.name):
            yield _tail(path, limit)
        elif NODE_LOG.fullmatch(path.name):
            yield from split_node_log(_tail(path, limit)).values()


def _tail(path: Path, limit: int) -> list[str]:
    with open(path, "rb") as handle:
        handle.seek(max(0, path.stat().st_size - limit))
        return handle.read().decode(errors="replace").splitlines()


def resolve_run(run: int | None, starts: list[float]) -> int | None:
    """--run K (negative: from the end) -> a run index; None = every run."""
    if run is None:
        return None
    count = max(1, len(starts))
    if not -count <= run < count:
        raise InspectError(f"--run {run}: this run directory has {count} run(s): 0..{count - 1} "
                           "(or -1 for the last)")
    return run % count


def read_rank(log: RankLog) -> list[Line]:
    return list(timed_lines(log.rank, log.texts()))


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
    streams = [in_run(read_rank(files[r]), starts, index) for r in chosen]
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
    """Print lines as the ranks append them (new rank and node logs included) until interrupted."""
    regex = _compile(pattern) if pattern else None
    offsets = {path: path.stat().st_size for path in _log_files(paths)}
    partial: dict[Path, str] = {}
    while True:
        for path in _log_files(paths):
            with open(path, "rb") as handle:
                handle.seek(offsets.get(path, 0))
                chunk = handle.read().decode(errors="replace")
                offsets[path] = handle.tell()
            *complete, partial[path] = (partial.get(path, "") + chunk).split("\n")
            for line in _stream_lines(path, complete):
                if (ranks is None or line.rank in ranks) and (regex is None or regex.search(line.text)):
                    sys.stdout.write(format_line(line, prefix) + "\n")
        sys.stdout.flush()
        time.sleep(interval)


def _log_files(paths: RunPaths) -> list[Path]:
    if not paths.logs.is_dir():
        return []
    # Files only: anything else of the name (a directory after a damaged copy) is no log.
    return sorted(p for p in paths.logs.iterdir()
                  if (RANK_LOG.fullmatch(p.name) or NODE_LOG.fullmatch(p.name)) and p.is_file())


def _stream_lines(path: Path, texts: list[str]) -> Iterator[Line]:
    """New lines of a rank log or a node log, each with its rank (no time: `follow` prints)."""
    if match := RANK_LOG.fullmatch(path.name):
        yield from (Line(0.0, int(match.group(1)), text) for text in texts)
        return
    for rank, found in split_node_log(texts).items():
        yield from (Line(0.0, rank, text) for text in found)

"""Pure parsing of rank logs: timestamps, tracebacks, stack dumps of stuck ranks, and which run
a line belongs to.

A rank log line from the worker's logging format starts with `2026-11-29 18:17:53,607 rank 0 ...`.
Lines without a timestamp (traceback frames, output of C libraries) belong to the last
timestamped line before them, so they take its time.
"""

from __future__ import annotations

import bisect
import re
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from hpc_train.runtime.heartbeat import STACK_DUMP_HEADER

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
_TRACEBACK = "Traceback (most recent call last):"
_ORIGINAL = "Original Traceback (most recent call last):"     # torch's re-raise of a worker's
_CAUGHT = re.compile(r"Caught \w+ in (DataLoader worker process \d+)")
# What faulthandler writes for each thread: a heading, frames, "..." past 100 frames, blank lines.
_DUMP_LINE = re.compile(r'^((Current thread|Thread) 0x[0-9a-fA-F]+ \(most recent call first\):'
                        r'|Stack \(most recent call first\):|\s+File ".*", line \d+ in .*'
                        r'|\s+<no Python frame>|\s+\.\.\.|\s*)$')
_DUMP_LINES = 2000


@dataclass(frozen=True)
class Line:
    time: float      # UNIX seconds; 0.0 before the first timestamped line of a file
    rank: int
    text: str


def stamp_time(text: str) -> float | None:
    """The local-time asctime of a log line as UNIX seconds, or None without one."""
    match = _STAMP.match(text)
    if not match:
        return None
    try:
        base = time.mktime(time.strptime(match.group(1), "%Y-%m-%d %H:%M:%S"))
    except ValueError:
        return None
    return base + int(match.group(2)) / 1000


def timed_lines(rank: int, texts: Iterable[str]) -> Iterator[Line]:
    current = 0.0
    second, second_time = "", 0.0      # lines of one busy second share the costly strptime
    for text in texts:
        if text[:2] == "20" and _STAMP.match(text):
            if text[:19] != second:
                second, second_time = text[:19], stamp_time(text) - int(text[20:23]) / 1000
            current = second_time + int(text[20:23]) / 1000
        yield Line(current, rank, text)


# The worker's first line: "rank 1/2 (local 0) pid 7 on n2, code /runs/x/code/hpc_train".
_RANK_START = re.compile(r" rank \d+/\d+ \(local \d+\) pid \d+ on ([^\s,]+)")


def rank_host(lines: Iterable[Line]) -> str | None:
    """The node a rank ran on, from the worker's first line (see _RANK_START)."""
    return next((match.group(1) for line in lines if (match := _RANK_START.search(line.text))), None)


def run_index(line_time: float, starts: list[float]) -> int:
    """Which run (0-based index into the sorted `started` event times) a line belongs to."""
    return max(0, bisect.bisect_right(starts, line_time) - 1)


@dataclass(frozen=True)
class Traceback:
    rank: int
    time: float
    text: str          # the whole block, "Traceback ..." through the exception line
    exception: str     # the last line: "RuntimeError: ..."


def tracebacks(lines: Iterable[Line]) -> list[Traceback]:
    """Every Python traceback block in one rank's lines, in file order.

    A block runs from "Traceback (most recent call last):" through the first unindented line
    (the exception). A chained exception ("During handling of the above...") is its own block.
    An exception that torch re-raised from a DataLoader worker ("Caught DataError in DataLoader
    worker process 0." then "Original Traceback (most recent call last):") runs on through the
    worker's own traceback, whose exception line (the one naming the file) becomes `exception`.
    """
    found: list[Traceback] = []
    block: list[Line] = []
    ended = False            # the block has its exception line, unless an original one follows
    for line in lines:
        if ended:
            if line.text.startswith(_ORIGINAL):
                block.append(line)
                ended = False
                continue
            found.append(_block(block))
            block, ended = [], False
        if not block:
            if line.text.startswith(_TRACEBACK):
                block = [line]
            continue
        block.append(line)
        if not (line.text.startswith((" ", "\t")) or not line.text.strip()):
            ended = True
    if block:
        found.append(_block(block))
    return found


def _block(block: list[Line]) -> Traceback:
    exception = block[-1].text
    for i, line in enumerate(block):
        if line.text.startswith(_ORIGINAL) and i and (where := _CAUGHT.search(block[i - 1].text)):
            exception += f" (raised in {where.group(1)})"
            break
    return Traceback(block[0].rank, block[0].time, "\n".join(b.text for b in block), exception)


def stack_dump(lines: Iterable[Line]) -> str | None:
    """The last stack dump a stuck rank wrote (runtime/heartbeat.py): the STACK_DUMP_HEADER line
    and faulthandler's stacks of every thread after it, up to the first line of anything else."""
    dump: list[str] | None = None
    current: list[str] | None = None
    for line in lines:
        if line.text.startswith(STACK_DUMP_HEADER):
            current = [line.text]
            dump = current
        elif current is not None and len(current) < _DUMP_LINES and _DUMP_LINE.match(line.text):
            current.append(line.text)
        else:
            current = None
    if dump is None:
        return None
    while dump and not dump[-1].strip():
        dump.pop()
    return "\n".join(dump)

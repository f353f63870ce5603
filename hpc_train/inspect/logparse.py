"""Pure parsing of rank logs: timestamps, tracebacks, and which run a line belongs to.

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

_STAMP = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) ")
_TRACEBACK = "Traceback (most recent call last):"


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
    """
    found: list[Traceback] = []
    block: list[Line] = []
    for line in lines:
        if not block:
            if line.text.startswith(_TRACEBACK):
                block = [line]
            continue
        block.append(line)
        if line.text.startswith((" ", "\t")) or not line.text.strip():
            continue
        found.append(_block(block))
        block = []
    if block:
        found.append(_block(block))
    return found


def _block(block: list[Line]) -> Traceback:
    return Traceback(block[0].rank, block[0].time, "\n".join(b.text for b in block), block[-1].text)

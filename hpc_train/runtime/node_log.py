"""Per-node logs (`log.rank_logs: per_node`): each rank writes its output to a file on the node;
the node's writer appends the new complete lines of all of them, each prefixed "[rank N] ", to
one log on the shared file system, in one write per interval.

Exactly once, across kills: the offsets gathered so far are kept in the node's state
(node-local, written whole by rename). Before the append the state records the append it is
about to make (where the node log ends now and where it will end); after it, the new offsets.
A gatherer killed in between leaves that record, and the next one settles it from the node
log's size: grown to the end -> the lines are out, take the new offsets; not grown -> they are
not, gather them again; torn in the middle -> cut back, gather again. So no line is written
twice and none is lost while any rank of the node lives. A whole node that dies loses what its
ranks wrote since the last gather: at most one interval of lines (and a partial last line).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import Enum
from pathlib import Path

from hpc_train.rundir import write_atomic
from hpc_train.runtime.node_local import NodeLocal

PER_NODE_ABOVE = 64            # log.rank_logs: auto -> per_node for more ranks than this
RANK_LOGS_ENV = "HPC_TRAIN_RANK_LOGS"   # set by the driver: per_rank | per_node
_PREFIX = re.compile(r"\[rank (\d+)\] ")


class RankLogs(str, Enum):
    """Where a rank's output goes (log.rank_logs)."""
    AUTO = "auto"
    PER_RANK = "per_rank"      # logs/rank-N.log on the shared file system, one file per rank
    PER_NODE = "per_node"      # logs/node-<host>.log, gathered on the node

    def __str__(self) -> str:
        return self.value


def rank_logs_mode(setting: str, world_size: int) -> RankLogs:
    """log.rank_logs for a start of `world_size` ranks: auto is per_rank up to PER_NODE_ABOVE
    ranks (every file at hand for small runs), per_node above."""
    mode = RankLogs(setting)
    if mode is RankLogs.AUTO:
        return RankLogs.PER_RANK if world_size <= PER_NODE_ABOVE else RankLogs.PER_NODE
    return mode


def prefix(rank: int) -> bytes:
    return f"[rank {rank}] ".encode()


def complete_lines(data: bytes, flush: bool = False) -> tuple[bytes, int]:
    """The whole lines of `data` (up to its last newline) and the bytes they take; with `flush`,
    all of it, a partial last line ended with a newline (a rank that will write no more)."""
    end = data.rfind(b"\n") + 1
    if flush and end < len(data):
        return data + b"\n", len(data)
    return data[:end], end


def prefixed(rank: int, lines: bytes) -> bytes:
    """Whole lines -> the same lines, each starting with "[rank N] "."""
    head = prefix(rank)
    return b"".join(head + line + b"\n" for line in lines.split(b"\n")[:-1])


def split_node_log(texts: Iterable[str]) -> dict[int, list[str]]:
    """A node log's lines -> each rank's own lines, in order, prefix removed. A line without
    the prefix (a damaged file) is skipped."""
    ranks: dict[int, list[str]] = {}
    for text in texts:
        if match := _PREFIX.match(text):
            ranks.setdefault(int(match.group(1)), []).append(text[match.end():])
    return ranks


def node_log_ranks(texts: Iterable[str]) -> set[int]:
    """The ranks that have lines in a node log."""
    return {int(m.group(1)) for text in texts if (m := _PREFIX.match(text))}


@dataclass
class GatherState:
    """The node's gathering state (NodeLocal.state): the log offsets gathered, the append in
    progress, and when the node's heartbeat file was last written (node_beats.py)."""
    offsets: dict[int, int] = field(default_factory=dict)
    pending: dict | None = None          # {"offsets", "start", "end"}: an append under way
    beats_written: float = 0.0           # the last write of the node's heartbeat file
    final_closed: list[int] = field(default_factory=list)  # closed ranks at the last final write

    @classmethod
    def read(cls, path: Path) -> GatherState:
        try:
            record = json.loads(path.read_text())
            return cls({int(r): int(o) for r, o in record.get("offsets", {}).items()},
                       record.get("pending"), float(record.get("beats_written", 0.0)),
                       [int(r) for r in record.get("final_closed", [])])
        except (OSError, ValueError, TypeError, AttributeError):
            return cls()

    def write(self, path: Path) -> None:
        write_atomic(path, json.dumps({"offsets": self.offsets, "pending": self.pending,
                                       "beats_written": self.beats_written,
                                       "final_closed": self.final_closed}).encode(), durable=False)


def settle(state: GatherState, target: Path) -> None:
    """Finish or undo the append a killed gatherer left (see the module's docstring)."""
    pending, state.pending = state.pending, None
    if not pending:
        return
    size = target.stat().st_size if target.exists() else 0
    if size >= pending["end"]:
        state.offsets = {int(r): int(o) for r, o in pending["offsets"].items()}
    elif size > pending["start"]:
        os.truncate(target, pending["start"])


def new_lines(local: NodeLocal, offsets: Mapping[int, int], flush: set[int]) -> tuple[bytes, dict[int, int]]:
    """Every rank's whole lines past its offset, prefixed, and the offsets after them (ranks in
    `flush` give their partial last line too)."""
    block, after = [], dict(offsets)
    for path in sorted(local.root.glob("rank-*.log")):
        rank = int(path.name[5:10])
        try:
            with open(path, "rb") as handle:
                start = offsets.get(rank, 0)
                if os.fstat(handle.fileno()).st_size < start:
                    start = 0           # a new file in place of the one gathered
                handle.seek(start)
                lines, used = complete_lines(handle.read(), flush=rank in flush)
        except OSError:
            continue
        if lines:
            block.append(prefixed(rank, lines))
            after[rank] = start + used
    return b"".join(block), after


def gather(local: NodeLocal, state: GatherState, target: Path, flush: Iterable[int] = ()) -> int:
    """Append the node's new lines to `target` in one write, exactly once; the caller holds
    the node's lock. Returns the bytes appended; when they are more than none, `state` is
    written back (else the caller writes it)."""
    settle(state, target)
    block, after = new_lines(local, state.offsets, set(flush))
    if not block:
        return 0
    fd = os.open(target, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        start = os.fstat(fd).st_size
        state.pending = {"offsets": after, "start": start, "end": start + len(block)}
        state.write(local.state)
        written = os.write(fd, block)
    finally:
        os.close(fd)
    if written == len(block):
        state.offsets, state.pending = after, None
    else:
        settle(state, target)      # torn: cut back; the lines go out next time
    state.write(local.state)
    return written

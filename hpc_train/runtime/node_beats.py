"""One shared-file-system write per node per interval: the node's writer gathers its ranks'
beats (and, with log.rank_logs: per_node, their lines) from the node-local directory.

Each rank's heartbeat thread writes its own beat to the node-local directory (node_local.py),
then asks `elect_writer` who writes for the node: the lowest rank of the node whose own beat is
fresh (written within `silent_after(interval)`) and that has not closed. That rank writes
heartbeat/node-<host>.json on the shared file system, whole (a temporary file renamed):

    {"host", "writer": its rank, "time": when written,
     "beats": [every local rank's beat record, each with its own "time"]}

So a frozen rank shows its own stale time; a frozen writer's beat goes stale and the next
fresh rank takes over within `silent_after` plus an interval; a dead node's file goes stale with
all its ranks in it. Under the node's lock the writer skips a write less than an interval after
the last one (two ranks that both think they write, at a hand-over, still make one write); when
the lock cannot be had (its holder frozen) it writes the beats anyway and leaves the logs.

At its close a rank marks itself closed; the last rank of the node to close (no other rank
there fresh and open) writes the node's file and lines one last time and removes the
node-local directory. A rank that closes while others live leaves its last beat and lines to
their writer.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from hpc_train.rundir import parse_json, write_atomic
from hpc_train.runtime.heartbeat import silent_after
from hpc_train.runtime.node_local import NodeLocal
from hpc_train.runtime.node_log import GatherState, gather

LOCK_SECONDS = 1.0        # the longest a rank waits for the node's lock
_EARLY = 1e-3             # clock jitter allowed in "an interval since the last write"


def elect_writer(times: Mapping[int, float], closed: set[int], now: float, silent: float) -> int | None:
    """The rank that writes for the node: the lowest whose beat (times: rank -> when its beat
    was written) is fresh, i.e. younger than `silent` seconds, and that has not closed; None when
    there is none."""
    fresh = [rank for rank, written in times.items() if now - written < silent and rank not in closed]
    return min(fresh, default=None)


def node_record(host: str, writer: int, now: float, beats: list[dict]) -> dict:
    return {"host": host, "writer": writer, "time": now, "beats": beats}


def read_local_beats(local: NodeLocal) -> dict[int, dict]:
    """The node-local beats, by rank (a half-written or foreign file is skipped)."""
    beats = {}
    for path in local.beat_files():
        try:
            record = parse_json(path.read_text())
            beats[int(record["rank"])] = record
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return beats


@dataclass
class NodeWriter:
    """A rank's part in writing for its node: `tick` after each of its beats, `close` last."""
    local: NodeLocal
    rank: int
    host: str
    beats_file: Path                 # RUN/heartbeat/node-<host>.json
    interval: float
    log_file: Path | None = None     # RUN/logs/node-<host>.log, with log.rank_logs: per_node
    clock: Callable[[], float] = time.time
    lock_seconds: float = LOCK_SECONDS
    closed: bool = field(default=False, init=False)

    def tick(self) -> bool:
        """Write for the node if this rank is its writer and an interval has passed since the
        last write; returns whether it wrote. Never raises OSError (a full disk must not kill
        the rank: the watchdog then sees the node's beats go stale)."""
        try:
            beats = read_local_beats(self.local)
            now = self.clock()
            times = {rank: float(b.get("time", 0.0)) for rank, b in beats.items()}
            if elect_writer(times, self.local.closed_ranks(), now, silent_after(self.interval)) != self.rank:
                return False
            with self.local.lock(self.lock_seconds) as held:
                if not held:
                    self._write_beats(read_local_beats(self.local), now)
                    return True
                state = GatherState.read(self.local.state)
                if now - state.beats_written < self.interval - _EARLY:
                    return False
                self._write(state, now, flush=self.local.closed_ranks())
                return True
        except OSError:
            return False

    def close(self) -> bool:
        """Mark this rank closed; the node's last rank writes once more and removes the
        node-local directory. Returns whether it wrote."""
        if self.closed:
            return False
        self.closed = True
        try:
            self.local.closed(self.rank).touch()
            with self.local.lock(self.lock_seconds) as held:
                return held and self._close_locked()
        except OSError:
            return False     # the directory is gone: the node's last rank gathered us

    def _close_locked(self) -> bool:
        now = self.clock()
        times = {rank: float(b.get("time", 0.0)) for rank, b in read_local_beats(self.local).items()}
        closed = self.local.closed_ranks()
        if elect_writer(times, closed, now, silent_after(self.interval)) is not None:
            return False     # a live rank of the node writes within an interval, us included
        state = GatherState.read(self.local.state)
        wrote = self.rank not in state.final_closed
        if wrote:
            state.final_closed = sorted(closed)
            self._write(state, now, flush=set(times) | closed)
        if closed >= set(times):
            self.local.remove()
        return wrote

    def _write(self, state: GatherState, now: float, flush: set[int]) -> None:
        """The node's heartbeat file and, with per_node logs, its new lines (lock held)."""
        self._write_beats(read_local_beats(self.local), now)
        state.beats_written = now
        if self.log_file is None or not gather(self.local, state, self.log_file, flush):
            state.write(self.local.state)      # (a gather that appended wrote it)

    def _write_beats(self, beats: dict[int, dict], now: float) -> None:
        """The node's file, whole; never none: a tick that read the node-local directory just
        after the node's last rank removed it must not empty the final file."""
        if not beats:
            return
        record = node_record(self.host, self.rank, now, [beats[r] for r in sorted(beats)])
        self.beats_file.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(self.beats_file, json.dumps(record).encode(), durable=False)

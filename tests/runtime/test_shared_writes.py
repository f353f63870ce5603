"""The kernel counts our shared-file-system writes (tests/inotify.py): a simulated 512 nodes of 2
ranks, each rank beating and logging on its node, make at most one heartbeat write and one log
write per node per interval, through a writer frozen and handed over and a node that dies."""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest

from hpc_train.job import watchdog
from hpc_train.rundir import host_file_name
from hpc_train.runtime.heartbeat import read_beats
from hpc_train.runtime.node_local import node_local_base
from tests import inotify
from tests.runtime.test_node_beats import Clock, make_node

NODES = 512
ROUNDS = 13             # intervals: more than silent_after(1 s) = 10, for the hand-over
FROZEN_WRITER = 7       # node whose writer (its rank 0) freezes after the first round
DEAD = 9                # node that dies after the second round


@pytest.fixture
def memory_dir(tmp_path):
    """Node-local directories in memory, as on a node (/dev/shm; tmp_path where it is missing)."""
    base = node_local_base({"TMPDIR": str(tmp_path)})
    made = Path(tempfile.mkdtemp(prefix="hpc_train-test-", dir=base))
    yield made
    shutil.rmtree(made, ignore_errors=True)


def test_512_nodes_write_at_most_once_per_node_per_interval(tmp_path, memory_dir):
    clock = Clock()
    nodes = [make_node(tmp_path, f"sim{n:03d}", [2 * n, 2 * n + 1], clock, log=True, local_base=memory_dir)
             for n in range(NODES)]
    paths = nodes[0][0]
    paths.make_dirs()
    watch = inotify.Watch(paths.heartbeat, paths.logs)
    beats_per_round, logs_per_round = [], []
    try:
        for round_ in range(ROUNDS):
            clock.now += 1.0            # the interval, 1 s at launch.stall_seconds 10
            beats, lines = Counter(), Counter()
            for n, (_, local, node) in enumerate(nodes):
                if n == DEAD and round_ > 1:
                    continue
                for rank, (beat, writer) in node.items():
                    if n == FROZEN_WRITER and rank == 2 * n and round_ > 0:
                        continue
                    with open(local.log(rank), "a") as out:
                        print(f"round {round_} rank {rank}", file=out)
                    beat.write()
                    writer.tick()
                    events = watch.events()     # drained after each tick: no event merged away
                    beats.update(inotify.count(events, inotify.IN_MOVED_TO))
                    lines.update(inotify.count(events, inotify.IN_MODIFY))
            beats_per_round.append(beats)
            logs_per_round.append(lines)
    finally:
        watch.close()
    node_files = {f"node-{host_file_name(f'sim{n:03d}')}.json" for n in range(NODES)}
    for round_, (beats, lines) in enumerate(zip(beats_per_round, logs_per_round)):
        assert set(beats) <= node_files, f"round {round_}: other files written: {set(beats) - node_files}"
        assert max(beats.values()) == 1 and max(lines.values()) == 1, f"round {round_}"
        assert not any(name.startswith("rank-") for name in lines)
    assert sum(beats_per_round[0].values()) == NODES
    # every live node wrote every interval, except the frozen writer's until the hand-over
    frozen = f"node-sim{FROZEN_WRITER:03d}.json"
    silent_rounds = [r for r, beats in enumerate(beats_per_round) if frozen not in beats]
    assert silent_rounds and silent_rounds == list(range(1, silent_rounds[-1] + 1)) and silent_rounds[-1] <= 11
    assert all(len(beats) == NODES - (r > 1) - (frozen not in beats) for r, beats in enumerate(beats_per_round))
    beats = read_beats(paths.heartbeat)
    assert len(beats) == 2 * NODES
    named = watchdog.culprits(beats, 2 * NODES, clock.now, 1.0, launched=0.0)
    assert [r.rank for r in named] == [2 * FROZEN_WRITER, 2 * DEAD, 2 * DEAD + 1]
    gathered = paths.node_log(f"sim{FROZEN_WRITER:03d}").read_text().splitlines()
    assert gathered.count(f"[rank {2 * FROZEN_WRITER + 1}] round {ROUNDS - 2} rank {2 * FROZEN_WRITER + 1}") == 1

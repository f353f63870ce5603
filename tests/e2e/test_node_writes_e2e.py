"""Real jobs on the 8-node cluster, 8 nodes x 1 rank and 4 nodes x 2 ranks (two ranks per node
elect the node's writer): the kernel (inotify, tests/inotify.py) counts what the ranks write into
the run directory's heartbeat/ and logs/ over the whole run.

With log.rank_logs=per_node every node makes at most one heartbeat write and one log write per
beat interval (the node's writer: its lowest fresh rank), nothing per rank, plus the last rank's
final write; the node-local directories are gone afterwards; and status, logs (--rank, --grep)
and diagnose read the node files and node logs as before.

"Per beat interval" is counted, not timed: the kernel's count of a node's writes against the
beats its ranks' heartbeat threads counted themselves (each beat record's `beat`). A slow host
makes fewer beats and as many fewer writes; a writer per rank makes a write per rank per beat.
"""

from __future__ import annotations

import json
import threading
from collections import Counter, defaultdict
from pathlib import Path

import pytest

from hpc_train.inspection import logs
from hpc_train.rundir import RunPaths
from hpc_train.runtime.heartbeat import beat_interval, read_beats
from tests import inotify
from tests.runs import NO_WORKERS, cli, describe_failure, submit

pytestmark = [pytest.mark.multinode, pytest.mark.slurm, pytest.mark.mpi, pytest.mark.slow]

# launch.stall_seconds: a 5 s beat interval. It bounds start-up too: 8 ranks importing torch on
# 2 cores took over 21 s to their first beat's progress, and 20 s failed the job three times.
STALL = 60.0
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


class Recorder:
    """inotify events of heartbeat/ and logs/, drained every 50 ms: the kernel merges identical
    unread events, and a write per rank would come within milliseconds of the writer's."""

    def __init__(self, *directories: Path):
        self.watch = inotify.Watch(*directories)
        self.seen: list[inotify.Event] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            self.seen += self.watch.events()

    def close(self) -> list[inotify.Event]:
        self.stop.set()
        self.thread.join(5)
        self.seen += self.watch.events()
        self.watch.close()
        return self.seen


def _writes(seen: list[inotify.Event], directory: Path, mask: int) -> Counter:
    return inotify.count([e for e in seen if e.directory == directory], mask)


def _beats_per_node(paths: RunPaths) -> dict[str, int]:
    """Host -> the most beats a rank of it counted (its last record, in the node's final file):
    the intervals the node lived, by its ranks' own clocks."""
    found = {}
    for path in paths.heartbeat.glob("node-*.json"):
        node = json.loads(path.read_text())
        assert path == paths.node_heartbeat(node["host"]), path
        found[node["host"]] = max(int(record["beat"]) for record in node["beats"])
    return found


# A node's writes beside one per beat of its writer: the writer's tick at its start, before its
# thread's first beat; the final write of the node's last rank at its close; and one for a
# hand-over (a rank that outlives the writer writes at its own beats, counted from its own start).
SLACK = 3


def _assert_once_per_beat(writes: Counter, beats: dict[str, int], file_of, what: str) -> None:
    """At most one write of each node's file per beat of its ranks (the writer writes after one
    of its own beats; the other ranks' beats write nothing), whatever the ranks per node."""
    for host, beaten in beats.items():
        count = writes[file_of(host).name]
        assert 0 < count <= beaten + SLACK, f"{what} of {host}: {count} writes in {beaten} beats"


# 4x2 once ended with ranks 0-1 missing from read_beats: two writers of one file shared a temporary
# name, so one renamed the other's half-written file into place (rundir.write_atomic now gives each
# process and thread its own; tests/runtime/test_node_beats.py races them).
# CI runs 4x2, where two ranks of a node elect its writer; 8x1 (eight nodes, one writer each)
# with --heavy.
@pytest.mark.parametrize("nodes, per_node", [pytest.param(8, 1, marks=pytest.mark.heavy), (4, 2)],
                         ids=["8x1", "4x2"])
def test_a_job_writes_once_per_node_per_interval_and_stays_readable(slurm_nodes, tmp_path, nodes, per_node):
    interval = beat_interval(STALL)
    # Directories of this name left by another cluster's job of the same id (each cluster numbers
    # its jobs from 1; a killed or preempted job leaves its own): not this job's to remove.
    before = set(Path("/dev/shm").glob("hpc_train-*"))
    job_id, paths = submit("jobs/smoke.yaml", tmp_path, "run.name=node-writes", NO_WORKERS,
                           f"slurm.nodes={nodes}", f"slurm.tasks_per_node={per_node}",
                           "parallel.backend=ddp", "launch.method=mpirun", f"launch.stall_seconds={STALL:g}",
                           "log.rank_logs=per_node", "optim.max_steps=30", "log.every_steps=5",
                           "checkpoint.every_steps=1000", env=slurm_nodes.env)
    slurm_nodes.job_ids.append(job_id)
    recorder = Recorder(paths.heartbeat, paths.logs)
    try:
        state = slurm_nodes.wait_state(job_id, ENDED, timeout=900)
    finally:
        seen = recorder.close()
    assert state == "COMPLETED", describe_failure(paths)

    beats = _writes(seen, paths.heartbeat, inotify.IN_MOVED_TO)
    created = {e.name for e in seen if e.mask & inotify.IN_CREATE}
    assert len(beats) == nodes and all(n.startswith("node-") for n in beats), sorted(beats)
    assert not [n for n in created if n.startswith(("rank-", ".rank-"))], sorted(created)
    beaten = _beats_per_node(paths)
    assert len(beaten) == nodes, beaten
    _assert_once_per_beat(beats, beaten, paths.node_heartbeat, "heartbeat")
    lines = _writes(seen, paths.logs, inotify.IN_MODIFY)
    assert len(lines) == nodes and all(n.startswith("node-") for n in lines), sorted(lines)
    _assert_once_per_beat(lines, beaten, paths.node_log, "log")
    print(f"[node writes] {json.dumps(dict(sorted({**beats, **lines}.items())))} "
          f"in {json.dumps(dict(sorted(beaten.items())))} beats, interval {interval:g} s")

    found = read_beats(paths.heartbeat)
    assert sorted(found) == list(range(nodes * per_node))
    hosts = defaultdict(list)
    for rank, beat in found.items():
        hosts[beat.host].append(rank)
    assert len(hosts) == nodes and all(len(r) == per_node for r in hosts.values()), hosts
    # This job's hosts only: the single-node cluster numbers its jobs from 1 too, on host vm.
    left = [d for host in hosts for d in Path("/dev/shm").glob(f"hpc_train-{job_id}-{host}")
            if d not in before]
    assert not left, f"node-local directories left: {left}"

    streams = logs.rank_logs(paths)
    assert sorted(streams) == list(range(nodes * per_node))
    for rank, stream in streams.items():
        texts = stream.texts()
        stamped = [t for t in texts if t[:2] == "20"]
        assert len(stamped) == len(set(stamped)), f"rank {rank}: lines gathered twice"
        assert any(f"rank {rank} done" in t for t in texts), f"rank {rank}: last line not gathered"
    status = cli("status", str(paths.root), "--json", env=slurm_nodes.env)
    assert status.returncode == 0 and json.loads(status.stdout)["runs"][0]["state"] == "COMPLETED", status.stdout
    one = cli("logs", str(paths.root), "--rank", "5", "--grep", "rank 5", env=slurm_nodes.env)
    assert one.returncode == 0 and "rank 5 done" in one.stdout and "rank 4 " not in one.stdout, one.stdout
    every = cli("logs", str(paths.root), "--all-ranks", env=slurm_nodes.env)
    assert every.returncode == 0 and all(f"[rank {r}]" in every.stdout for r in range(nodes * per_node))
    diagnosis = cli("diagnose", str(paths.root), "--json", env=slurm_nodes.env)
    assert diagnosis.returncode == 0 and json.loads(diagnosis.stdout)["first_failure"] is None, diagnosis.stdout

"""Real jobs on the 8-node cluster, 8 nodes x 1 rank and 4 nodes x 2 ranks (two ranks per node
elect the node's writer): the kernel (inotify, tests/inotify.py) counts what the ranks write into
the run directory's heartbeat/ and logs/ over the whole run.

With log.rank_logs=per_node every node makes at most one heartbeat write and one log write per
beat interval (the node's writer: its lowest fresh rank), nothing per rank, plus the last rank's
final write; the node-local directories are gone afterwards; and status, logs (--rank, --grep)
and diagnose read the node files and node logs as before.
"""

from __future__ import annotations

import json
import threading
import time
from collections import defaultdict
from pathlib import Path

import pytest

from hpc_train.inspection import logs
from hpc_train.runtime.heartbeat import beat_interval, read_beats
from tests import inotify
from tests.runs import cli, describe_failure, submit

pytestmark = [pytest.mark.multinode, pytest.mark.slurm, pytest.mark.mpi, pytest.mark.slow]

# launch.stall_seconds: a 5 s beat interval. It bounds start-up too: 8 ranks importing torch on
# 2 cores took over 21 s to their first beat's progress, and 20 s failed the job three times.
STALL = 60.0
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


class Recorder:
    """inotify events of heartbeat/ and logs/ with the time each was read (every 50 ms)."""

    def __init__(self, *directories: Path):
        self.watch = inotify.Watch(*directories)
        self.seen: list[tuple[float, inotify.Event]] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stop.wait(0.05):
            now = time.time()
            self.seen += [(now, e) for e in self.watch.events()]

    def close(self) -> list[tuple[float, inotify.Event]]:
        self.stop.set()
        self.thread.join(5)
        self.watch.close()
        return self.seen


def _times(seen, directory: Path, mask: int) -> dict[str, list[float]]:
    found = defaultdict(list)
    for at, event in seen:
        if event.directory == directory and event.mask & mask:
            found[event.name].append(at)
    return found


def _assert_paced(times: dict[str, list[float]], interval: float, what: str) -> None:
    """Writes of each node file at least about an interval apart, but for the last (the node's
    final write at its last rank's close); the reading thread's 50 ms and a loaded host's
    scheduling make 'about': a second writer would write within milliseconds."""
    for name, at in times.items():
        gaps = [at[i + 1] - at[i] for i in range(len(at) - 2)]
        assert not gaps or min(gaps) >= 0.5 * interval, f"{what} {name}: writes {gaps} s apart"
        span = at[-2] - at[0] if len(at) > 1 else 0.0
        assert len(at) <= span / interval + 3, f"{what} {name}: {len(at)} writes in {span:.0f} s"


# 4x2 once ended with ranks 0-1 missing from read_beats: two writers of one file shared a temporary
# name, so one renamed the other's half-written file into place (rundir.write_atomic now gives each
# process and thread its own; tests/runtime/test_node_beats.py races them).
# CI runs 4x2, where two ranks of a node elect its writer; 8x1 (eight nodes, one writer each)
# with --heavy.
@pytest.mark.parametrize("nodes, per_node", [pytest.param(8, 1, marks=pytest.mark.heavy), (4, 2)],
                         ids=["8x1", "4x2"])
def test_a_job_writes_once_per_node_per_interval_and_stays_readable(slurm_nodes, tmp_path, nodes, per_node):
    interval = beat_interval(STALL)
    job_id, paths = submit("jobs/smoke.yaml", tmp_path, "run.name=node-writes",
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

    beats = _times(seen, paths.heartbeat, inotify.IN_MOVED_TO)
    created = {e.name for _, e in seen if e.mask & inotify.IN_CREATE}
    assert len(beats) == nodes and all(n.startswith("node-") for n in beats), sorted(beats)
    assert not [n for n in created if n.startswith(("rank-", ".rank-"))], sorted(created)
    _assert_paced(beats, interval, "heartbeat")
    lines = _times(seen, paths.logs, inotify.IN_MODIFY)
    assert len(lines) == nodes and all(n.startswith("node-") for n in lines), sorted(lines)
    _assert_paced(lines, interval, "log")
    print(f"[node writes] {json.dumps({n: len(t) for n, t in sorted({**beats, **lines}.items())})} "
          f"over {max(t[-1] for t in beats.values()) - min(t[0] for t in beats.values()):.0f} s, "
          f"interval {interval:g} s")

    found = read_beats(paths.heartbeat)
    assert sorted(found) == list(range(nodes * per_node))
    hosts = defaultdict(list)
    for rank, beat in found.items():
        hosts[beat.host].append(rank)
    assert len(hosts) == nodes and all(len(r) == per_node for r in hosts.values()), hosts
    # This job's hosts only: the single-node cluster numbers its jobs from 1 too, on host vm.
    left = [d for host in hosts for d in Path("/dev/shm").glob(f"hpc_train-{job_id}-{host}")]
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

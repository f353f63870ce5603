"""The node's writer: who writes for the node (a pure election), the hand-over from a frozen
writer, the node file's content, and the readers of node files and old rank files."""

from __future__ import annotations

import json

import pytest

from hpc_train.job import watchdog
from hpc_train.rundir import RunPaths
from hpc_train.runtime.heartbeat import Heartbeat, read_beats, silent_after
from hpc_train.runtime.node_beats import NodeWriter, elect_writer
from hpc_train.runtime.node_local import NodeLocal, job_key, node_local_base, node_local_dir, sweep_stale

SILENT = 10.0


@pytest.mark.parametrize("times, closed, writer", [
    ({}, set(), None),                                   # no beat yet
    ({0: 100.0, 1: 100.0}, set(), 0),                    # the lowest fresh rank
    ({0: 85.0, 1: 99.0, 2: 99.5}, set(), 1),             # rank 0 frozen: the next takes over
    ({0: 90.1, 1: 99.0}, set(), 0),                      # still fresh just inside the bound
    ({0: 90.0, 1: 99.0}, set(), 1),                      # stale at the bound
    ({0: 99.0, 1: 99.0}, {0}, 1),                        # rank 0 closed: not the writer any more
    ({3: 50.0, 7: 60.0}, set(), None),                   # a dead node: nobody writes
    ({5: 99.0, 2: 99.0}, set(), 2),                      # order of the mapping does not matter
])
def test_the_writer_is_the_lowest_fresh_open_rank(times, closed, writer):
    assert elect_writer(times, closed, now=100.0, silent=SILENT) == writer


class Clock:
    def __init__(self, now: float = 1000.0):
        self.now = now

    def __call__(self) -> float:
        return self.now


def make_node(tmp_path, host: str, ranks, clock, log: bool = False, interval_from: float = 10.0,
              local_base=None):
    """The ranks of one simulated node: (heartbeat, writer) per rank, threads not started; the
    node-local directories under `local_base` (default: beside the run directory)."""
    paths = RunPaths(tmp_path / "run")
    local = NodeLocal((local_base or tmp_path / "local") / host).make()
    node = {}
    for rank in ranks:
        beat = Heartbeat(local.beat(rank), rank, interval_from, clock=clock, host=host)
        writer = NodeWriter(local, rank, host, paths.node_heartbeat(host), beat.interval,
                            paths.node_log(host) if log else None, clock=clock)
        node[rank] = (beat, writer)
    return paths, local, node


def beat_round(node, ranks, clock, seconds: float = 1.0):
    """One interval of the given ranks: each writes its beat, then ticks; who wrote."""
    clock.now += seconds
    wrote = []
    for rank in ranks:
        beat, writer = node[rank]
        beat.write()
        if writer.tick():
            wrote.append(rank)
    return wrote


def test_a_frozen_writer_is_handed_over_and_keeps_its_own_stale_time(tmp_path):
    clock = Clock()
    paths, _, node = make_node(tmp_path, "n1", [0, 1, 2], clock)
    assert beat_round(node, [0, 1, 2], clock) == [0]
    frozen_at = clock.now
    rounds = [beat_round(node, [1, 2], clock) for _ in range(14)]      # rank 0 frozen
    silent = silent_after(1.0)
    assert all(r == [] for r in rounds[:int(silent) - 2])               # 0's beat still fresh
    handed = next(i for i, r in enumerate(rounds) if r)
    assert rounds[handed] == [1] and handed + 1 <= silent + 1           # within the bound plus one interval
    assert all(r == [1] for r in rounds[handed:])
    record = json.loads(paths.node_heartbeat("n1").read_text())
    assert record["host"] == "n1" and record["writer"] == 1 and record["time"] == clock.now
    # 2 beats after 1 wrote in the round: its beat in the file is one interval old
    assert {b["rank"]: b["time"] for b in record["beats"]} == {0: frozen_at, 1: clock.now, 2: clock.now - 1}
    beats = read_beats(paths.heartbeat)
    named = watchdog.culprits(beats, 3, clock.now, 1.0, launched=0.0)
    assert [r.rank for r in named] == [0] and "no heartbeat" in named[0].why


def test_two_ranks_that_both_think_they_write_make_one_write_an_interval(tmp_path):
    clock = Clock()
    _, _, node = make_node(tmp_path, "n1", [0, 1], clock)
    assert beat_round(node, [1], clock) == [1]                # rank 0 not started yet
    node[0][0].write()
    assert node[0][1].tick() is False                         # elected, but 1 wrote just now
    assert beat_round(node, [0, 1], clock) == [0]


def test_the_last_rank_to_close_writes_once_more_and_removes_the_node_dir(tmp_path):
    clock = Clock()
    paths, local, node = make_node(tmp_path, "n1", [0, 1], clock)
    beat_round(node, [0, 1], clock)
    clock.now += 0.2
    for rank in (0, 1):
        node[rank][0].step = 7
        node[rank][0].write()
    assert node[0][1].close() is False                        # rank 1 lives: it writes for 0 too
    assert local.root.is_dir()
    assert node[1][1].close() is True
    assert not local.root.exists()
    beats = read_beats(paths.heartbeat)
    assert {r: b.step for r, b in beats.items()} == {0: 7, 1: 7}


def test_a_dead_node_goes_stale_with_all_its_ranks(tmp_path):
    clock = Clock()
    paths, _, alive = make_node(tmp_path, "n1", [0, 1], clock)
    _, _, dead = make_node(tmp_path, "n2", [2, 3], clock)
    beat_round(alive, [0, 1], clock)
    dead[3][0].write()
    beat_round(dead, [2], clock, seconds=0.0)            # 2 writes both beats, then the node dies
    for _ in range(12):
        beat_round(alive, [0, 1], clock)
    named = watchdog.culprits(read_beats(paths.heartbeat), 4, clock.now, 1.0, launched=0.0)
    assert [(r.rank, r.host) for r in named] == [(2, "n2"), (3, "n2")]


def test_the_reader_takes_node_files_and_old_rank_files_the_latest_beat_winning(tmp_path):
    paths = RunPaths(tmp_path / "run")
    paths.make_dirs()
    beat = {"step": 3, "phase": "train", "progress": 5.0, "pid": 9, "host": "a"}
    paths.node_heartbeat("a").write_text(json.dumps({"host": "a", "writer": 0, "time": 20.0, "beats": [
        {**beat, "rank": 0, "time": 20.0}, {**beat, "rank": 1, "time": 12.0}, {"rank": "x"}]}))
    paths.node_heartbeat("b").write_text('{"host": "b", "beats": [{"rank": 2')     # torn
    paths.rank_heartbeat(1).write_text(json.dumps({**beat, "rank": 1, "time": 15.0}))  # an old run's
    paths.rank_heartbeat(3).write_text(json.dumps({**beat, "rank": 3, "time": 14.0}))
    beats = read_beats(paths.heartbeat)
    assert {r: b.time for r, b in beats.items()} == {0: 20.0, 1: 15.0, 3: 14.0}
    assert set(read_beats(paths.heartbeat, since=14.5)) == {0, 1}


def test_the_node_dir_is_named_by_job_and_host_and_falls_back_from_shm(tmp_path):
    run = tmp_path / "run"
    here = node_local_dir({"SLURM_JOB_ID": "77"}, run, "hpcn3", base=tmp_path)
    assert here == tmp_path / "hpc_train-77-hpcn3"
    assert node_local_dir({"SLURM_JOB_ID": "77"}, run, "hpcn4", base=tmp_path) != here
    assert job_key({}, run) == job_key({}, tmp_path / "." / "run") != job_key({}, tmp_path / "other")
    missing = tmp_path / "no-shm"
    assert node_local_base({"TMPDIR": str(tmp_path)}, shm=missing) == tmp_path
    assert str(node_local_base({}, shm=missing)) == "/tmp"


def test_a_start_removes_killed_jobs_leftovers_an_hour_old_and_nothing_else(tmp_path):
    import os
    now = 1_800_000_000.0
    mine = NodeLocal(tmp_path / "hpc_train-7-vm").make()
    old = NodeLocal(tmp_path / "hpc_train-5-vm").make()
    live = NodeLocal(tmp_path / "hpc_train-6-vm").make()
    other = tmp_path / "not-ours"
    other.mkdir()
    for local, age in ((mine, 7200), (old, 7200), (live, 10)):
        local.beat(0).write_text("{}")
        for path in (local.beat(0), local.root):
            os.utime(path, (now - age, now - age))
    os.utime(other, (now - 7200, now - 7200))
    assert sweep_stale(tmp_path, keep=mine.root, now=now) == [old.root]
    assert mine.root.is_dir() and live.root.is_dir() and other.is_dir() and not old.root.exists()


def test_writers_racing_on_one_file_never_leave_it_half_written(tmp_path):
    """A rank's loop and its heartbeat thread write its beat, and two ranks of a node can write
    the node's file at a hand-over: each through its own temporary file, so a reader sees one
    whole record or the other (with one shared temporary name, one writer renamed the other's
    half-written file into place)."""
    import threading

    from hpc_train.rundir import write_atomic

    path = tmp_path / "node-n1.json"
    write_atomic(path, b"{}", durable=False)
    records = [json.dumps({"writer": w, "beats": [{"rank": r, "pad": "x" * 200} for r in range(64)]})
               for w in range(2)]
    stop, bad = threading.Event(), []

    def write(text: str) -> None:
        for _ in range(300):
            write_atomic(path, text.encode(), durable=False)

    def read() -> None:
        while not stop.is_set():
            text = path.read_text()
            if text not in (records[0], records[1], "{}"):
                bad.append(len(text))

    reader = threading.Thread(target=read)
    reader.start()
    writers = [threading.Thread(target=write, args=(r,)) for r in records]
    for t in writers:
        t.start()
    for t in writers:
        t.join()
    stop.set()
    reader.join()
    assert not bad, f"{len(bad)} reads of a half-written file, e.g. {bad[:5]} bytes"
    assert not list(tmp_path.glob(".*.tmp")), "temporary files left"


def test_a_write_after_the_node_dir_is_gone_leaves_the_final_file(tmp_path):
    clock = Clock()
    paths, local, node = make_node(tmp_path, "n1", [0, 1], clock)
    beat_round(node, [0, 1], clock)
    node[0][1].close()
    assert node[1][1].close() is True and not local.root.exists()
    final = paths.node_heartbeat("n1").read_text()
    node[1][1]._write_beats({}, clock.now + 1)     # a tick that found the lock held, then nothing
    assert paths.node_heartbeat("n1").read_text() == final

"""Per-node logs: each line of each rank gathered exactly once (kills of the gatherer at every
point, partial and damaged lines), and read back by `logs` and `diagnose` as per-rank streams."""

from __future__ import annotations

import multiprocessing
import os
import signal

import pytest

from hpc_train.inspection import diagnose, logs
from hpc_train.rundir import RunPaths
from hpc_train.runtime import node_log
from hpc_train.runtime.node_local import NodeLocal
from hpc_train.runtime.node_log import (GatherState, RankLogs, gather, rank_logs_mode,
                                        split_node_log)

STAMP = "2026-12-01 10:00:0{} rank {} hpc_train.worker INFO "


@pytest.mark.parametrize("setting, world, mode", [
    ("auto", 1, RankLogs.PER_RANK), ("auto", 64, RankLogs.PER_RANK), ("auto", 65, RankLogs.PER_NODE),
    ("per_rank", 4096, RankLogs.PER_RANK), ("per_node", 2, RankLogs.PER_NODE),
])
def test_auto_is_per_rank_for_small_runs_and_per_node_above(setting, world, mode):
    assert rank_logs_mode(setting, world) is mode


def node(tmp_path) -> tuple[NodeLocal, RunPaths]:
    paths = RunPaths(tmp_path / "run")
    paths.make_dirs()
    return NodeLocal(tmp_path / "local").make(), paths


def append(path, data: bytes) -> None:
    with open(path, "ab") as handle:
        handle.write(data)


def gather_once(local: NodeLocal, target, flush=()) -> int:
    state = GatherState.read(local.state)
    wrote = gather(local, state, target, flush)
    state.write(local.state)
    return wrote


def test_whole_lines_are_gathered_once_and_a_partial_line_when_it_is_whole(tmp_path):
    local, paths = node(tmp_path)
    target = paths.node_log("n1")
    append(local.log(3), b"a1\na2\npart")
    append(local.log(17), b"b1\n")
    gather_once(local, target)
    assert gather_once(local, target) == 0                       # nothing new: no write at all
    append(local.log(3), b"ial\n")
    gather_once(local, target)
    assert target.read_bytes() == b"[rank 3] a1\n[rank 3] a2\n[rank 17] b1\n[rank 3] partial\n"


def test_a_rank_that_writes_no_more_gives_its_partial_last_line(tmp_path):
    local, paths = node(tmp_path)
    target = paths.node_log("n1")
    append(local.log(0), b"x\nno newline")
    gather_once(local, target, flush={0})
    append(local.log(0), b"later\n")
    gather_once(local, target)
    assert target.read_text().splitlines() == ["[rank 0] x", "[rank 0] no newline", "[rank 0] later"]


def test_damaged_bytes_pass_through_and_unprefixed_lines_are_skipped_by_readers(tmp_path):
    local, paths = node(tmp_path)
    target = paths.node_log("n1")
    append(local.log(1), b"ok \xff\xfe bytes\n")
    gather_once(local, target)
    append(target, b"garbage from elsewhere\n[rank 1] after\n")
    split = split_node_log(target.read_text(errors="replace").splitlines())
    assert split == {1: ["ok \ufffd\ufffd bytes", "after"]}


def _gather_and_die_at(root: str, target: str, point: str) -> None:
    """In a child: gather, SIGKILLed at `point` (before or after the append, or halfway through it)."""
    local = NodeLocal(__import__("pathlib").Path(root))
    real_write = os.write

    def dying_write(fd, data):
        if point == "halfway":
            real_write(fd, data[:len(data) // 2])
        elif point == "after":
            real_write(fd, data)
        os.kill(os.getpid(), signal.SIGKILL)

    node_log.os.write = dying_write
    with local.lock(1.0):
        gather(local, GatherState.read(local.state), __import__("pathlib").Path(target))


@pytest.mark.parametrize("point", ["before", "halfway", "after"])
def test_a_gatherer_killed_at_any_point_loses_and_repeats_no_line(tmp_path, point):
    local, paths = node(tmp_path)
    target = paths.node_log("n1")
    append(target, b"[rank 0] from an earlier run\n")
    for rank in (0, 1):
        append(local.log(rank), b"".join(f"r{rank} line {i}\n".encode() for i in range(50)))
    child = multiprocessing.get_context("fork").Process(target=_gather_and_die_at,
                                                         args=(str(local.root), str(target), point))
    child.start()
    child.join(30)
    assert child.exitcode == -signal.SIGKILL
    assert GatherState.read(local.state).pending is not None      # it died mid-way
    with local.lock(1.0) as held:                                  # the dead holder's lock is free
        assert held
        gather_once(local, target)
    lines = target.read_text().splitlines()
    expected = ["[rank 0] from an earlier run"] + [f"[rank {r}] r{r} line {i}" for r in (0, 1) for i in range(50)]
    assert sorted(lines) == sorted(expected) and len(lines) == len(expected)


def test_logs_and_diagnose_read_node_logs_as_per_rank_streams(tmp_path):
    local, paths = node(tmp_path)
    for rank in (2, 3):
        append(local.log(rank), f"{STAMP.format(rank, rank)}rank {rank}/4 (local 0) pid 1 on n1, code x\n".encode())
    append(local.log(3), b"Traceback (most recent call last):\n  File \"x.py\", line 1, in <module>\n"
                         b"RuntimeError: boom on three\n")
    gather_once(local, paths.node_log("n1"))
    paths.rank_log(0).write_text(STAMP.format(1, 0) + "rank 0 own file\n")      # rank files beside it
    found = logs.rank_logs(paths)
    assert sorted(found) == [0, 2, 3] and found[3].name == "node-n1.log"
    assert [line.text for line in logs.select(paths, [3], None)][-1] == "RuntimeError: boom on three"
    assert [line.rank for line in logs.select(paths, None, None, "rank \\d/4")] == [2, 3]
    found_by = diagnose.diagnose(paths)
    assert found_by.first_failure.rank == 3 and "boom on three" in found_by.first_failure.exception
    assert found_by.first_failure.host == "n1"
    assert list(logs.tails(paths))   # status reads the tails of both kinds

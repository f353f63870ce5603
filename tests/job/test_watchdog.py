"""The driver's watchdog (pure rules on heartbeats and a fake clock) and the ranks' heartbeat."""

from __future__ import annotations

import json
import sys
import time

import pytest

from hpc_train.job import watchdog
from hpc_train.job.watchdog import Beat, find_stall, stop_ignored
from hpc_train.runtime.heartbeat import STACK_DUMP_HEADER, Heartbeat, Phase, beat_interval

LAUNCH = 1000.0
STALL = 60.0
INTERVAL = beat_interval(STALL)


def beat(rank, step, progress, alive, phase="train"):
    return Beat(rank, step, phase, progress, alive, pid=100 + rank, host=f"node{rank}")


def test_no_stall_while_any_rank_progresses():
    beats = {0: beat(0, 5, 1100.0, 1100.0), 1: beat(1, 5, 1050.0, 1100.0)}
    assert find_stall(beats, 2, LAUNCH, 1101.0, STALL, INTERVAL) is None


def test_start_up_counts_from_the_launch():
    assert find_stall({}, 2, LAUNCH, LAUNCH + STALL - 1, STALL, INTERVAL) is None
    stall = find_stall({}, 2, LAUNCH, LAUNCH + STALL, STALL, INTERVAL)
    assert [r.rank for r in stall.ranks] == [0, 1]
    assert all("no heartbeat" in r.why and r.idle_seconds == STALL for r in stall.ranks)


def test_a_frozen_rank_is_the_culprit_not_the_ranks_waiting_for_it():
    now = 1200.0
    beats = {0: beat(0, 21, 1100.0, now - 1), 1: beat(1, 20, 1099.0, 1099.5), 2: beat(2, 21, 1100.0, now - 2)}
    stall = find_stall(beats, 3, LAUNCH, now, STALL, INTERVAL)
    assert [(r.rank, r.host, r.pid, r.step) for r in stall.ranks] == [(1, "node1", 101, 20)]
    assert "not running" in stall.ranks[0].why
    assert "launch.stall_seconds=60" in stall.why


def test_alive_ranks_behind_the_others_are_named():
    now = 1200.0
    beats = {0: beat(0, 21, 1100.0, now), 1: beat(1, 20, 1098.0, now), 2: beat(2, 21, 1100.0, now)}
    stall = find_stall(beats, 3, LAUNCH, now, STALL, INTERVAL)
    assert [r.rank for r in stall.ranks] == [1] and "behind" in stall.ranks[0].why


def test_all_alive_at_one_step_names_every_rank():
    now = 1200.0
    beats = {r: beat(r, 21, 1100.0, now) for r in range(2)}
    stall = find_stall(beats, 2, LAUNCH, now, STALL, INTERVAL)
    assert [r.rank for r in stall.ranks] == [0, 1] and "same step" in stall.ranks[0].why


def test_a_stop_not_obeyed_within_the_grace_period():
    beats = {0: beat(0, 3, 1100.0, 1100.0)}
    assert stop_ignored(beats, 1, 1109.0, 1100.0, 10.0, INTERVAL, LAUNCH) is None
    stall = stop_ignored(beats, 1, 1110.0, 1100.0, 10.0, INTERVAL, LAUNCH)
    assert "did not stop within 10 s" in stall.why
    assert not stall.during_start


@pytest.mark.parametrize("phases, during_start", [
    ({0: "starting", 1: "resuming"}, True),
    ({0: "network"}, True),                 # rank 1 has not beaten yet: still importing
    ({0: "starting", 1: "data"}, False),    # one rank is in its first step
    ({0: "checkpoint", 1: "checkpoint"}, False),
])
def test_a_stop_ignored_while_every_rank_still_starts_says_so(phases, during_start):
    beats = {r: beat(r, 0, 1100.0, 1110.0, phase) for r, phase in phases.items()}
    stall = stop_ignored(beats, 2, 1120.0, 1100.0, 15.0, INTERVAL, LAUNCH)
    assert stall.during_start is during_start
    assert ("still starting" in stall.why) is during_start


def test_beats_of_an_earlier_run_are_ignored(tmp_path):
    for rank, written in ((0, 900.0), (1, 1001.0)):
        record = {"rank": rank, "host": "h", "pid": 1, "step": 3, "phase": "train",
                  "progress": written, "time": written}
        (tmp_path / f"rank-{rank:05d}").write_text(json.dumps(record))
    (tmp_path / ".rank-00002.tmp").write_text("{")
    assert list(watchdog.read_beats(tmp_path, since=LAUNCH)) == [1]


def test_process_state_of_this_process():
    import os

    assert watchdog.process_state(os.getpid()).startswith(("R", "S"))
    assert watchdog.process_state(None) is None


@pytest.mark.slow
def test_heartbeat_thread_writes_and_dumps_stacks_once_when_stuck(tmp_path, capfd):
    path = tmp_path / "rank-00003"
    heartbeat = Heartbeat(path, 3, stall_seconds=5)
    asked: list[float] = []
    heartbeat.after_dump = lambda: asked.append(time.monotonic())   # the trainer's: its workers
    heartbeat.start()                                                # writes every second
    try:
        heartbeat.progress(step=7, phase=Phase.TRAIN)
        dumped, deadline = "", time.monotonic() + 15
        while time.monotonic() < deadline and STACK_DUMP_HEADER not in dumped:
            dumped += capfd.readouterr().err
            time.sleep(0.2)
        record = json.loads(path.read_text())
    finally:
        heartbeat.close()
    assert "on rank 3 at step 7 (phase train)" in dumped     # the phase's word, in the log
    assert len(asked) == 1                                  # once per silence, as the dump
    assert (record["rank"], record["step"], record["phase"]) == (3, 7, "train")   # and on disk
    assert record["time"] >= record["progress"]


@pytest.mark.slow
def test_heartbeat_dump_contains_the_main_threads_stack(tmp_path):
    import subprocess

    code = ("import time; from pathlib import Path; from hpc_train.runtime.heartbeat import Heartbeat\n"
            "h = Heartbeat(Path(r'%s'), 0, stall_seconds=4).start()\n"
            "def stuck_in_a_collective():\n    time.sleep(5)\n"
            "stuck_in_a_collective(); h.close()\n") % (tmp_path / "rank-00000")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert STACK_DUMP_HEADER in out.stderr and "stuck_in_a_collective" in out.stderr
    assert out.stderr.count(STACK_DUMP_HEADER) == 1


def test_a_rank_in_an_earlier_phase_of_the_same_step_is_the_one_waited_for():
    now = 1200.0
    beats = {0: beat(0, 12, 1100.0, now, "sync"), 1: beat(1, 12, 1099.0, now, "train"),
             2: beat(2, 12, 1100.0, now, "sync")}
    stall = find_stall(beats, 3, LAUNCH, now, STALL, INTERVAL)
    assert [r.rank for r in stall.ranks] == [1] and "phase train of step 12" in stall.ranks[0].why
    beats[1] = beat(1, 12, 1099.0, now, "data")                     # stuck fetching its batch
    beats[0] = beat(0, 12, 1100.0, now, "train")                    # waiting in the all-reduce
    stall = find_stall(beats, 3, LAUNCH, now, STALL, INTERVAL)
    assert [r.rank for r in stall.ranks] == [1]

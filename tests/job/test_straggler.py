"""Stragglers and `launch.stall_seconds: auto`: the pure comparisons on heartbeats, the loop's
step times, the heartbeat's longest silences, and the test-only `slow` fault."""

from __future__ import annotations

import json

import pytest

from hpc_train.job.straggler import WARN_EVERY_SECONDS, StragglerWarnings, slowest_rank
from hpc_train.runtime import faults
from hpc_train.runtime.heartbeat import (AUTO, AUTO_FLOOR_SECONDS, AUTO_START_SECONDS, Beat,
                                         Heartbeat, Phase, RankTimes, derived_stall_seconds,
                                         parse_beat, stall_bound)
from hpc_train.train.timing import StepTimes, blocked_seconds


def beat(rank, busy, data=0.01, step=0.3, phase="train", **longest):
    return Beat(rank, 10, phase, 1.0, 1.0, 100 + rank, f"node{rank}",
                RankTimes(step, data, busy, 32, **longest), first_step_time=0.5)


def test_the_rank_with_most_own_time_is_named_with_its_node_and_the_others_wait():
    beats = {0: beat(0, 0.10), 1: beat(1, 0.30), 2: beat(2, 0.11), 3: beat(3, 0.09)}
    found = slowest_rank(beats)
    assert (found.rank, found.host) == (1, "node1")
    assert found.others_busy == pytest.approx(0.10)        # the others' median, not its own
    assert found.ratio == pytest.approx(3.0) and found.wait == pytest.approx(0.20)
    assert found.share == pytest.approx(0.20 / 0.3)
    assert not found.on_data and found.over(1.5) and not found.over(3.5) and not found.over(None)
    assert found.words().startswith("rank 1 on node1: 3.0x the others' own time per step")
    assert "not waiting on data" in found.words()
    assert json.loads(json.dumps(found.to_json()))["ratio"] == 3.0


def test_two_ranks_compare_with_each_other_and_a_loader_wait_is_named():
    found = slowest_rank({0: beat(0, 0.1), 1: beat(1, 0.3, data=0.2)})
    assert found.rank == 1 and found.ratio == pytest.approx(3.0)    # not against a median of both
    assert found.on_data and "waiting on data (0.2 s a step" in found.words()


@pytest.mark.parametrize("beats", [
    {},
    {0: beat(0, 0.3)},                                              # one rank: nobody waits
    {0: beat(0, 0.3), 1: Beat(1, 3, "train", 1.0, 1.0)},            # no times yet
    {0: beat(0, 0.3), 1: beat(1, None)},
    {0: beat(0, 0.3), 1: Beat(1, 3, "train", 1.0, 1.0, times=RankTimes(0.3, 0.0, 0.1, 7))},  # too few
])
def test_no_comparison_without_two_timed_ranks(beats):
    assert slowest_rank(beats) is None


def test_balanced_ranks_and_noise_are_no_straggler():
    balanced = slowest_rank({0: beat(0, 0.100), 1: beat(1, 0.104), 2: beat(2, 0.101)})
    assert balanced.ratio < 1.1 and not balanced.over(1.5)
    # 3x of almost nothing (DDP: own time is the data wait and the loop's work) is not a warning
    tiny = slowest_rank({0: beat(0, 0.001, step=1.0), 1: beat(1, 0.003, step=1.0)})
    assert tiny.ratio == pytest.approx(3.0) and not tiny.over(1.5)


def test_warnings_are_bounded_per_rank():
    slow1 = {0: beat(0, 0.1), 1: beat(1, 0.3)}
    slow0 = {0: beat(0, 0.3), 1: beat(1, 0.1)}
    warnings = StragglerWarnings(1.5)
    assert warnings.due(slow1, 1000.0).rank == 1
    assert warnings.due(slow1, 1000.0 + WARN_EVERY_SECONDS - 1) is None
    assert warnings.due(slow0, 1001.0).rank == 0                    # another rank: its own bound
    assert warnings.due(slow1, 1000.0 + WARN_EVERY_SECONDS).rank == 1
    assert StragglerWarnings(None).due(slow1, 0.0) is None
    assert StragglerWarnings(4.0).due(slow1, 0.0) is None


@pytest.mark.parametrize("phases, step, save, bound", [
    (["train", "data"], None, None, AUTO_START_SECONDS),       # no step seen yet
    (["train", "sync"], 2.0, None, AUTO_FLOOR_SECONDS),        # 5 x 2 s is under the floor
    (["train", "sync"], 30.0, None, 150.0),                    # 5 x the longest step
    (["evaluate", "saved"], 30.0, None, 150.0),                # an evaluation batch < a step
    (["checkpoint", "sync"], 30.0, None, AUTO_START_SECONDS),  # a first save: not seen yet
    (["checkpoint", "sync"], 30.0, 50.0, 250.0),               # a save seen: 5 x the longer
    (["sync", "sync"], 30.0, 50.0, 150.0),                     # out of the save: the step's
    (["resuming", "train"], 30.0, 50.0, AUTO_START_SECONDS),   # a rank in start-up
    ([Phase.TRAIN, Phase.DATA], 30.0, None, 150.0),            # Phases or their words
])
def test_auto_stall_bound_table(phases, step, save, bound):
    assert derived_stall_seconds(phases, step, save) == bound


def test_stall_bound_from_beats():
    timed = {0: beat(0, 0.1, longest_step=20.0), 1: beat(1, 0.1, longest_step=30.0, longest_save=9.0)}
    assert stall_bound(120.0, timed.values()) == 120.0
    assert stall_bound(AUTO, timed.values()) == 150.0
    assert stall_bound(AUTO, [*timed.values(), Beat(2, 1, "train", 1.0, 1.0)]) == AUTO_START_SECONDS
    assert stall_bound(AUTO, []) == AUTO_START_SECONDS


def test_until_every_rank_began_training_the_start_up_bound_holds_where_longer():
    trained = list({0: beat(0, 0.1), 1: beat(1, 0.1)}.values())
    starting = Beat(2, 0, "starting", 1.0, 1.0)       # no first step yet in this start
    assert stall_bound(40.0, trained) == 40.0
    assert stall_bound(40.0, [*trained, starting]) == AUTO_START_SECONDS
    assert stall_bound(40.0, [], start_seconds=900.0) == 900.0        # none has even beaten
    assert stall_bound(40.0, [starting], start_seconds=20.0) == 40.0  # never under stall_seconds
    assert stall_bound(AUTO, [starting], start_seconds=1200.0) == 1200.0
    # A starting rank whose beat went silent (SIGSTOP, a dead node) is frozen, not slow to start.
    assert stall_bound(40.0, [*trained, starting], now=1.0 + 12.0) == 40.0   # 3 beats of 4 s
    assert stall_bound(40.0, [*trained, starting], now=1.0 + 11.0) == AUTO_START_SECONDS


def test_blocked_time_by_backend():
    horovod = {"start": 0.0, "data": 0.1, "backward": 0.5, "reduced": 0.9, "optimizer": 1.0}
    ddp = {"start": 0.0, "data": 0.1, "backward": 0.9, "optimizer": 1.0}
    assert blocked_seconds(horovod) == pytest.approx(0.4)     # in synchronize()
    assert blocked_seconds(ddp) == pytest.approx(0.8)         # forward/backward with its reductions
    assert blocked_seconds({"start": 0.0, "data": 0.1}) == 0.0   # the pipeline marks nothing inside


def test_step_times_are_medians_of_the_last_steps(monkeypatch):
    now = iter([0.0, 0.1, 0.5, 0.9,  1.0, 1.1, 1.5, 1.9,  12.0, 12.2, 12.6, 13.0,  14.0])
    monkeypatch.setattr("hpc_train.train.timing.time.perf_counter", lambda: next(now))
    synced = iter([0.0, 0.0, 0.5, 0.5])   # the second step: 0.5 s in the collectives after it
    clock = StepTimes(lambda: next(synced), window=2)
    assert clock.summary() is None
    for _ in range(3):                  # steps of 1, 11 (a save, say) and 2 s: the last 2 count
        clock.mark("start")
        clock.mark("data")
        clock.mark("backward")
        clock.after(lambda: None, "reduced")()
    clock.mark("start")
    summary = clock.summary()
    assert summary["steps"] == 2 and summary["step"] == pytest.approx((11.0 + 2.0) / 2)
    assert summary["data"] == pytest.approx(0.15)
    assert summary["busy"] == pytest.approx(((11.0 - 0.4 - 0.5) + (2.0 - 0.4)) / 2)


def test_heartbeat_records_step_times_and_longest_silences(tmp_path):
    now = [100.0]
    heartbeat = Heartbeat(tmp_path / "rank-00000", 0, AUTO, clock=lambda: now[0])
    heartbeat.step_times = lambda: {"step": 0.5, "data": 0.1, "busy": 0.4, "steps": 3}

    def at(t, **progress):
        now[0] = t
        heartbeat.progress(**progress)

    at(101.0, step=1, phase=Phase.DATA)
    at(150.0, phase=Phase.TRAIN)             # the first step (warm-up) is not measured
    at(151.0, step=2, phase=Phase.DATA)
    at(151.5, phase=Phase.TRAIN)
    at(154.5, phase=Phase.CHECKPOINT)        # 3 s in the step
    at(164.5, phase=Phase.SAVED)             # 10 s in the save
    at(165.0, step=3, phase=Phase.DATA)
    at(165.5, phase=Phase.SYNC)
    at(167.0, phase=Phase.SYNC)              # a second collective between the same steps
    at(167.25, step=4, phase=Phase.DATA)
    assert heartbeat.synced_seconds == pytest.approx(1.75)
    heartbeat.write()
    read = parse_beat((tmp_path / "rank-00000").read_text())
    assert read.times == RankTimes(0.5, 0.1, 0.4, 3, longest_step=3.0, longest_save=10.0)
    assert heartbeat._bound() == AUTO_FLOOR_SECONDS       # 5 x 3 s, at least the floor


def test_slow_fault_parses_and_sleeps_its_factor_of_the_rank_own_time(monkeypatch):
    assert faults.parse_fault("slow:1:5:3") == faults.Fault("slow", 1, 5, factor=3.0)
    with pytest.raises(ValueError, match="slow:RANK:STEP:FACTOR"):
        faults.parse_fault("slow:1:5:0.5")
    now, slept = iter([10.0, 10.0, 10.5, 11.5, 11.75, 12.25]), []
    monkeypatch.setattr(faults.time, "perf_counter", lambda: next(now))
    monkeypatch.setattr(faults.time, "sleep", slept.append)
    injector = faults.FaultInjector(1, {faults.FAULT_ENV: "slow:1:2:3"})
    for step in (1, 2, 3):
        injector.at_step(step)
    assert slept == [pytest.approx(1.0), pytest.approx(0.5)]   # 2 x its own time, the sleep not in it
    faults.FaultInjector(0, {faults.FAULT_ENV: "slow:1:2:3"}).at_step(2)   # another rank: nothing

"""The one way the benchmarks time (train/timing.py): a stopwatch that waits for a GPU's queued
work, a timed call, rounds with an untimed step before each, their medians."""

from __future__ import annotations

import statistics

import pytest
import torch

from hpc_train.train.timing import Stopwatch, medians, repeat, time_it


def test_a_timed_call_lasts_as_long_as_the_action(monkeypatch):
    now = [100.0]                         # the stopwatch's clock, moved only by the action
    monkeypatch.setattr("hpc_train.train.timing.time.perf_counter", lambda: now[0])

    def action():
        now[0] += 0.05

    assert time_it(action) == pytest.approx(0.05)


def test_on_a_gpu_the_stopwatch_waits_for_the_queued_work_before_it_starts_and_reads(monkeypatch):
    waited = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: waited.append(device))
    device = torch.device("cuda", 0)
    watch = Stopwatch(device)
    assert waited == [device]
    watch.seconds()
    assert waited == [device, device]
    Stopwatch(torch.device("cpu")).seconds()
    assert waited == [device, device]


def test_rounds_run_the_untimed_step_before_each_timed_call():
    calls = []
    times = repeat(lambda: calls.append("run"), 3, before=lambda: calls.append("barrier"))
    assert calls == ["barrier", "run"] * 3 and len(times) == 3 and all(t >= 0 for t in times)


def test_the_median_of_rounds_ignores_one_slow_round():
    assert medians({"ours": [1.0, 9.0, 2.0], "bare": [4.0, 3.0]}) == {"ours": 2.0, "bare": 3.5}
    with pytest.raises(statistics.StatisticsError):
        medians({"none": []})

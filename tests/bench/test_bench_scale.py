"""`bench scale`'s pure parts: its numbers from recorded events and metric lines, its arguments."""

from __future__ import annotations

import argparse

import pytest

from hpc_train import events
from hpc_train.bench import scale_measures as measure
from hpc_train.bench.scale import HEADER, Row, table_rows
from hpc_train.bench.scale_args import parse_counts, parse_measures


def _at(t: float, event: dict, restart: int = 0) -> dict:
    return events.stamped(event, environ={"SLURM_JOB_ID": "7", "SLURM_RESTART_COUNT": str(restart)}, now=t)


HISTORY = [
    events.stamped(events.submitted("7", "slurm", "0" * 64), environ={}, now=100.0),
    _at(104.0, events.started(["n1", "n2"], 2, None, [], 10)),
    _at(105.0, events.data_copied("n1", "/l/n1", True, 18, 0, 0, 1000, 0.5, "")),
    _at(105.2, events.data_copied("n2", "/l/n2", True, 18, 0, 0, 1000, 0.75, "")),
    _at(130.0, events.ranks_stalled("no rank progressed", [
        {"rank": 0, "idle_seconds": 11.0}, {"rank": 1, "idle_seconds": 12.5}], 11.0)),
    _at(131.0, events.requeued("SIGUSR2", events.CAUSE_STOP, "driver", "", 0, 27.0, 0.27)),
    _at(145.0, events.started(["n1", "n2"], 2, None, [], 10), restart=1),
    _at(146.0, events.data_copied("n1", "/l/n1", True, 0, 18, 0, 0, 9.0, ""), restart=1),
    _at(160.0, events.finished("completed", "done", 0, 15.0)),
]
# Steps of the first start (the last ones logged after the stop was sent at 125), then the second's.
METRICS = [{"time": t, "step": s} for t, s in ((106.5, 1), (107.0, 2), (126.0, 30))] + \
          [{"time": 126.5, "step": 30, "split": "val"}, {"time": 147.25, "step": 31}]


def test_launch_is_submission_to_first_step():
    assert measure.launch_seconds(HISTORY, METRICS) == pytest.approx(6.5)
    assert measure.launch_seconds(HISTORY, []) is None
    assert measure.launch_seconds(HISTORY[1:], METRICS) is None


def test_training_again_is_the_first_step_of_the_next_start():
    # The step logged at 126 is the stopping ranks', not training again.
    assert measure.back_to_training_seconds(HISTORY, METRICS, sent=125.0) == pytest.approx(22.25)
    assert measure.back_to_training_seconds(HISTORY[:6], METRICS, sent=125.0) is None
    assert measure.back_to_training_seconds(HISTORY, METRICS[:4], sent=125.0) is None


def test_staging_is_the_slowest_node_of_the_first_start():
    assert measure.staging_seconds(HISTORY) == 0.75
    assert measure.staging_seconds(HISTORY[:2]) is None


def test_naming_is_the_frozen_ranks_idle_seconds_in_the_stall_event():
    assert measure.naming_seconds(HISTORY, METRICS, 1) == 12.5
    assert measure.naming_seconds(HISTORY, METRICS, 2) is None
    # A stall before the first step (a slow start-up) names no frozen rank.
    assert measure.naming_seconds(HISTORY, [{"time": 140.0, "step": 1}], 1) is None


def test_driver_cpu_per_second_of_the_first_ending_that_has_it():
    assert measure.driver_cpu_per_second(HISTORY) == pytest.approx(0.01)
    assert measure.driver_cpu_per_second([HISTORY[-1]]) is None    # not measured: absent


def test_table_has_a_column_per_measurement_and_dashes_where_none():
    rows = table_rows([Row(2, launch_mpirun=4.44, driver_cpu_per_s=0.0061), Row(8)])
    assert rows[0][:3] == ["2", "4.4", "-"] and rows[0][-1] == "0.006"
    assert rows[1] == ["8", *["-"] * (len(HEADER) - 1)]
    assert all(len(row) == len(HEADER) for row in rows)


def test_arguments():
    assert parse_counts("2,4,8") == [2, 4, 8]
    assert parse_measures("launch,doctor") == ("launch", "doctor")
    for bad in ("", "2,x", "0"):
        with pytest.raises(argparse.ArgumentTypeError, match="node counts"):
            parse_counts(bad)
    with pytest.raises(argparse.ArgumentTypeError, match="launch,stops,freeze,doctor"):
        parse_measures("launch,speed")

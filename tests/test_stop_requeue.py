"""Stop agreement and the driver's decision after the ranks exit (pure logic, fake clock)."""

from __future__ import annotations

import pytest

from hpc_train.runtime.stop import STOP_EXIT, StopFlag, agreed_reason, one_hot
from hpc_train.slurm.requeue import decide, parse_slurm_time


def test_deadline_with_a_fake_clock():
    now = [1000.0]
    flag = StopFlag(deadline=1060.0, clock=lambda: now[0], install_handlers=False)
    assert flag.local_code() == 0
    now[0] = 1060.0
    assert agreed_reason(one_hot(flag.local_code())) == "deadline"


def test_strongest_reason_wins_across_ranks():
    summed = [a + b for a, b in zip(one_hot(0), one_hot(2))]          # one rank saw USR2
    assert agreed_reason(summed) == "SIGUSR2"
    summed = [a + b + c for a, b, c in zip(one_hot(1), one_hot(3), one_hot(0))]
    assert agreed_reason(summed) == "SIGTERM"
    assert agreed_reason(one_hot(0)) is None


def test_signal_sets_the_flag():
    import os
    import signal

    flag = StopFlag()
    try:
        os.kill(os.getpid(), signal.SIGUSR2)
        assert agreed_reason(one_hot(flag.local_code())) == "SIGUSR2"
    finally:
        signal.signal(signal.SIGUSR2, signal.SIG_DFL)
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


BASE = dict(stop_reason="SIGUSR2", restarts=0, failed_runs=0, max_requeues=3,
            retries_on_failure=0, can_requeue=True)


@pytest.mark.parametrize("returncode, changes, action", [
    (0, {}, "completed"),
    (STOP_EXIT, {}, "requeue"),
    (STOP_EXIT, {"restarts": 3}, "stopped"),                 # the cap on requeues
    (STOP_EXIT, {"can_requeue": False}, "stopped"),          # local executor
    (1, {}, "failed"),                                        # a crash is not requeued...
    (1, {"retries_on_failure": 1}, "requeue"),                # ...unless asked for
    (1, {"retries_on_failure": 1, "failed_runs": 1}, "failed"),
    (1, {"driver_signalled": True}, "requeue"),               # mpirun aborted by a preemption's TERM
    (143, {"driver_signalled": True, "can_requeue": False}, "stopped"),
])
def test_decide(returncode, changes, action):
    assert decide(returncode, **{**BASE, **changes}).action == action


def test_parse_slurm_time():
    assert parse_slurm_time("N/A") is None
    assert parse_slurm_time("2026-11-29T17:05:00\n") is not None

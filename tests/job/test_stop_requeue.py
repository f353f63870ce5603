"""Stop agreement and the driver's decision after the ranks exit (pure logic, fake clock)."""

from __future__ import annotations

import pytest

from hpc_train import events
from hpc_train.job.requeue import decide, ending_status, requeue_path
from hpc_train.run_state import RunState
from hpc_train.runtime.stop import STOP_EXIT, StopFlag, agreed_reason, one_hot
from hpc_train.scheduler import JobRecord, parse_show_job, parse_slurm_time


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
    (0, {"stall": "no rank progressed"}, "failed"),            # torn down: exit status is moot
    (STOP_EXIT, {"stall": "stop ignored", "retries_on_failure": 1}, "requeue"),
    (1, {"stall": "x", "retries_on_failure": 2, "failed_runs": 2}, "failed"),
])
def test_decide(returncode, changes, action):
    assert decide(returncode, **{**BASE, **changes}).action == action


@pytest.mark.parametrize("returncode, changes, cause", [
    (STOP_EXIT, {}, events.CAUSE_STOP),
    (1, {"driver_signalled": True}, events.CAUSE_INTERRUPTED),
    (1, {"retries_on_failure": 1}, events.CAUSE_FAILURE),
    (0, {"stall": "x", "retries_on_failure": 1}, events.CAUSE_STALL),
])
def test_requeues_say_why_and_failures_are_counted_by_cause(returncode, changes, cause):
    decision = decide(returncode, **{**BASE, **changes})
    assert decision.cause == cause
    assert RunState().with_retry(decision.cause).failed_runs() == (cause in events.FAILURE_CAUSES)


def test_a_spent_retry_budget_names_the_setting():
    decision = decide(1, **{**BASE, "retries_on_failure": 1, "failed_runs": 1})
    assert "retries_on_failure=1" in decision.reason


def test_a_retry_that_cannot_happen_is_not_called_used_up():
    # The local executor cannot requeue: the reason says so instead of a spent budget.
    decision = decide(1, **{**BASE, "retries_on_failure": 1, "can_requeue": False})
    assert decision.action == "failed" and "not running under Slurm" in decision.reason
    assert "used up" not in decision.reason


@pytest.mark.parametrize("job, restart, path", [
    (None, 0, "driver"),                                   # scontrol did not answer: try
    (JobRecord("RUNNING", 0, "None"), 0, "driver"),
    (JobRecord("COMPLETING", 1, "None"), 0, "slurm"),      # requeued by Slurm already
    (JobRecord("PENDING", 2, "BeginTime"), 1, "slurm"),
    (JobRecord("COMPLETING", 0, "None"), 0, "ending"),     # scancel or the time limit
    (JobRecord("CANCELLED", 3, "None"), 3, "ending"),
])
def test_requeue_path_follows_slurms_own_view(job, restart, path):
    assert requeue_path(job, restart) == path


def test_a_job_ended_by_slurm_is_a_timeout_only_past_its_end():
    assert ending_status(1000.0, 999.5) == "timeout"
    assert ending_status(1000.0, 2000.0) == "cancelled"
    assert ending_status(1000.0, None) == "cancelled"


def test_parse_show_job():
    text = ("JobId=42 JobName=smoke UserId=root(0) GroupId=root(0) Priority=1 JobState=COMPLETING "
            "Reason=None Dependency=(null) Requeue=1 Restarts=2 BatchFlag=1 ExitCode=0:0\n")
    assert parse_show_job(text) == JobRecord("COMPLETING", 2, "None")
    assert parse_show_job("slurm_load_jobs error: Invalid job id specified") is None


def test_parse_slurm_time():
    assert parse_slurm_time("N/A") is None
    import datetime

    expected = datetime.datetime(2026, 11, 29, 17, 5).timestamp()     # squeue prints local time
    assert parse_slurm_time("2026-11-29T17:05:00\n") == expected


def _fake_scontrol(tmp_path, monkeypatch, restarts: int, refusal: str) -> None:
    """An scontrol that refuses `requeue` and shows the job with `restarts` restarts."""
    script = tmp_path / "scontrol"
    script.write_text("#!/bin/sh\n"
                      f'if [ "$1" = requeue ]; then echo "{refusal}" >&2; exit 1; fi\n'
                      f'echo "JobId=5 JobState=RUNNING Reason=None Requeue=1 Restarts={restarts}"\n')
    script.chmod(0o755)
    import os

    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")


def test_a_refused_requeue_that_slurm_did_anyway_counts_as_requeued(tmp_path, monkeypatch):
    from hpc_train import scheduler

    _fake_scontrol(tmp_path, monkeypatch, restarts=3, refusal="Requested operation not supported")
    by, detail = scheduler.requeue("5", restart=2, attempts=2)
    assert by == "slurm" and "not supported" in detail
    _fake_scontrol(tmp_path, monkeypatch, restarts=2, refusal="Job is pending execution for job 5")
    by, detail = scheduler.requeue("5", restart=2, attempts=2)
    assert by == "slurm" and "pending execution" in detail


def test_a_refused_requeue_is_reported_with_scontrols_words(tmp_path, monkeypatch):
    from hpc_train import scheduler

    _fake_scontrol(tmp_path, monkeypatch, restarts=2, refusal="Access/permission denied")
    by, detail = scheduler.requeue("5", restart=2, attempts=2)
    assert by is None and detail == "Access/permission denied"

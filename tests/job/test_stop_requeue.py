"""Stop agreement and the driver's decision after the ranks exit (pure logic, fake clock)."""

from __future__ import annotations

import pytest

from hpc_train import events
from hpc_train.job.node_fault import NodeFault
from hpc_train.job.requeue import Budget, Ended, decide, ending_status, requeue_path
from hpc_train.job.watchdog import Standing
from hpc_train.run_state import RunState
from hpc_train.runtime.stop import STOP_EXIT, StopFlag, agreed_reason, one_hot
from hpc_train.scheduler import Job, JobState


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


BASE = dict(requeues=0, failed_runs=0, max_requeues=3, retries_on_failure=0, can_requeue=True)


STARTING, EXITING = Standing.STARTING, Standing.EXITING
DEAD = NodeFault(("hpcn2",), "mpirun lost its daemon on hpcn2")


def _decide(returncode: int, stall: str | None = None, signal: str | None = None,
            stop_reason: str | None = "SIGUSR2", node: NodeFault | None = None,
            standing: Standing = Standing.TRAINING, saved: str | None = None, **budget):
    """decide() from one flat row of a table: how the ranks ended, and the budget."""
    return decide(Ended(returncode, 1.0, stall, signal, node, stall_standing=standing, saved_stop=saved),
                  stop_reason, Budget(**{**BASE, **budget}))


@pytest.mark.parametrize("returncode, changes, action", [
    (0, {}, "completed"),
    (STOP_EXIT, {}, "requeue"),
    (STOP_EXIT, {"requeues": 3}, "stopped"),                 # the cap on requeues
    (STOP_EXIT, {"can_requeue": False}, "stopped"),          # local executor
    (1, {}, "failed"),                                        # a crash is not requeued...
    (1, {"retries_on_failure": 1}, "requeue"),                # ...unless asked for
    (1, {"retries_on_failure": 1, "failed_runs": 1}, "failed"),
    (1, {"signal": "SIGTERM"}, "requeue"),                    # mpirun aborted by a preemption's TERM
    # srun's ranks saved a stop (SIGTERM to the steps), then srun SIGKILLed the last one as it
    # exited (--kill-on-bad-exit): a stop, requeued, not a failure restarted in the dying job
    (143, {"saved": "SIGTERM", "max_restarts_in_job": 2}, "requeue"),
    (143, {"signal": "SIGTERM", "can_requeue": False}, "stopped"),
    (0, {"stall": "no rank progressed"}, "failed"),            # torn down: exit status is moot
    (STOP_EXIT, {"stall": "stop ignored", "retries_on_failure": 1}, "requeue"),
    (1, {"stall": "x", "retries_on_failure": 2, "failed_runs": 2}, "failed"),
    # Restarts in the job come first, for a failure and a stall, also without Slurm...
    (1, {"max_restarts_in_job": 2}, "restart"),
    (137, {"max_restarts_in_job": 2, "restarts_in_job": 1, "can_requeue": False}, "restart"),
    (0, {"stall": "x", "max_restarts_in_job": 1}, "restart"),
    # ...then the requeue, which spends checkpoint.retries_on_failure as before...
    (1, {"max_restarts_in_job": 2, "restarts_in_job": 2, "retries_on_failure": 1}, "requeue"),
    (1, {"max_restarts_in_job": 2, "restarts_in_job": 2}, "failed"),
    # ...and never for a stop: the job is ending, or was asked to
    (STOP_EXIT, {"max_restarts_in_job": 2}, "requeue"),
    (1, {"signal": "SIGTERM", "max_restarts_in_job": 2}, "requeue"),
    (STOP_EXIT, {"stall": "stop ignored", "signal": "SIGUSR2", "max_restarts_in_job": 2}, "failed"),
    # A stop that came while the ranks still started (too early for them to obey), or that they
    # had saved and were exiting from: the time limit's, on max_requeues, not a failure
    (1, {"stall": "stop ignored", "signal": "SIGUSR2", "standing": STARTING}, "requeue"),
    (1, {"stall": "stop ignored", "signal": "SIGUSR2", "standing": STARTING, "requeues": 3}, "stopped"),
    (1, {"stall": "stop ignored", "signal": "SIGUSR2", "standing": EXITING}, "requeue"),
    (0, {"stall": "no rank progressed", "standing": EXITING}, "requeue"),  # its own deadline's stop
    (1, {"stall": "no rank progressed", "standing": STARTING}, "failed"),   # no stop: a real stall
    # A dead node: never restarted in the job (it needs the node), requeued on its own budget
    (205, {"node": DEAD, "max_restarts_in_job": 2, "max_node_failures": 1}, "requeue"),
    (205, {"node": DEAD, "max_node_failures": 1, "failed_runs": 5, "retries_on_failure": 1}, "requeue"),
    (0, {"node": DEAD, "stall": "x", "max_node_failures": 2, "node_failures": 1}, "requeue"),
    (205, {"node": DEAD, "max_node_failures": 1, "node_failures": 1, "retries_on_failure": 3}, "failed"),
    (205, {"node": DEAD, "max_node_failures": 1, "can_requeue": False}, "failed"),
    (205, {"node": DEAD, "signal": "SIGTERM", "max_node_failures": 1}, "requeue"),   # a stop first
    # ...unless a hot spare is left: then it goes on in the job without the node
    (205, {"node": DEAD, "spare_hosts": 0, "max_restarts_in_job": 2}, "restart"),
    (205, {"node": DEAD, "spare_hosts": 0, "max_restarts_in_job": 2, "restarts_in_job": 2,
           "max_node_failures": 1}, "requeue"),
    (205, {"node": NodeFault((), "mpirun lost a remote daemon (exit 205)"), "spare_hosts": 1,
           "max_restarts_in_job": 2, "max_node_failures": 1}, "requeue"),   # which node? unknown
])
def test_decide(returncode, changes, action):
    assert _decide(returncode, **changes).action == action


@pytest.mark.parametrize("returncode, changes, cause", [
    (STOP_EXIT, {}, events.CAUSE_STOP),
    (1, {"signal": "SIGTERM"}, events.CAUSE_INTERRUPTED),
    (1, {"retries_on_failure": 1}, events.CAUSE_FAILURE),
    (0, {"stall": "x", "retries_on_failure": 1}, events.CAUSE_STALL),
    (1, {"max_restarts_in_job": 1}, events.CAUSE_FAILURE),
    (0, {"stall": "x", "max_restarts_in_job": 1}, events.CAUSE_STALL),
    (205, {"node": DEAD, "max_node_failures": 1}, events.CAUSE_NODE),
    (205, {"node": DEAD, "signal": "SIGTERM", "max_node_failures": 1}, events.CAUSE_INTERRUPTED),
    (1, {"stall": "x", "signal": "SIGUSR2", "standing": STARTING, "retries_on_failure": 1},
     events.CAUSE_INTERRUPTED),
    (1, {"stall": "x", "signal": "SIGUSR2", "standing": EXITING, "retries_on_failure": 1},
     events.CAUSE_STOP),
    (137, {"saved": "SIGTERM", "max_restarts_in_job": 2}, events.CAUSE_STOP),
])
def test_requeues_and_restarts_say_why_and_failures_are_counted_by_cause(returncode, changes, cause):
    decision = _decide(returncode, **changes)
    assert decision.cause == cause
    assert RunState().with_retry(decision.cause).failed_runs() == (cause in events.FAILURE_CAUSES)


def test_a_spent_retry_budget_names_the_setting():
    decision = _decide(1, retries_on_failure=1, failed_runs=1)
    assert "retries_on_failure=1" in decision.reason
    decision = _decide(1, max_restarts_in_job=2, restarts_in_job=2, retries_on_failure=1)
    assert decision.reason == ("ranks failed (mpirun exit 1); launch.restarts_in_job=2 used up; "
                               "retry 1 of 1")
    assert _decide(1, max_restarts_in_job=2, restarts_in_job=1).reason.endswith("restart 2 of 2 in the job")


def test_a_node_failure_names_its_budget_and_leaves_the_codes_alone():
    decision = _decide(205, node=DEAD, max_node_failures=3, node_failures=1)
    assert decision.reason == "node failure: mpirun lost its daemon on hpcn2; node retry 2 of 3"
    assert RunState().with_retry(decision.cause).failed_runs() == 0
    assert "retries_on_node_failure=3 used up" in _decide(205, node=DEAD, max_node_failures=3,
                                                          node_failures=3).reason


def test_a_retry_that_cannot_happen_is_not_called_used_up():
    # The local executor cannot requeue: the reason says so instead of a spent budget.
    decision = _decide(1, retries_on_failure=1, can_requeue=False)
    assert decision.action == "failed" and "not running under Slurm" in decision.reason
    assert "used up" not in decision.reason


def test_a_stop_is_worded_by_the_ranks_reason_else_the_drivers_signal():
    assert _decide(STOP_EXIT, stop_reason="deadline").reason == "deadline"
    assert _decide(143, signal="SIGTERM", stop_reason=None).reason.startswith("SIGTERM (the ranks")


@pytest.mark.parametrize("job, restart, path", [
    (None, 0, "driver"),                                   # scontrol did not answer: try
    (Job("5", JobState.RUNNING, restarts=0), 0, "driver"),
    (Job("5", JobState.COMPLETING, restarts=1), 0, "slurm"),      # requeued by Slurm already
    (Job("5", JobState.PENDING, reason="BeginTime", restarts=2), 1, "slurm"),
    (Job("5", JobState.COMPLETING, restarts=0), 0, "ending"),     # scancel or the time limit
    (Job("5", JobState.CANCELLED, restarts=3), 3, "ending"),
])
def test_requeue_path_follows_slurms_own_view(job, restart, path):
    assert requeue_path(job, restart) == path


def test_a_job_ended_by_slurm_is_a_timeout_only_past_its_end():
    assert ending_status(1000.0, 999.5) == "timeout"
    assert ending_status(1000.0, 2000.0) == "cancelled"
    assert ending_status(1000.0, None) == "cancelled"


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


def test_an_scontrol_ended_by_its_own_requeues_signal_is_our_requeue(tmp_path, monkeypatch):
    """scontrol runs among the job's processes: the requeue it asked for may SIGTERM it before it
    exits 0 (CI15). The job requeued, scontrol killed by a signal: the requeue was ours."""
    from hpc_train import scheduler

    _fake_scontrol(tmp_path, monkeypatch, restarts=3, refusal="")
    script = tmp_path / "scontrol"
    script.write_text(script.read_text().replace('echo "" >&2; exit 1', "kill -TERM $$"))
    by, detail = scheduler.requeue("5", restart=2, attempts=2)
    assert by == "driver" and "exit -15" in detail, detail

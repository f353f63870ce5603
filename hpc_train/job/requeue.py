"""What the driver does once the ranks have exited, and recording what really happened.

`decide` (pure) turns how the ranks ended into an action; `requeue_path` (pure) checks that
action against Slurm's own view of the job, so the outcome we record is the one Slurm carries
out: a job that Slurm has requeued already is not requeued twice, a job that Slurm is ending
(cancelled, timed out) is not recorded as requeued, and a requeue that Slurm refuses fails the
job with that reason instead of letting it end COMPLETED half-trained.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpc_train import events
from hpc_train.job.node_fault import NodeFault
from hpc_train.job.watchdog import Standing
from hpc_train.runtime.stop import STOP_EXIT
from hpc_train.scheduler import Job


@dataclass(frozen=True)
class Decision:
    action: str               # "completed" | "restart" (in the job) | "requeue" | "stopped" | "failed"
    reason: str
    cause: str | None = None  # for "restart" and "requeue": events.CAUSE_*


@dataclass(frozen=True)
class Ended:
    """How one start of the ranks ended: the launcher's exit status, after how long; why the
    watchdog tore them down, if it did; the stop signal the driver got and forwarded, if any."""
    returncode: int
    seconds: float = 0.0
    stall: str | None = None
    signal: str | None = None
    node_fault: NodeFault | None = None    # the ranks ended because a node died
    driver_cpu_seconds: float | None = None  # the driver's CPU time while the ranks ran
    stall_standing: Standing = Standing.TRAINING   # where the stalled ranks stood (watchdog.py)
    # The stop the ranks agreed on and saved in this start (their `stop_saved` reason), if any.
    # srun ends the last ranks of a step once one has exited non-zero (--kill-on-bad-exit), so a
    # stop the ranks saved may come back as a SIGKILLed step (exit 137 or 143), not STOP_EXIT.
    saved_stop: str | None = None


@dataclass(frozen=True)
class Budget:
    """What the run has spent and may spend: requeues (SLURM_RESTART_COUNT) against
    checkpoint.max_requeues; earlier runs that failed or stalled and were requeued (the run
    state) against checkpoint.retries_on_failure; restarts in this job against
    launch.restarts_in_job; requeues after a node's death against
    checkpoint.retries_on_node_failure, a restart without it against the hosts left beyond
    the fewest the ranks need (slurm.spare_nodes, or slurm.nodes a range). can_requeue: under
    Slurm (not submitit's local executor)."""
    requeues: int = 0
    max_requeues: int = 0
    failed_runs: int = 0
    retries_on_failure: int = 0
    restarts_in_job: int = 0
    max_restarts_in_job: int = 0
    node_failures: int = 0
    max_node_failures: int = 0
    spare_hosts: int = -1       # hosts of the job left beyond the fewest the ranks need, after a loss
    can_requeue: bool = True


PREEMPTED = "preempted"      # the driver's stop reason when its sentinel step heard SIGTERM


def stop_kind(driver_signal: str | None, ranks_reason: str | None) -> str | None:
    """What asked for a stop (events.STOP_KINDS), from the driver's own signal (or its
    sentinel's word) and the reason the ranks agreed on; None when nothing asked.

    Slurm sends a preemption's grace to the job's steps only: a driver that heard nothing while
    its ranks stopped on SIGTERM has srun's ranks, a step, signalled (so has `scancel
    --signal=TERM` without --full: Slurm's word cannot tell them apart)."""
    if driver_signal == PREEMPTED:
        return events.STOP_PREEMPTED
    if driver_signal == "SIGUSR2":
        return events.STOP_TIME_LIMIT        # the --signal=B:USR2@<slurm.signal_seconds> we submit
    if driver_signal is not None:
        return events.STOP_SIGNAL
    return {"SIGTERM": events.STOP_PREEMPTED, "deadline": events.STOP_TIME_LIMIT,
            "SIGUSR2": events.STOP_SIGNAL}.get(ranks_reason or "")


def stop_words(driver_signal: str | None, ranks_reason: str | None) -> str | None:
    """A stop's reason for people: the signal, and what it means when that is known."""
    said = driver_signal or ranks_reason
    if stop_kind(driver_signal, ranks_reason) == events.STOP_PREEMPTED:
        return "preempted (Slurm signalled the job's steps: its grace began)"
    return said


def decide(ended: Ended, stop_reason: str | None, budget: Budget) -> Decision:
    """What to do once the ranks have exited. A stall's exit status means nothing (the watchdog
    ended them). A failure or a stall restarts the ranks in the job while launch.restarts_in_job
    allows, then requeues while checkpoint.retries_on_failure allows.

    ended.signal: the job itself got a stop signal. A preemption or `scancel --signal=TERM`
    signals every process of the job, mpirun included, and Open MPI aborts on SIGTERM, killing
    the ranks before they save: that is an interruption (resume from the last complete
    checkpoint), not a failure of the training; and the job is ending: no restart in it.
    """
    if ended.node_fault is not None and ended.signal is None:
        return _after_node_fault(ended.node_fault, budget)
    exiting = ended.stall_standing == Standing.EXITING
    if ended.stall is not None and (exiting or (ended.stall_standing == Standing.STARTING
                                                and ended.signal)):
        # Ended while exiting after the stop's checkpoint: a stop, resumed from that checkpoint.
        # Or the stop came while they still started, too early for them to obey: an
        # interruption (resume from the checkpoint before it). Neither is a failure.
        return _after_stop(f"{stop_reason or ended.signal or 'stopped'} (the ranks were ended: "
                           f"{ended.stall})",
                           events.CAUSE_STOP if exiting else events.CAUSE_INTERRUPTED, budget)
    if ended.stall is not None:
        return _after_failure(f"stall: {ended.stall}", events.CAUSE_STALL, budget,
                              in_job=ended.signal is None)
    if ended.returncode == 0:
        return Decision("completed", "all ranks finished")
    if ended.returncode == STOP_EXIT or ended.signal is not None or ended.saved_stop:
        reason = stop_reason or ended.signal or ended.saved_stop or "stopped"
        cause = events.CAUSE_STOP
        if ended.returncode != STOP_EXIT and ended.saved_stop:
            reason += f" (saved; the launcher ended the last ranks as they exited, exit {ended.returncode})"
        elif ended.returncode != STOP_EXIT:
            reason += f" (the ranks were ended by it, exit {ended.returncode})"
            cause = events.CAUSE_INTERRUPTED
        return _after_stop(reason, cause, budget)
    return _after_failure(f"ranks failed (mpirun exit {ended.returncode})", events.CAUSE_FAILURE,
                          budget, in_job=True)


def _after_stop(reason: str, cause: str, budget: Budget) -> Decision:
    """A stop (saved, or the ranks ended by it): a requeue while checkpoint.max_requeues allows."""
    if not budget.can_requeue:
        return Decision("stopped", f"{reason}; not running under Slurm, so not requeued")
    if budget.requeues >= budget.max_requeues:
        return Decision("stopped", f"{reason}; checkpoint.max_requeues={budget.max_requeues} reached")
    return Decision("requeue", reason, cause)


def _after_node_fault(fault: NodeFault, budget: Budget) -> Decision:
    """A dead node: a restart in the job without it where a spare host is left (and the
    restarts in the job allow), else a requeue without it, spending its own budget and none
    of checkpoint.retries_on_failure."""
    what = f"node failure: {fault.why}"
    if fault.nodes and budget.spare_hosts >= 0 and budget.restarts_in_job < budget.max_restarts_in_job:
        return Decision("restart", f"{what}; going on without {', '.join(fault.nodes)} (on a "
                                   f"spare, or the survivors where slurm.nodes is a range), "
                                   f"restart {budget.restarts_in_job + 1} of "
                                   f"{budget.max_restarts_in_job} in the job", events.CAUSE_NODE)
    if not budget.can_requeue:
        return Decision("failed", f"{what}; not running under Slurm, so not requeued")
    if budget.node_failures < budget.max_node_failures:
        return Decision("requeue", f"{what}; node retry {budget.node_failures + 1} of "
                                   f"{budget.max_node_failures}", events.CAUSE_NODE)
    return Decision("failed", f"{what}; checkpoint.retries_on_node_failure="
                              f"{budget.max_node_failures} used up")


def _after_failure(what: str, cause: str, budget: Budget, in_job: bool) -> Decision:
    if in_job and budget.restarts_in_job < budget.max_restarts_in_job:
        return Decision("restart", f"{what}; restart {budget.restarts_in_job + 1} of "
                                   f"{budget.max_restarts_in_job} in the job", cause)
    if in_job and budget.max_restarts_in_job:
        what += f"; launch.restarts_in_job={budget.max_restarts_in_job} used up"
    if not budget.retries_on_failure:
        return Decision("failed", what)
    if not budget.can_requeue:
        return Decision("failed", f"{what}; not running under Slurm, so not retried")
    if budget.failed_runs < budget.retries_on_failure:
        return Decision("requeue", f"{what}; retry {budget.failed_runs + 1} of "
                                   f"{budget.retries_on_failure}", cause)
    return Decision("failed", f"{what}; checkpoint.retries_on_failure="
                              f"{budget.retries_on_failure} used up")


def requeue_path(job: Job | None, restart: int) -> str:
    """How a wanted requeue happens, from `scontrol show job` (None: it did not answer):
    "slurm"  Slurm requeued the job already (its restart count went past ours: an external
             `scontrol requeue`, a preemption with requeue);
    "driver" the job still runs: we requeue it;
    "ending" Slurm is ending the job for good (cancelled, time limit): nothing can requeue it."""
    if job is None:
        return "driver"
    if job.restarts > restart:
        return "slurm"
    if job.state == "RUNNING":
        return "driver"
    return "ending"


def ending_status(now: float, end_time: float | None) -> str:
    """A job that Slurm ends without a requeue: past its end time it timed out, else cancelled."""
    return "timeout" if end_time is not None and now >= end_time - 1 else "cancelled"

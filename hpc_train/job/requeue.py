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
from hpc_train.runtime.stop import STOP_EXIT
from hpc_train.scheduler import Job


@dataclass(frozen=True)
class Decision:
    action: str               # "completed" | "requeue" | "stopped" | "failed"
    reason: str
    cause: str | None = None  # for "requeue": events.CAUSE_*


def decide(returncode: int, *, stop_reason: str | None, restarts: int, failed_runs: int,
           max_requeues: int, retries_on_failure: int, can_requeue: bool,
           driver_signalled: bool = False, stall: str | None = None) -> Decision:
    """restarts: requeues so far (SLURM_RESTART_COUNT); failed_runs: earlier runs that failed or
    stalled. stall: why the watchdog tore the ranks down (then their exit status means nothing).

    driver_signalled: the job itself got a stop signal. A preemption or `scancel --signal=TERM`
    signals every process of the job, mpirun included, and Open MPI aborts on SIGTERM, killing
    the ranks before they save: that is an interruption (resume from the last complete
    checkpoint), not a failure of the training.
    """
    if stall is not None:
        return _retry_or_fail(f"stall: {stall}", events.CAUSE_STALL, can_requeue, failed_runs,
                              retries_on_failure)
    if returncode == 0:
        return Decision("completed", "all ranks finished")
    if returncode == STOP_EXIT or driver_signalled:
        reason = stop_reason or "stopped"
        cause = events.CAUSE_STOP
        if returncode != STOP_EXIT:
            reason += f" (the ranks were ended by it, exit {returncode})"
            cause = events.CAUSE_INTERRUPTED
        if not can_requeue:
            return Decision("stopped", f"{reason}; not running under Slurm, so not requeued")
        if restarts >= max_requeues:
            return Decision("stopped", f"{reason}; checkpoint.max_requeues={max_requeues} reached")
        return Decision("requeue", reason, cause)
    return _retry_or_fail(f"ranks failed (mpirun exit {returncode})", events.CAUSE_FAILURE,
                          can_requeue, failed_runs, retries_on_failure)


def _retry_or_fail(what: str, cause: str, can_requeue: bool, failed_runs: int,
                   retries_on_failure: int) -> Decision:
    if not retries_on_failure:
        return Decision("failed", what)
    if not can_requeue:
        return Decision("failed", f"{what}; not running under Slurm, so not retried")
    if failed_runs < retries_on_failure:
        return Decision("requeue", f"{what}; retry {failed_runs + 1} of {retries_on_failure}", cause)
    return Decision("failed", f"{what}; checkpoint.retries_on_failure={retries_on_failure} used up")


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

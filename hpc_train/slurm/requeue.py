"""What the driver does once the ranks have exited (pure), and the Slurm calls that do it."""

from __future__ import annotations

import time
from dataclasses import dataclass
from datetime import datetime

from hpc_train import _proc
from hpc_train.runtime.stop import STOP_EXIT


@dataclass(frozen=True)
class Decision:
    action: str        # "completed" | "requeue" | "stopped" | "failed"
    reason: str


def decide(returncode: int, *, stop_reason: str | None, restarts: int, failed_runs: int,
           max_requeues: int, retries_on_failure: int, can_requeue: bool,
           driver_signalled: bool = False) -> Decision:
    """restarts: requeues so far (SLURM_RESTART_COUNT); failed_runs: earlier runs that crashed.

    driver_signalled: the job itself got a stop signal. A preemption or `scancel --signal=TERM`
    signals every process of the job, mpirun included, and Open MPI aborts on SIGTERM, killing
    the ranks before they save: that is an interruption (resume from the last complete
    checkpoint), not a failure of the training.
    """
    if returncode == 0:
        return Decision("completed", "all ranks finished")
    if returncode == STOP_EXIT or driver_signalled:
        reason = stop_reason or "stopped"
        if returncode != STOP_EXIT:
            reason += f" (ranks ended by it, exit {returncode}: resuming from the last complete checkpoint)"
        if not can_requeue:
            return Decision("stopped", f"{reason}; not running under Slurm, so not requeued")
        if restarts >= max_requeues:
            return Decision("stopped", f"{reason}; checkpoint.max_requeues={max_requeues} reached")
        return Decision("requeue", reason)
    if can_requeue and failed_runs < retries_on_failure:
        return Decision("requeue", f"failure (exit {returncode}), retry {failed_runs + 1} of "
                                   f"{retries_on_failure}")
    return Decision("failed", f"ranks failed (mpirun exit {returncode})")


def parse_slurm_time(text: str) -> float | None:
    """squeue's %e ('2026-11-29T17:05:00', local time) -> UNIX time; None for 'N/A', 'Unknown'."""
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def job_end_time(job_id: str, environ) -> float | None:
    """When Slurm will end this job: SLURM_JOB_END_TIME where set, else squeue."""
    if value := environ.get("SLURM_JOB_END_TIME"):
        return float(value)
    out = _proc.run(["squeue", "-h", "-j", job_id, "-o", "%e"], timeout=20)
    return parse_slurm_time(out.stdout) if out.ok else None


def job_state(job_id: str) -> str:
    return _proc.run(["squeue", "-h", "-j", job_id, "-o", "%T"], timeout=20).stdout.strip()


def requeue(job_id: str) -> tuple[bool, str]:
    """`scontrol requeue`: the job keeps its id and SLURM_RESTART_COUNT goes up by one.

    An external requeue or a preemption may have requeued it already; then ours is not needed.
    """
    state = job_state(job_id)
    if state and state != "RUNNING":
        return False, f"job is {state} already"
    for attempt in range(2):
        out = _proc.run(["scontrol", "requeue", job_id], timeout=30)
        if out.ok:
            return True, "scontrol requeue accepted"
        time.sleep(1 + attempt)
    return False, out.stderr.strip() or f"scontrol requeue exit {out.returncode}"

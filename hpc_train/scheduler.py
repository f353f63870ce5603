"""What Slurm says about one job, and the one change we ask of it (requeue). Commands are argv
lists with timeouts (`_proc.run`); the parsers are pure and take the commands' text.

Used inside the job (the driver's requeue) and on the login node (resume's guard), so it sits in
the base layer with nothing of ours above it.
"""

from __future__ import annotations

import os
import re
import time
from dataclasses import dataclass
from datetime import datetime

from hpc_train import _proc

# Job states in which the job is still Slurm's to run: a second writer must not be started.
ACTIVE_STATES = ("PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD",
                 "REQUEUE_FED", "RESIZING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "STOPPED",
                 "RESV_DEL_HOLD", "SPECIAL_EXIT")
# scontrol's words (ESLURM_JOB_PENDING) for a job that Slurm has put back in the queue already.
ALREADY_PENDING = "Job is pending execution"
_FIELD = re.compile(r"(?:^|\s)([A-Za-z:/_]+)=(\S*)")


@dataclass(frozen=True)
class JobRecord:
    state: str            # JobState: RUNNING, COMPLETING, PENDING, ...
    restarts: int         # requeues so far: Slurm counts one as soon as it requeues the job
    reason: str


def job_ref(environ) -> str | None:
    """How Slurm commands must name the job this process runs in: `<array job>_<task>` for a task
    of a job array, else SLURM_JOB_ID; None outside Slurm.

    An array task has a job id of its own (SLURM_JOB_ID), but one task's id is the array's id
    itself, and `scontrol requeue <array id>` requeues every task of the array: a member of a
    sweep must only ever requeue itself.
    """
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return environ.get("SLURM_JOB_ID") or None


def parse_slurm_time(text: str) -> float | None:
    """squeue's %e ('2026-11-29T17:05:00', local time) -> UNIX time; None for 'N/A', 'Unknown'."""
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def parse_show_job(text: str) -> JobRecord | None:
    """`scontrol show job -o ID` (one line of Key=Value) -> state, restart count, reason."""
    fields = dict(_FIELD.findall(text))
    if "JobState" not in fields:
        return None
    try:
        restarts = int(fields.get("Restarts", "0"))
    except ValueError:
        restarts = 0
    return JobRecord(fields["JobState"], restarts, fields.get("Reason", ""))


def controller_problem(environ=None, timeout: float = 15) -> str | None:
    """None when Slurm's controller answers `scontrol ping`; else why not, in one line: a
    stopped slurmctld, no configuration at all (Slurm then tries DNS SRV records), or a
    SLURM_CONF that names no file (which Slurm's clients would retry for a minute)."""
    environ = os.environ if environ is None else environ
    conf = environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):
        return f"SLURM_CONF={conf} is not a file"
    out = _proc.run(["scontrol", "ping"], timeout=timeout)
    if out.ok and " is UP" in out.stdout:
        return None
    lines = [line.strip() for line in (out.stdout + out.stderr).splitlines()
             if line.strip() and not line.startswith("*")]
    return lines[0] if lines else f"scontrol ping exited {out.returncode}"


def show_job(job_id: str, timeout: float = 20) -> JobRecord | None:
    out = _proc.run(["scontrol", "show", "job", "-o", job_id], timeout=timeout)
    return parse_show_job(out.stdout) if out.ok else None


def queue_state(job_id: str, timeout: float = 20) -> str | None:
    """squeue's state of the job; "" when Slurm no longer lists it; None when squeue fails."""
    out = _proc.run(["squeue", "-h", "-j", job_id, "-o", "%T"], timeout=timeout)
    if not out.ok:
        # squeue exits non-zero for an id that has left the controller's memory.
        return "" if "Invalid job id" in out.stderr else None
    return out.stdout.strip().splitlines()[0] if out.stdout.strip() else ""


def job_end_time(job_id: str, environ) -> float | None:
    """When Slurm will end this job: SLURM_JOB_END_TIME where set, else squeue."""
    if value := environ.get("SLURM_JOB_END_TIME"):
        return float(value)
    out = _proc.run(["squeue", "-h", "-j", job_id, "-o", "%e"], timeout=20)
    return parse_slurm_time(out.stdout) if out.ok else None


def requeue(job_id: str, restart: int, attempts: int = 3) -> tuple[str | None, str]:
    """`scontrol requeue`, tried `attempts` times: (who requeued the job, what happened); who is
    "driver" (our scontrol was accepted), "slurm" (refused because Slurm requeued the job
    meanwhile: its restart count went up, or scontrol says it is pending), or None.
    restart: this run's SLURM_RESTART_COUNT."""
    detail = ""
    for attempt in range(attempts):
        out = _proc.run(["scontrol", "requeue", job_id], timeout=30)
        if out.ok:
            return "driver", "scontrol requeue accepted"
        detail = (out.stderr or out.stdout).strip() or f"scontrol requeue exit {out.returncode}"
        job = show_job(job_id)
        if (job is not None and job.restarts > restart) or ALREADY_PENDING in detail:
            return "slurm", f"requeued already; scontrol said: {detail}"
        if attempt + 1 < attempts:
            time.sleep(1 + attempt)
    return None, detail

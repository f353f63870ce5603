"""What Slurm says about a workflow's jobs: one squeue and one sacct for all of them.

squeue (live: state, why a job pends) wins over sacct (also ended jobs: state, elapsed time,
exit code); either may be missing (accounting off, purged jobs), and the caller then falls back
on the workflow's files. Array tasks come back as `<array>_<task>` rows.
"""

from __future__ import annotations

from dataclasses import replace

from hpc_train import scheduler
from hpc_train.scheduler import ACTIVE_STATES, FAILED_STATES, RUNNING_STATES, Job


def query(job_ids: list[str], timeout: float = 10.0) -> dict[str, Job] | None:
    """Rows for the jobs (array parents expanded into tasks); None when neither command answers.
    A sacct row for tasks that never started stands for each of them (squeue's live rows, read
    after, win for the pending ones); the last sacct row of a job wins."""
    if not job_ids:
        return {}
    acct = scheduler.accounted(job_ids, timeout)
    live = scheduler.queue(job_ids, timeout)
    if acct is None and live is None:
        return None
    rows = {task: replace(job, job_id=task) for job in acct or []
            for task in scheduler.array_tasks(job.job_id)}
    rows.update({job.job_id: job for job in live or []})
    return rows


def rows_of(rows: dict[str, Job], job_id: str) -> list[Job]:
    """The rows of one job: itself, or every task of an array (`job_id` its parent)."""
    if job_id in rows and "_" in job_id:
        return [rows[job_id]]
    tasks = [row for key, row in rows.items() if key.startswith(job_id + "_")]
    if tasks:
        return sorted(tasks, key=lambda r: int(r.job_id.rsplit("_", 1)[1]))
    return [rows[job_id]] if job_id in rows else []


def combine(states: list[str]) -> str:
    """One state for several jobs (a stage, a sweep): a failure first, then work still to do,
    then a cancel; COMPLETED only when every one completed."""
    if not states:
        return "UNKNOWN"
    for bad in FAILED_STATES:
        if bad in states:
            return bad
    if any(s in RUNNING_STATES for s in states):
        return "RUNNING"
    if any(s in ACTIVE_STATES for s in states):
        return "PENDING"
    if "CANCELLED" in states:
        return "CANCELLED"
    return "COMPLETED" if all(s == "COMPLETED" for s in states) else states[-1]

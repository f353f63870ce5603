"""What Slurm says about a workflow's jobs: one squeue and one sacct for all of them.

squeue (live: state, why a job pends) wins over sacct (also ended jobs: state, elapsed time,
exit code); either may be missing (accounting off, purged jobs), and the caller then falls back
on the workflow's files. Array tasks come back as `<array>_<task>` rows. Parsers are pure.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpc_train import _proc
from hpc_train.inspection.sacct import parse_duration
from hpc_train.scheduler import ACTIVE_STATES

FAILED_STATES = ("FAILED", "OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "DEADLINE",
                 "PREEMPTED")
RUNNING_STATES = ("RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT", "RESIZING")


@dataclass(frozen=True)
class JobRow:
    job_id: str              # "123", or "123_4" for an array task
    state: str
    reason: str              # squeue's why-pending, or sacct's Reason
    elapsed: float | None    # seconds
    exit_code: str = ""


def parse_squeue(text: str) -> dict[str, JobRow]:
    """`squeue -h -r -o %i|%T|%r|%M` lines (one per array task with -r)."""
    rows = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) == 4:
            job, state, reason, elapsed = (f.strip() for f in fields)
            rows[job] = JobRow(job, state, "" if reason == "None" else reason, parse_duration(elapsed))
    return rows


def array_tasks(job: str) -> list[str]:
    """`123_[0-2,5%2]` -> 123_0, 123_1, 123_2, 123_5 (tasks sacct lists as one row: never started,
    e.g. cancelled while pending); any other id -> itself."""
    head, bracket, rest = job.partition("_[")
    if not bracket:
        return [job]
    tasks = []
    for part in rest.rstrip("]").split("%")[0].split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            tasks += [f"{head}_{t}" for t in range(int(low), int(high or low) + 1)]
    return tasks


def parse_sacct(text: str) -> dict[str, JobRow]:
    """`sacct -X -n -P -o JobID,State,Reason,Elapsed,ExitCode` lines; the last row of a job wins.
    A row for tasks that never started stands for each of them (squeue's live rows, read
    after, win for the pending ones)."""
    rows = {}
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) != 5:
            continue
        job, state, reason, elapsed, exit_code = (f.strip() for f in fields)
        for task in array_tasks(job):
            rows[task] = JobRow(task, state.split()[0] if state else "UNKNOWN",
                                "" if reason == "None" else reason, parse_duration(elapsed), exit_code)
    return rows


def query(job_ids: list[str], timeout: float = 10.0) -> dict[str, JobRow] | None:
    """Rows for the jobs (array parents expanded into tasks); None when neither command answers."""
    if not job_ids:
        return {}
    ids = ",".join(job_ids)
    acct = _proc.run(["sacct", "-X", "-n", "-P", "-o", "JobID,State,Reason,Elapsed,ExitCode",
                      "-j", ids], timeout=timeout)
    live = _proc.run(["squeue", "-h", "-r", "-j", ids, "-o", "%i|%T|%r|%M"], timeout=timeout)
    if not acct.ok and not live.ok:
        return None
    rows = parse_sacct(acct.stdout) if acct.ok else {}
    rows.update(parse_squeue(live.stdout) if live.ok else {})
    return rows


def rows_of(rows: dict[str, JobRow], job_id: str) -> list[JobRow]:
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


def is_active(state: str) -> bool:
    return state in ACTIVE_STATES


def cancel(job_ids: list[str], timeout: float = 30.0) -> str | None:
    """scancel the jobs (array parents cancel every task); the error, or None."""
    if not job_ids:
        return None
    out = _proc.run(["scancel", *job_ids], timeout=timeout)
    return None if out.ok else (out.stderr or out.stdout).strip() or f"scancel exit {out.returncode}"

"""The event vocabulary of a workflow directory's events.jsonl (as hpc_train/events.py is a run's).

Every writer calls a constructor below and `record`; every reader a named query. Lines are
written whole or not at all (rundir.append_jsonl), each with `time` and `event`.

| event | fields |
|---|---|
| created | file, executor (slurm/local), overrides |
| stage_submitted | stage, jobs ({part: job id}), members ({index: job id}, sweeps), again |
| stage_skipped | stage, why (resume: its outputs are complete) |
| submission_failed | stage, error, cancelled (job ids), cancel_error |
| cancelled | jobs (job ids), error |
| best_chosen | stage, index, run_dir, metric, value, mode |
| stage_started / stage_finished | stage, (status, seconds, detail): the local executor |
"""

from __future__ import annotations

import time

from hpc_train.rundir import append_jsonl, read_jsonl
from hpc_train.workflow.paths import WorkflowPaths

CREATED = "created"
STAGE_SUBMITTED = "stage_submitted"
STAGE_SKIPPED = "stage_skipped"
SUBMISSION_FAILED = "submission_failed"
CANCELLED = "cancelled"
BEST_CHOSEN = "best_chosen"
STAGE_STARTED = "stage_started"
STAGE_FINISHED = "stage_finished"
ALL = (CREATED, STAGE_SUBMITTED, STAGE_SKIPPED, SUBMISSION_FAILED, CANCELLED, BEST_CHOSEN,
       STAGE_STARTED, STAGE_FINISHED)


def created(file: str, executor: str, overrides: list[str]) -> dict:
    return {"event": CREATED, "file": file, "executor": executor, "overrides": overrides}


def stage_submitted(stage: str, jobs: dict[str, str], members: dict[int, str] | None = None,
                    again: bool = False) -> dict:
    """jobs: part -> job id (parts: main, array, manifest, train, sweep); members: a sweep's
    index -> `<array>_<index>` of the members in this submission."""
    return {"event": STAGE_SUBMITTED, "stage": stage, "jobs": jobs,
            "members": {str(k): v for k, v in (members or {}).items()}, "again": again}


def stage_skipped(stage: str, why: str) -> dict:
    return {"event": STAGE_SKIPPED, "stage": stage, "why": why}


def submission_failed(stage: str, error: str, cancelled: list[str], cancel_error: str | None) -> dict:
    return {"event": SUBMISSION_FAILED, "stage": stage, "error": error, "cancelled": cancelled,
            "cancel_error": cancel_error}


def cancelled(jobs: list[str], error: str | None) -> dict:
    return {"event": CANCELLED, "jobs": jobs, "error": error}


def best_chosen(stage: str, index: int, run_dir: str, metric: str, value: float, mode: str) -> dict:
    return {"event": BEST_CHOSEN, "stage": stage, "index": index, "run_dir": run_dir,
            "metric": metric, "value": value, "mode": mode}


def stage_started(stage: str) -> dict:
    return {"event": STAGE_STARTED, "stage": stage}


def stage_finished(stage: str, status: str, seconds: float, detail: str = "") -> dict:
    """status: a Slurm-like state, COMPLETED, FAILED or CANCELLED (a dependency failed)."""
    return {"event": STAGE_FINISHED, "stage": stage, "status": status, "seconds": seconds,
            "detail": detail}


def record(paths: WorkflowPaths, event: dict) -> None:
    if event.get("event") not in ALL:
        raise ValueError(f"not a workflow event: {event.get('event')!r}")
    append_jsonl(paths.events, {"time": time.time(), **event})


def read(paths: WorkflowPaths) -> list[dict]:
    return read_jsonl(paths.events)


# -- queries ---------------------------------------------------------------------------------------

def _named(history: list[dict], event: str, stage: str | None = None) -> list[dict]:
    """The events called `event` (of `stage`, when given), in order."""
    return [e for e in history if e.get("event") == event and (stage is None or e.get("stage") == stage)]


def executor(history: list[dict]) -> str:
    found = _named(history, CREATED)
    return found[0].get("executor", "slurm") if found else "slurm"


def stage_jobs(history: list[dict], stage: str) -> dict[str, str]:
    """The stage's latest submission: part -> job id ({} when never submitted)."""
    found = _named(history, STAGE_SUBMITTED, stage)
    return dict(found[-1].get("jobs", {})) if found else {}


def member_jobs(history: list[dict], stage: str) -> dict[int, str]:
    """A sweep's members -> the job id of each one's latest submission (`<array>_<index>`)."""
    return {int(k): v for e in _named(history, STAGE_SUBMITTED, stage)
            for k, v in e.get("members", {}).items()}


def all_jobs(history: list[dict]) -> list[str]:
    """Every job id the workflow ever submitted, in order (cancel asks Slurm about each)."""
    return list(dict.fromkeys(job for e in _named(history, STAGE_SUBMITTED)
                              for job in e.get("jobs", {}).values()))


def best_choice(history: list[dict], stage: str) -> dict | None:
    found = _named(history, BEST_CHOSEN, stage)
    return found[-1] if found else None


def local_state(history: list[dict], stage: str) -> tuple[str, dict | None]:
    """The local executor's state of a stage: PENDING, RUNNING or its finished status."""
    state, last = "PENDING", None
    for e in history:
        if e.get("stage") != stage:
            continue
        if e.get("event") == STAGE_STARTED:
            state, last = "RUNNING", e
        elif e.get("event") == STAGE_FINISHED:
            state, last = e.get("status", "FAILED"), e
    return state, last


def submission_failure(history: list[dict]) -> dict | None:
    """The last submission that failed midway, unless a later one (resume) went through."""
    for e in reversed(history):
        if e.get("event") == SUBMISSION_FAILED:
            return e
        if e.get("event") == STAGE_SUBMITTED:
            return None
    return None

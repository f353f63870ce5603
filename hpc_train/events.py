"""The event vocabulary of a run: what `events.jsonl` may hold, and the questions asked of it.

This module is the only place that spells an event's name or reads its fields by string: every
writer calls a constructor below and `record`, every reader a named query. The whole list, with
each event's fields, is in docs/run-directory.md (a test keeps the two in step).

An event is one JSON line, written whole or not at all (`rundir.append_jsonl`), with `time`, and
`job_id`/`restart` when written inside a Slurm job. Writers inside a job use `try_record`: a
full disk must not kill the driver that is about to requeue the job.
"""

from __future__ import annotations

import logging
import os
import time

from hpc_train.rundir import RunPaths, append_jsonl, read_jsonl

log = logging.getLogger("hpc_train.events")

SUBMITTED = "submitted"
SUBMIT_FAILED = "submit_failed"
RESUBMITTED = "resubmitted"
SPEC_CHANGE_ALLOWED = "spec_change_allowed"
STARTED = "started"
TRAINING_STARTED = "training_started"
RESUMED = "resumed"
CHECKPOINT_SKIPPED = "checkpoint_skipped"
CHECKPOINT_SAVED = "checkpoint_saved"
STOP_REQUESTED = "stop_requested"
STOP_SAVED = "stop_saved"
RANK_FAILED = "rank_failed"
RANK_FINISHED = "rank_finished"
PIPELINE_CUT = "pipeline_cut"
RANKS_STALLED = "ranks_stalled"
REQUEUED = "requeued"
FINISHED = "finished"

ALL = (SUBMITTED, SUBMIT_FAILED, RESUBMITTED, SPEC_CHANGE_ALLOWED, STARTED, TRAINING_STARTED,
       RESUMED, CHECKPOINT_SKIPPED, CHECKPOINT_SAVED, STOP_REQUESTED, STOP_SAVED, RANK_FAILED,
       RANK_FINISHED, PIPELINE_CUT, RANKS_STALLED, REQUEUED, FINISHED)

# Why a run was requeued (`requeued.cause`). Failures and stalls count toward
# checkpoint.retries_on_failure; stops and interruptions toward checkpoint.max_requeues.
CAUSE_STOP = "stop"                # the ranks agreed on a stop and saved (time limit, USR2)
CAUSE_INTERRUPTED = "interrupted"  # a signal to the whole job ended the ranks (preemption, requeue)
CAUSE_FAILURE = "failure"          # a rank failed
CAUSE_STALL = "stall"              # the watchdog found no progress and tore the ranks down
FAILURE_CAUSES = (CAUSE_FAILURE, CAUSE_STALL)

# How a job ended for good (`finished.status`), and the Slurm-like state each one shows as.
FINISHED_STATES = {"completed": "COMPLETED", "failed": "FAILED", "stopped": "STOPPED",
                   "cancelled": "CANCELLED", "timeout": "TIMEOUT"}
_QUEUED_STATES = {SUBMITTED: "PENDING", RESUBMITTED: "PENDING", STARTED: "RUNNING",
                  REQUEUED: "PENDING", SUBMIT_FAILED: "FAILED"}


# -- constructors: one per event -----------------------------------------------------------------

def submitted(job_id: str, executor: str, spec_hash: str) -> dict:
    return {"event": SUBMITTED, "job_id": job_id, "executor": executor, "spec_hash": spec_hash}


def submit_failed(error: str) -> dict:
    return {"event": SUBMIT_FAILED, "error": error}


def resubmitted(job_id: str, executor: str) -> dict:
    return {"event": RESUBMITTED, "job_id": job_id, "executor": executor}


def spec_change_allowed(from_hash: str, to_hash: str, keys: list[str]) -> dict:
    return {"event": SPEC_CHANGE_ALLOWED, "from_hash": from_hash, "to_hash": to_hash, "keys": keys}


def started(hosts: list[str], ranks: int, deadline: float | None, argv: list[str],
            stall_seconds: float) -> dict:
    return {"event": STARTED, "hosts": hosts, "ranks": ranks, "deadline": deadline, "argv": argv,
            "stall_seconds": stall_seconds}


def training_started(**fields) -> dict:
    """total_steps, steps_per_epoch, world_size, global_batch, peak_lr, device."""
    return {"event": TRAINING_STARTED, **fields}


def resumed(step: int, from_checkpoint: int, spec_changed: list[str], saved_world_size,
            skipped: list[int]) -> dict:
    return {"event": RESUMED, "step": step, "from_checkpoint": from_checkpoint,
            "spec_changed": spec_changed, "saved_world_size": saved_world_size, "skipped": skipped}


def checkpoint_skipped(step: int, error: str) -> dict:
    return {"event": CHECKPOINT_SKIPPED, "step": step, "error": error}


def checkpoint_saved(step: int, reason: str, path: str, seconds: float) -> dict:
    return {"event": CHECKPOINT_SAVED, "step": step, "reason": reason, "path": path,
            "seconds": seconds}


def stop_requested(reason: str, source: str) -> dict:
    return {"event": STOP_REQUESTED, "reason": reason, "source": source}


def stop_saved(step: int, reason: str) -> dict:
    return {"event": STOP_SAVED, "step": step, "reason": reason}


def rank_failed(rank: int, error: str, traceback: str) -> dict:
    return {"event": RANK_FAILED, "rank": rank, "error": error, "traceback": traceback}


def rank_finished(rank: int, step: int, params_sha256: str, **identity) -> dict:
    return {"event": RANK_FINISHED, "rank": rank, "step": step, "params_sha256": params_sha256,
            **identity}


def pipeline_cut(sizes: list[int], balance) -> dict:
    return {"event": PIPELINE_CUT, "sizes": sizes, "balance": balance}


def ranks_stalled(why: str, ranks: list[dict], idle_seconds: float) -> dict:
    """ranks: one dict per stalled rank: rank, host, pid, step, phase, idle_seconds, state."""
    return {"event": RANKS_STALLED, "why": why, "ranks": ranks, "idle_seconds": idle_seconds}


def requeued(reason: str, cause: str, by: str, detail: str, returncode: int, seconds: float) -> dict:
    """by: "driver" (our scontrol requeue) or "slurm" (Slurm had requeued the job already)."""
    return {"event": REQUEUED, "reason": reason, "cause": cause, "by": by, "detail": detail,
            "returncode": returncode, "seconds": seconds}


def finished(status: str, reason: str, returncode: int | None, seconds: float) -> dict:
    if status not in FINISHED_STATES:
        raise ValueError(f"unknown finished status {status!r}")
    return {"event": FINISHED, "status": status, "reason": reason, "returncode": returncode,
            "seconds": seconds}


# -- writing ---------------------------------------------------------------------------------------

def stamped(event: dict, environ=os.environ, now: float | None = None) -> dict:
    """The event as written: time first, then the Slurm job and restart it happened in."""
    record = {"time": time.time() if now is None else now, "event": event["event"]}
    if job_id := environ.get("SLURM_JOB_ID"):
        record["job_id"] = job_id
        record["restart"] = int(environ.get("SLURM_RESTART_COUNT") or 0)
    record.update(event)
    return record


def record(paths: RunPaths, event: dict) -> None:
    """Append one event; raises OSError when it cannot be written (nothing partial is left)."""
    if event.get("event") not in ALL:
        raise ValueError(f"not an event of the vocabulary: {event.get('event')!r}")
    append_jsonl(paths.events, stamped(event))


def try_record(paths: RunPaths, event: dict) -> bool:
    """`record`, but a failed write (full disk, gone file system) is logged, not raised."""
    try:
        record(paths, event)
        return True
    except OSError as exc:
        log.warning("could not record event %s in %s: %s", event["event"], paths.events, exc)
        return False


def read(paths: RunPaths) -> list[dict]:
    return read_jsonl(paths.events)


# -- queries ---------------------------------------------------------------------------------------

def named(events: list[dict], *names: str) -> list[dict]:
    return [e for e in events if e.get("event") in names]


def last(events: list[dict], name: str) -> dict | None:
    found = named(events, name)
    return found[-1] if found else None


def submissions(events: list[dict]) -> list[dict]:
    """Every submission of the run with a job id, first to last (submit, then each resume)."""
    return [e for e in named(events, SUBMITTED, RESUBMITTED) if e.get("job_id")]


def job_ids(events: list[dict]) -> list[str]:
    return [e["job_id"] for e in submissions(events)]


def last_submission(events: list[dict]) -> tuple[str, str] | None:
    """(job id, executor: "slurm" or "local") of the latest submission."""
    found = submissions(events)
    return (found[-1]["job_id"], found[-1].get("executor") or "slurm") if found else None


def run_starts(events: list[dict]) -> list[float]:
    """Times of the driver's `started` events: run K (0-based) begins at starts[K]."""
    return sorted(e["time"] for e in named(events, STARTED))


def starts(events: list[dict]) -> list[dict]:
    return named(events, STARTED)


def failed_runs(events: list[dict]) -> int:
    """Runs of this job that ended in a failure or a stall and were requeued for another try."""
    return sum(1 for e in named(events, REQUEUED) if e.get("cause") in FAILURE_CAUSES)


def stop_reason_since(events: list[dict], since: float) -> str | None:
    """The reason of the ranks' last agreed stop (saved) at or after `since`."""
    stops = [e for e in named(events, STOP_SAVED) if e["time"] >= since]
    return stops[-1].get("reason") if stops else None


def spec_change_allowed_between(events: list[dict], from_hash: str | None, to_hash: str) -> bool:
    return any(e.get("from_hash") == from_hash and e.get("to_hash") == to_hash
               for e in named(events, SPEC_CHANGE_ALLOWED))


def spec_changed_after(events: list[dict], since: float) -> bool:
    return any(e["time"] > since for e in named(events, SPEC_CHANGE_ALLOWED))


def first_pipeline_cut(events: list[dict]) -> tuple[int, ...] | None:
    """The stage sizes a timed balance chose on the run's first start, if it started before."""
    cuts = named(events, PIPELINE_CUT)
    return tuple(cuts[0]["sizes"]) if cuts else None


def requeues(events: list[dict]) -> list[dict]:
    return named(events, REQUEUED)


def resumed_steps(events: list[dict]) -> list[int]:
    return [e["step"] for e in named(events, RESUMED) if "step" in e]


def stalls(events: list[dict]) -> list[dict]:
    return named(events, RANKS_STALLED)


def in_window(events: list[dict], begin: float, end: float) -> list[dict]:
    return [e for e in events if begin <= e.get("time", 0.0) < end]


def state(events: list[dict]) -> str:
    """The state the events imply (PENDING, RUNNING, COMPLETED, FAILED, ...; UNKNOWN if none)."""
    current = "UNKNOWN"
    for event in events:
        name = event.get("event")
        if name == FINISHED:
            current = FINISHED_STATES.get(event.get("status"), "FAILED")
        elif name in _QUEUED_STATES:
            current = _QUEUED_STATES[name]
    return current

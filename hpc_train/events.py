"""The event vocabulary of a run: what `events.jsonl` may hold, and the questions asked of it.

This module is the only place that spells an event's name or reads its fields by string: every
writer calls a constructor below and `record`, every reader a named query. The whole list, with
each event's fields, is in docs/run-directory.md (a test keeps the two in step).

An event is one JSON line, written whole or not at all (`rundir.append_jsonl`), with `time`, and
`job_id`/`restart` when written inside a Slurm job. Writers inside a job use `try_record`: a
full disk must not kill the driver that is about to requeue the job. Nothing decides from these
events (they are the record): decisions read the run state (run_state.py).
"""

from __future__ import annotations

import errno
import logging
import os
import time
from collections import Counter

from hpc_train import scheduler
from hpc_train.rundir import RunPaths, append_jsonl, read_jsonl
from hpc_train.runtime.faults import EVENTS_FAULT_ENV

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
DATA_COPIED = "data_copied"
RANKS_STALLED = "ranks_stalled"
STRAGGLER = "straggler"
NODE_LOST = "node_lost"
RESTARTED = "restarted"
REQUEUED = "requeued"
FINISHED = "finished"

ALL = (SUBMITTED, SUBMIT_FAILED, RESUBMITTED, SPEC_CHANGE_ALLOWED, STARTED, TRAINING_STARTED,
       RESUMED, CHECKPOINT_SKIPPED, CHECKPOINT_SAVED, STOP_REQUESTED, STOP_SAVED, RANK_FAILED,
       RANK_FINISHED, PIPELINE_CUT, DATA_COPIED, RANKS_STALLED, STRAGGLER, NODE_LOST, RESTARTED,
       REQUEUED, FINISHED)

# Why a run was requeued (`requeued.cause`) or restarted in its job (`restarted.cause`: failures
# and stalls only). Requeued failures and stalls count toward checkpoint.retries_on_failure;
# stops and interruptions toward checkpoint.max_requeues.
CAUSE_STOP = "stop"                # the ranks agreed on a stop and saved (time limit, USR2)
CAUSE_INTERRUPTED = "interrupted"  # a signal to the whole job ended the ranks (preemption, requeue)
CAUSE_FAILURE = "failure"          # a rank failed
CAUSE_STALL = "stall"              # the watchdog found no progress and tore the ranks down
CAUSE_NODE = "node_failure"        # a node died: counts toward checkpoint.retries_on_node_failure
FAILURE_CAUSES = (CAUSE_FAILURE, CAUSE_STALL)
STOP_CAUSES = (CAUSE_STOP, CAUSE_INTERRUPTED)

# What asked for a stop that ended a run (`requeued.stop`, `finished.stop`; the run state's
# `stops`): status, report and the run state count each apart. Absent in runs made before.
STOP_TIME_LIMIT = "time_limit"   # Slurm's --signal (USR2 to the batch shell) or the ranks' deadline
STOP_PREEMPTED = "preempted"     # a preemption's grace: Slurm's SIGTERM to the job's steps
STOP_SIGNAL = "signal"           # another signal to the job (scancel --signal, scontrol requeue)
STOP_KINDS = (STOP_TIME_LIMIT, STOP_PREEMPTED, STOP_SIGNAL)

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
            stall_seconds: float | str, launch: int = 0, start_seconds: float | None = None) -> dict:
    """launch: which start of the ranks in this job (0; k after the k-th in-job restart)."""
    return {"event": STARTED, "hosts": hosts, "ranks": ranks, "deadline": deadline, "argv": argv,
            "stall_seconds": stall_seconds, "launch": launch,
            **({"start_seconds": start_seconds} if start_seconds is not None else {})}


def training_started(**fields) -> dict:
    """Each segment's: total_steps, steps_per_epoch, world_size, global_batch, peak_lr, device,
    and where it starts: step, epoch, consumed (samples of the epoch's order), samples, epoch_samples."""
    return {"event": TRAINING_STARTED, **fields}


def resumed(step: int, from_checkpoint: int, spec_changed: list[str], saved_world_size,
            skipped: list[int], **position) -> dict:
    """position: epoch, consumed, samples, saved_samples_per_step, samples_per_step."""
    return {"event": RESUMED, "step": step, "from_checkpoint": from_checkpoint,
            "spec_changed": spec_changed, "saved_world_size": saved_world_size, "skipped": skipped,
            **position}


def checkpoint_skipped(step: int, error: str, moved_to: str) -> dict:
    return {"event": CHECKPOINT_SKIPPED, "step": step, "error": error, "moved_to": moved_to}


def checkpoint_saved(step: int, reason: str, path: str, seconds: float,
                     blocked_seconds: float | None = None, mode: str = "sync",
                     samples: int | None = None) -> dict:
    """seconds: from the save's start to its marker; blocked_seconds: how long training waited
    (the whole save when mode is sync; the host copy when async); samples: trained by then."""
    return {"event": CHECKPOINT_SAVED, "step": step, "reason": reason, "path": path,
            "seconds": seconds, "blocked_seconds": seconds if blocked_seconds is None else blocked_seconds,
            "mode": mode, "samples": samples}


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


def data_copied(host: str, root: str, local: bool, copied: int, kept: int, replaced: int,
                bytes_copied: int, seconds: float, note: str) -> dict:
    return {"event": DATA_COPIED, "host": host, "root": root, "local": local, "copied": copied,
            "kept": kept, "replaced": replaced, "bytes_copied": bytes_copied, "seconds": seconds,
            "note": note}


def ranks_stalled(why: str, ranks: list[dict], idle_seconds: float,
                  standing: str = "training") -> dict:
    """ranks: one dict per stalled rank: rank, host, pid, step, phase, idle_seconds, state.
    standing: where they stood when ended (job/watchdog.py: Standing): "training" a failure,
    "starting" or "exiting" after a stop that came too early for them or that they had saved."""
    return {"event": RANKS_STALLED, "why": why, "ranks": ranks, "idle_seconds": idle_seconds,
            "standing": standing}


def straggler(message: str, **measured) -> dict:
    """measured: the slowest rank's comparison (job/straggler.py: Straggler.to_json): rank, host,
    busy, others_busy, step, data, others_data, ratio, wait, share, on_data."""
    return {"event": STRAGGLER, "message": message, **measured}


def node_lost(nodes: list[str], why: str) -> dict:
    """A node of the job died under the ranks (job/node_fault.py); nodes: [] when the launcher
    did not say which."""
    return {"event": NODE_LOST, "nodes": nodes, "why": why}


def restarted(reason: str, cause: str, attempt: int, budget: int, returncode: int,
              seconds: float) -> dict:
    """The ranks torn down and started again in the same job: attempt (1-based) of budget
    (launch.restarts_in_job)."""
    return {"event": RESTARTED, "reason": reason, "cause": cause, "attempt": attempt,
            "budget": budget, "returncode": returncode, "seconds": seconds}


def requeued(reason: str, cause: str, by: str, detail: str, returncode: int, seconds: float,
             driver_cpu_seconds: float | None = None, stop: str | None = None) -> dict:
    """by: "driver" (our scontrol requeue) or "slurm" (Slurm had requeued the job already);
    seconds: how long the ranks ran; driver_cpu_seconds: the driver's own CPU time meanwhile;
    stop: what asked for the stop (STOP_KINDS), when a stop ended the run."""
    return {"event": REQUEUED, "reason": reason, "cause": cause, "by": by, "detail": detail,
            "returncode": returncode, "seconds": seconds, **_driver_cpu(driver_cpu_seconds),
            **_stop(stop)}


def finished(status: str, reason: str, returncode: int | None, seconds: float,
             driver_cpu_seconds: float | None = None, stop: str | None = None) -> dict:
    """seconds, driver_cpu_seconds and stop as requeued's, of the last start of the ranks."""
    if status not in FINISHED_STATES:
        raise ValueError(f"unknown finished status {status!r}")
    return {"event": FINISHED, "status": status, "reason": reason, "returncode": returncode,
            "seconds": seconds, **_driver_cpu(driver_cpu_seconds), **_stop(stop)}


def _stop(kind: str | None) -> dict:
    if kind is not None and kind not in STOP_KINDS:
        raise ValueError(f"unknown stop kind {kind!r}")
    return {} if kind is None else {"stop": kind}


def longest_save(events: list[dict]) -> float | None:
    """The longest a checkpoint save took in the run, seconds (None: none recorded)."""
    return max((float(e["seconds"]) for e in named(events, CHECKPOINT_SAVED)
                if isinstance(e.get("seconds"), (int, float))), default=None)


def stops(events: list[dict]) -> dict[str, int]:
    """How many runs each kind of stop ended (requeued or finished), by STOP_KINDS."""
    counted = Counter(e.get("stop") for e in named(events, REQUEUED, FINISHED))
    return {kind: counted[kind] for kind in STOP_KINDS if counted[kind]}


def _driver_cpu(seconds: float | None) -> dict:
    """The driver's CPU time while it watched the ranks (what watching costs, read by `bench
    scale`); absent when not measured (the login node's own `finished` records)."""
    return {} if seconds is None else {"driver_cpu_seconds": round(seconds, 3)}


# -- writing ---------------------------------------------------------------------------------------

def stamped(event: dict, environ=os.environ, now: float | None = None) -> dict:
    """The event as written: time first, then the Slurm job and restart it happened in."""
    record = {"time": time.time() if now is None else now, "event": event["event"]}
    if job_id := scheduler.job_ref(environ):     # `<array>_<task>` in a job array (a sweep)
        record["job_id"] = job_id
        record["restart"] = int(environ.get("SLURM_RESTART_COUNT") or 0)
    record.update(event)
    return record


def record(paths: RunPaths, event: dict) -> None:
    """Append one event; raises OSError when it cannot be written (nothing partial is left)."""
    if event.get("event") not in ALL:
        raise ValueError(f"not an event of the vocabulary: {event.get('event')!r}")
    if os.environ.get(EVENTS_FAULT_ENV):       # a test-only fault: as on a full disk
        raise OSError(errno.EIO, f"event writes fail ({EVENTS_FAULT_ENV} is set)", str(paths.events))
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
    """Times of the driver's `started` events: run K (0-based) begins at starts[K] (each start
    of the ranks is a run, in-job restarts included)."""
    return sorted(e["time"] for e in named(events, STARTED))


def job_starts(events: list[dict]) -> list[dict]:
    """The `started` events that began a job's run on its allocation (not an in-job restart)."""
    return sorted((e for e in named(events, STARTED) if not e.get("launch")), key=lambda e: e["time"])


def stop_reason_since(events: list[dict], since: float) -> str | None:
    """The reason of the ranks' last agreed stop (saved) at or after `since`."""
    stops = [e for e in named(events, STOP_SAVED) if e["time"] >= since]
    return stops[-1].get("reason") if stops else None


def spec_changed_after(events: list[dict], since: float) -> bool:
    return any(e["time"] > since for e in named(events, SPEC_CHANGE_ALLOWED))


def resumed_steps(events: list[dict]) -> list[int]:
    return [e["step"] for e in named(events, RESUMED) if "step" in e]


def in_window(events: list[dict], begin: float, end: float) -> list[dict]:
    return [e for e in events if begin <= e.get("time", 0.0) < end]


def has_job(events: list[dict], job_id: str) -> bool:
    """Whether any event of the run was written by, or names, Slurm job `job_id`."""
    return any(e.get("job_id") == job_id for e in events)


def run_window(starts: list[float], index: int) -> tuple[float, float]:
    """[begin, end) of run `index` given `run_starts`: from its start to the next one."""
    begin = starts[index] if index < len(starts) else 0.0
    end = starts[index + 1] if index + 1 < len(starts) else float("inf")
    return begin, end


def start_time(events: list[dict]) -> float:
    """When the current (or last) run started; 0.0 before any start."""
    found = run_starts(events)
    return found[-1] if found else 0.0


def world_size(events: list[dict]) -> int | None:
    """Ranks of the latest run, from its `started` event."""
    found = last(events, STARTED)        # the latest run's
    return found.get("ranks") if found else None


def stall_seconds(events: list[dict], default: float) -> float | str:
    """launch.stall_seconds of the latest run, as its `started` event says: seconds, or "auto"
    (`default` before the driver recorded it)."""
    value = _latest_started(events, "stall_seconds")
    if value == "auto":
        return value
    return float(value) if isinstance(value, (int, float)) and value > 0 else default


def start_seconds(events: list[dict], default: float) -> float:
    """launch.start_seconds of the latest run, as its `started` event says (`default` for runs
    whose driver did not record it)."""
    value = _latest_started(events, "start_seconds")
    return float(value) if isinstance(value, (int, float)) and value > 0 else default


def _latest_started(events: list[dict], key: str):
    """`key` of the latest run's `started` event (None without one or the key)."""
    found = last(events, STARTED)
    return found.get(key) if found else None


def restarts(events: list[dict]) -> int:
    """The highest Slurm restart count any start was recorded under."""
    return max([e.get("restart", 0) for e in named(events, STARTED)] or [0])


def requeue_reasons(events: list[dict]) -> list[str]:
    """The `requeued` events' reasons, first to last."""
    return [e.get("reason", "?") for e in named(events, REQUEUED)]


def ending(events: list[dict]) -> dict | None:
    """How a run (one start of the ranks) ended as the driver recorded it: its first
    `restarted`, `requeued` or `finished` event."""
    found = named(events, RESTARTED, REQUEUED, FINISHED)
    return found[0] if found else None


def job_ending(events: list[dict]) -> dict | None:
    """How a job's run on its allocation ended: its first `requeued` or `finished` event (the
    in-job restarts before it went on in the same allocation)."""
    found = named(events, REQUEUED, FINISHED)
    return found[0] if found else None


def was_requeued(event: dict | None) -> bool:
    """Whether a run's ending (`ending`) is a requeue (else it finished, or is not recorded)."""
    return event is not None and event.get("event") == REQUEUED


def was_restarted(event: dict | None) -> bool:
    """Whether a run's ending (`ending`) is a restart of the ranks inside the job."""
    return event is not None and event.get("event") == RESTARTED


def ending_words(event: dict | None) -> str | None:
    """A run's ending for people: "requeued (cause stop, by driver)" or "finished stopped"."""
    if event is None:
        return None
    if was_requeued(event):
        return f"requeued (cause {event.get('cause') or '?'}, by {event.get('by') or '?'})"
    if was_restarted(event):
        return (f"restarted in the job (cause {event.get('cause') or '?'}, "
                f"{event.get('attempt')} of {event.get('budget')})")
    return f"finished {event.get('status') or '?'}"


def ended_by_stop(event: dict | None) -> bool:
    """Whether a run's ending (`ending`) was a stop, not a failure: requeued because the ranks
    stopped or a signal to the job interrupted them, or finished `stopped`."""
    if event is None:
        return False
    if event.get("event") == REQUEUED:
        return event.get("cause") in STOP_CAUSES
    return event.get("event") == FINISHED and event.get("status") == "stopped"


def ended_by_time_limit(event: dict | None) -> bool:
    """Whether a run's ending is the job ended by Slurm at its time limit."""
    return event is not None and event.get("event") == FINISHED and event.get("status") == "timeout"


def checkpoint_errors(events: list[dict]) -> list[str]:
    """The errors of checkpoints that failed to load (`checkpoint_skipped`), in order."""
    return [e.get("error", "") for e in named(events, CHECKPOINT_SKIPPED)]


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

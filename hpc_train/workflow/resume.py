"""`workflow resume DIR` and `workflow cancel DIR`.

Resume plans the recorded workflow again (same directories, run directories, --set so far plus
new ones) and sorts its stages three ways: verified complete (verify.py: skipped), still Slurm's
(pending or running: left alone, later stages wait for them), and the rest, which are submitted
again together with every stage after them. A train stage continues in its run directory from its
latest checkpoint (`resume`); a sweep runs only its unfinished members again, as one new array.
Running it twice submits nothing the second time: what the first submitted is still Slurm's.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpc_train import scheduler
from hpc_train.errors import SubmitError
from hpc_train.workflow import events, graph, local, queue, resolved, verify
from hpc_train.workflow.load import train_overrides, workflow_from_dict
from hpc_train.workflow.paths import WorkflowPaths
from hpc_train.workflow.plan import Plan, RecordedDirs, make_plan
from hpc_train.workflow.submit import Again, submit_stages


@dataclass
class Resumed:
    paths: WorkflowPaths
    complete: list[str]
    active: dict[str, str]           # stage -> the job later stages wait for
    again: list[str]
    submitted: dict
    states: dict[str, str]           # local executor


def current_jobs(history: list[dict], name: str) -> list[str]:
    """The job ids of a stage's latest submission (a sweep: each member's latest)."""
    members = events.member_jobs(history, name)
    return sorted(set(members.values())) if members else list(events.stage_jobs(history, name).values())


def waiting_job(history: list[dict], name: str) -> str:
    """What a later stage waits for: the stage's last job; a sweep's arrays (`128:131` in a
    dependency waits for both)."""
    members = events.member_jobs(history, name)
    if members:
        return ":".join(sorted({job.split("_")[0] for job in members.values()}, key=int))
    return list(events.stage_jobs(history, name).values())[-1]


def _active(history: list[dict], name: str, rows: dict) -> bool:
    return any(row.state.active for job in current_jobs(history, name)
               for row in queue.rows_of(rows, job))


def _rows(history: list[dict], local: bool) -> dict:
    if local:
        return {}
    ids = events.all_jobs(history) + [j for e in history for j in e.get("members", {}).values()]
    rows = queue.query(sorted(set(ids)))
    if rows is None:
        raise SubmitError("cannot tell which of the workflow's jobs are still queued (neither "
                          "squeue nor sacct answered); nothing was resubmitted, so that no stage "
                          "runs twice. Fix: retry when Slurm answers")
    return rows


def _members_to_run(record: dict) -> list[int] | None:
    unfinished = [m["index"] for m in record.get("members", []) if not verify.run_completed(m["run_dir"])]
    return unfinished or None


def resume(directory: str | Path, overrides: list[str], allow_spec_change: bool) -> Resumed:
    paths = WorkflowPaths(Path(directory).resolve())
    record = resolved.read(paths)
    history = events.read(paths)
    is_local = events.executor(history) == "local"
    workflow = workflow_from_dict(record["source"], overrides)
    plan = make_plan(workflow, paths, RecordedDirs(record), cwd=record.get("cwd"))
    rows = _rows(history, is_local)
    active = [n for n in plan.order if not is_local and _active(history, n, rows)]
    complete = [n for n in plan.order if n not in active
                and verify.incomplete(paths, n, record["stages"][n], history) is None]
    todo = {n for n in plan.order if n not in active and n not in complete}
    todo |= graph.descendants(plan.needs, todo) - set(active)
    names = [n for n in plan.order if n in todo]
    for name in plan.order:
        if name in complete and name not in todo:
            events.record(paths, events.stage_skipped(name, "complete: its outputs verify"))
    again = {n: Again(train_overrides(overrides, n, workflow), allow_spec_change,
                      _members_to_run(record["stages"][n])) for n in names if plan.stages[n].kind == "train"}
    _save(paths, record, plan, overrides)
    waiting_on = {n: waiting_job(history, n) for n in active}
    complete = [n for n in complete if n not in todo]
    if not names:
        return Resumed(paths, complete, waiting_on, [], {}, {})
    if is_local:
        settled = {n: "COMPLETED" for n in complete}
        return Resumed(paths, complete, {}, names, {}, local.run_stages(plan, names, settled, again))
    return Resumed(paths, complete, waiting_on, names, submit_stages(plan, names, waiting_on, again), {})


def _save(paths: WorkflowPaths, record: dict, plan: Plan, overrides: list[str]) -> None:
    """workflow.yaml with the new --set (source and stage records planned again)."""
    if not overrides:
        return
    known = record["overrides"]
    fresh = resolved.build(plan, record["file"], record["executor"],
                           known + [o for o in overrides if o not in known])
    fresh["created"] = record.get("created")
    resolved.write(paths, fresh)


def cancel(directory: str | Path) -> list[str]:
    """scancel every job of the workflow that Slurm still holds; the ids cancelled."""
    paths = WorkflowPaths(Path(directory).resolve())
    record = resolved.read(paths)
    history = events.read(paths)
    if events.executor(history) == "local":
        raise SubmitError(f"{paths.root} ran here with the local executor: there is no Slurm job "
                          "to cancel (stop the `workflow run` process itself)")
    rows = _rows(history, False)
    live = [job for name in record["order"] for job in current_jobs(history, name)
            if any(r.state.active for r in queue.rows_of(rows, job))]
    error = scheduler.cancel(live)
    events.record(paths, events.cancelled(live, error))
    if error:
        raise SubmitError(f"scancel {' '.join(live)} failed: {error}")
    return live

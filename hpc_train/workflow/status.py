"""`workflow status DIR`: every stage (and sweep member) with its state, job ids, elapsed time,
key metric, what a pending job waits for, and which stage failed and why.

States come from Slurm (one squeue and one sacct for all the workflow's jobs: queue.py), else from
the stages' own files (verify.py; the local executor's events). A failed train stage or sweep
member is explained by `diagnose` on its run directory (the first failed rank and its error);
another stage by the last error line of its job's output.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpc_train import events as run_events
from hpc_train.rundir import RunPaths, read_jsonl
from hpc_train.scheduler import FAILED_STATES, Job
from hpc_train.workflow import events, queue, resolved, verify
from hpc_train.workflow.paths import WorkflowPaths
from hpc_train.workflow.sweep import metric_value, ranking

BAD = (*FAILED_STATES, "CANCELLED")
_ERROR_WORDS = ("error", "Error", "ERROR", "Traceback", "Killed", "CANCELLED")


@dataclass
class MemberStatus:
    index: int
    label: str
    run_dir: str
    job_id: str | None
    state: str
    elapsed: float | None
    metric: float | None
    rank: int | None = None          # 1 = best
    reason: str = ""
    failure: str | None = None


@dataclass
class StageStatus:
    name: str
    kind: str
    state: str
    job_ids: list[str]
    elapsed: float | None
    metric_name: str | None
    metric: float | None
    reason: str = ""                 # why it pends, why it was cancelled, what is missing
    failure: str | None = None       # the failed rank's error, or the job's last error line
    run_dirs: list[str] = field(default_factory=list)
    members: list[MemberStatus] = field(default_factory=list)
    best: int | None = None


@dataclass
class WorkflowStatus:
    name: str
    dir: str
    executor: str
    stages: list[StageStatus]
    failed_stage: str | None
    submission_error: str | None

    def to_json(self) -> dict:
        return asdict(self)


def _reason(rows: list[Job], state: str) -> str:
    if state == "PENDING":
        reasons = sorted({r.reason for r in rows if r.reason and r.state.active})
        return "waiting: " + ", ".join(reasons) if reasons else "waiting"
    return ""


def explain_cancels(stages: list[StageStatus], record: dict) -> None:
    """A stage cancelled while a stage it waits for (afterok) failed or was cancelled: Slurm
    cancelled it (--kill-on-invalid-dep; sacct's Reason does not always say so)."""
    by_name = {s.name: s for s in stages}
    for s in stages:
        before = [b for b in record["stages"][s.name].get("after", [])
                  if b in by_name and by_name[b].state in BAD]
        if s.state == "CANCELLED" and before and not s.reason:
            s.reason = (f"cancelled by Slurm: {', '.join(before)} did not complete, so its "
                        "dependency can never be satisfied (DependencyNeverSatisfied)")


def _elapsed(rows: list[Job] | list[MemberStatus]) -> float | None:
    return max((r.elapsed for r in rows if r.elapsed is not None), default=None)


def last_error(paths: WorkflowPaths, stage: str) -> str | None:
    for output in reversed(paths.outputs(stage)):
        for line in reversed(output.read_text(errors="replace").splitlines()):
            if any(word in line for word in _ERROR_WORDS):
                return line.strip()[:300]
    return None


def run_failure(run_dir: str) -> str | None:
    """The first failed rank and its exception, from `diagnose` on the run directory."""
    from hpc_train.inspection.diagnose import diagnose

    found = diagnose(RunPaths(Path(run_dir)))
    failure = found.first_failure
    if failure is not None:
        host = f" on {failure.host}" if failure.host else ""
        return f"rank {failure.rank}{host}: {failure.exception}"
    if found.stall:
        return f"stalled: {found.stall.get('why')}"
    if found.signatures:
        return f"{found.signatures[0]['title']}: {found.signatures[0]['line']}"
    return None


def _run_state(run_dir: str, job_id: str | None, rows: dict | None) -> tuple[str, list[Job]]:
    found = queue.rows_of(rows, job_id) if rows is not None and job_id else []
    if found:
        return queue.combine([r.state for r in found]), found
    state = run_events.state(run_events.read(RunPaths(Path(run_dir))))
    return ("NOT SUBMITTED" if job_id is None and state == "UNKNOWN" else state), []


def _member(record: dict, member: dict, job_id: str | None, rows) -> MemberStatus:
    state, found = _run_state(member["run_dir"], job_id, rows)
    value = metric_value(read_jsonl(RunPaths(Path(member["run_dir"])).metrics), record["best_by"]) \
        if record.get("best_by") else None
    status = MemberStatus(member["index"], member["label"], member["run_dir"], job_id, state,
                          _elapsed(found), value, reason=_reason(found, state))
    if state in BAD and state != "CANCELLED":
        status.failure = run_failure(member["run_dir"])
    return status


def _train(paths, name, record, history, rows) -> StageStatus:
    if "members" in record:
        jobs = events.member_jobs(history, name)
        members = [_member(record, m, jobs.get(m["index"]), rows) for m in record["members"]]
        completed = {m.index: (m.metric if m.state == "COMPLETED" else None) for m in members}
        order = ranking(completed, record.get("best_mode") or "max")
        for position, index in enumerate(order):
            if completed[index] is not None:
                members[index].rank = position + 1
        best = order[0] if order and completed[order[0]] is not None else None
        state = queue.combine([m.state for m in members])
        failed = next((m for m in members if m.failure), None)
        arrays = sorted({job.split("_")[0] for job in jobs.values()}, key=int)
        return StageStatus(name, "train", state, arrays, _elapsed(members),
                           record.get("best_by"), None if best is None else members[best].metric,
                           next((m.reason for m in members if m.reason), ""),
                           failed and f"member {failed.index}: {failed.failure}",
                           [m["run_dir"] for m in record["members"]], members, best)
    run_dir = record["run_dirs"][0]
    job_id = events.stage_jobs(history, name).get("train")
    state, found = _run_state(run_dir, job_id, rows)
    metrics = read_jsonl(RunPaths(Path(run_dir)).metrics)
    return StageStatus(name, "train", state, [job_id] if job_id else [], _elapsed(found),
                       "val.accuracy", metric_value(metrics, "val.accuracy"), _reason(found, state),
                       run_failure(run_dir) if state in BAD and state != "CANCELLED" else None,
                       [run_dir])


def _script_stage(paths, name, record, history, rows, local: bool) -> StageStatus:
    jobs = events.stage_jobs(history, name)
    per_job = [queue.rows_of(rows or {}, job) for job in jobs.values()]
    found = [r for job_rows in per_job for r in job_rows]
    tasks = record.get("tasks", 1)
    # Slurm knows the stage when it has a row for every job, every task of an array included
    # (accounting may lag behind a job that just ended).
    known = bool(jobs) and all(per_job) and all(
        len(job_rows) >= tasks for part, job_rows in zip(jobs, per_job)
        if part == "array" or (part == "main" and record["kind"] == "command"))
    last = None
    if local:
        state, last = events.local_state(history, name)
        elapsed = last.get("seconds") if last and "seconds" in last else None
        reason = (last or {}).get("detail", "") if state == "CANCELLED" else ""
    elif known:
        state, elapsed = queue.combine([r.state for r in found]), _elapsed(found)
        reason = _reason(found, state)
        if state == "CANCELLED" and verify.incomplete(paths, name, record, history) is None:
            # The marker is the script's last line, written only after the work succeeded: a
            # cancel that came after it (a submission failing midway cancels what it submitted)
            # stopped nothing. `workflow resume` skips such a stage, so status agrees with it.
            state, reason = "COMPLETED", "cancelled after its work was done (its outputs verify)"
    else:
        # Slurm has nothing (or not everything) to say: forgotten, accounting off or behind.
        # The stage's own files tell whether it is done.
        state, elapsed, reason = ("UNKNOWN" if jobs else "NOT SUBMITTED"), _elapsed(found), ""
        if verify.incomplete(paths, name, record, history) is None:
            state = "COMPLETED"
    metric_name = value = None
    run_dirs = []
    if record["kind"] == "evaluate":
        evaluated = verify.evaluated_run(record, history)      # a sweep's best: once chosen
        run_dirs = [evaluated] if evaluated else []
        latest = verify.evaluations(evaluated, record.get("split", "val"))
        if latest:
            metric_name = "accuracy"
            value = json.loads(latest[-1].read_text()).get("accuracy")
    failure = None
    if state in FAILED_STATES:
        codes = [f"{r.job_id} exit {r.exit_code}" for r in found if r.state in FAILED_STATES]
        failure = last_error(paths, name) or ((last or {}).get("detail") if local else "; ".join(codes))
    return StageStatus(name, record["kind"], state, list(jobs.values()), elapsed, metric_name,
                       value, reason, failure, run_dirs)


def collect(directory: str | Path, slurm: bool = True) -> WorkflowStatus:
    paths = WorkflowPaths(Path(directory).resolve())
    record = resolved.read(paths)
    history = events.read(paths)
    local = events.executor(history) == "local"
    ids = [] if local else events.all_jobs(history)
    rows = queue.query(ids) if slurm and ids else None
    stages = []
    for name in record["order"]:
        stage = record["stages"][name]
        if stage["kind"] == "train":
            stages.append(_train(paths, name, stage, history, rows))
            if local and stages[-1].elapsed is None:
                stages[-1].elapsed = (events.local_state(history, name)[1] or {}).get("seconds")
        else:
            stages.append(_script_stage(paths, name, stage, history, rows, local))
    explain_cancels(stages, record)
    failed = next((s.name for s in stages if s.state in FAILED_STATES), None)
    failure = events.submission_failure(history)
    return WorkflowStatus(record["name"], str(paths.root), "local" if local else "slurm", stages,
                          failed, failure and f"stage {failure['stage']}: {failure['error']}")

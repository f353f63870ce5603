"""Without Slurm: the stages run here, one after another in dependency order, in the same
workflow directory as under Slurm (`workflow run --local`, or no sbatch on PATH).

A non-train stage runs its very batch script with bash (the #SBATCH lines are comments; an array
task gets SLURM_ARRAY_TASK_ID as Slurm would set it, tasks one after another). A train stage goes
through submitit's local executor like `submit --local` (sweep members one after another), and is
waited for within its time limit. A stage whose `after` stage did not complete is not run and is
recorded CANCELLED, as Slurm's --kill-on-invalid-dep would; `after_any` stages run regardless.
"""

from __future__ import annotations

import os
import subprocess
import time

from hpc_train.rundir import RunPaths
from hpc_train.slurm.resume import resume_run
from hpc_train.slurm.submit import submit
from hpc_train.spec import dump_spec_yaml
from hpc_train.workflow import events, verify
from hpc_train.workflow.paths import link
from hpc_train.workflow.plan import Plan, StagePlan
from hpc_train.workflow.script import local_env, render
from hpc_train.workflow.submit import Again

_GRACE = 120          # seconds beyond a train job's limit before it counts as lost


def run_stages(plan: Plan, names: list[str], states: dict[str, str],
               again: dict[str, Again] | None = None) -> dict[str, str]:
    """Run `names` in order; `states` holds the stages already settled (COMPLETED, ...).
    Returns every stage's state."""
    states = dict(states)
    for name in names:
        stage = plan.workflow.stages[name]
        blocked = [b for b in stage.after if states.get(b) != "COMPLETED"]
        if blocked:
            states[name] = "CANCELLED"
            events.record(plan.paths, events.stage_finished(
                name, "CANCELLED", 0.0, f"not run: {', '.join(blocked)} did not complete"))
            continue
        events.record(plan.paths, events.stage_started(name))
        started = time.monotonic()
        try:
            state, detail = _run(plan, plan.stages[name], (again or {}).get(name))
        except Exception as exc:  # noqa: BLE001 - recorded as the stage's failure, then raised
            events.record(plan.paths, events.stage_finished(name, "FAILED", 0.0, str(exc)))
            raise
        states[name] = state
        events.record(plan.paths, events.stage_finished(name, state, round(time.monotonic() - started, 1),
                                                        detail))
    return states


def _run(plan: Plan, stage: StagePlan, again: Again | None) -> tuple[str, str]:
    if stage.kind == "train":
        return _train(plan, stage, again)
    paths = plan.paths
    paths.stage_dir(stage.name).mkdir(parents=True, exist_ok=True)
    for old in paths.stage_dir(stage.name).glob("COMPLETE*"):
        old.unlink()
    for job in stage.jobs:
        part = None if job.part == "main" else job.part
        script = paths.script(stage.name, part)
        script.write_text(render(job, None))
        limit = job.slurm.time_minutes * 60           # as Slurm enforces it
        for task in (range(job.tasks) if job.tasks > 1 else [None]):
            output = paths.local_output(stage.name, part, task)
            with open(output, "ab") as out:
                try:
                    done = subprocess.run(["bash", str(script)], stdout=out, stderr=subprocess.STDOUT,
                                          env={**os.environ, **local_env(task)}, timeout=limit)
                except subprocess.TimeoutExpired:
                    return "TIMEOUT", f"{job.name} ran past its limit {job.slurm.time}; see {output}"
            if done.returncode != 0:
                return "FAILED", f"{job.name} exit {done.returncode}; see {output}"
    return "COMPLETED", ""


def _train(plan: Plan, stage: StagePlan, again: Again | None) -> tuple[str, str]:
    train = stage.train
    chosen = sorted(train.specs) if again is None or again.members is None else again.members
    for index in chosen:
        paths = RunPaths(train.run_dirs[index])
        link(plan.paths.run_link(stage.name) if stage.sweep is None
             else plan.paths.member_link(stage.name, index), paths.root)
        if again is None or not paths.spec.is_file():      # first run now
            paths.spec.write_text(dump_spec_yaml(train.specs[index]))
            result = submit(train.specs[index], use_slurm=False, paths=paths)
        else:
            result = resume_run(paths.root, again.overrides, again.allow_spec_change, use_slurm=False)
        members = {index: result.job_id} if stage.sweep is not None else None
        events.record(plan.paths, events.stage_submitted(stage.name, {"train": result.job_id},
                                                         members, again is not None))
        _wait(result.job, train.specs[index].time_seconds + _GRACE)
        if not verify.run_completed(paths.root):
            return "FAILED", f"run {paths.root} did not complete; see `python -m hpc_train diagnose {paths.root}`"
    return "COMPLETED", ""


def _wait(job, limit: float) -> None:
    """Wait for submitit's local job, at most `limit` seconds (then it is cancelled)."""
    deadline = time.monotonic() + limit
    while not job.done():
        if time.monotonic() > deadline:
            job.cancel()
            return
        time.sleep(1)

"""`workflow validate`, `workflow run` (and its --dry-run): check the whole workflow first, then
make its directory and submit every stage at once (or run them here without Slurm).

Nothing is created before every check passed: the file, the stage graph, every reference, and
each train stage's job spec with its overrides (planned with placeholder directories).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path

from hpc_train import scheduler
from hpc_train.slurm.array import planned_array_script
from hpc_train.slurm.submit import planned_script
from hpc_train.spec.capacity import ask_slurm_nodes
from hpc_train.workflow import events, local, resolved
from hpc_train.workflow.load import load_workflow
from hpc_train.workflow.paths import WorkflowPaths
from hpc_train.workflow.plan import NewDirs, Plan, PlannedDirs, make_plan
from hpc_train.workflow.text import graph_text
from hpc_train.workflow.script import dependency_options, render
from hpc_train.workflow.submit import Submitted, stage_dependency, submit_stages


@dataclass
class Started:
    paths: WorkflowPaths
    plan: Plan
    executor: str                          # "slurm" or "local"
    submitted: dict[str, Submitted]        # Slurm: stage -> its jobs
    states: dict[str, str]                 # local: stage -> how it ended


def check(file: str, overrides: list[str], root: str | None = None,
          python: str = sys.executable, ask_slurm: bool | None = None) -> Plan:
    """The planned workflow (placeholder directories); SpecInvalid lists every problem. The
    train stages' nodes are held against sinfo's when `ask_slurm` (None: where sbatch is)."""
    workflow = load_workflow(file, overrides)
    if root:
        workflow = dataclasses.replace(workflow, root=root)
    slurm = ask_slurm_nodes(scheduler.installed() if ask_slurm is None else ask_slurm)
    return make_plan(workflow, WorkflowPaths.planned(workflow.root, workflow.name), PlannedDirs(),
                     python=python, slurm=slurm)


def job_summary(plan: Plan, name: str) -> list[str]:
    stage = plan.stages[name]
    if stage.train is not None:
        if stage.sweep is not None:
            return [f"sweep: one array of {len(stage.train.specs)} runs, {stage.sweep.parallelism} at once"]
        return [f"train: {stage.train.spec_file}"]
    return [f"{job.part}: array of {job.tasks}" if job.tasks > 1 else job.part for job in stage.jobs]


def dry_run_text(plan: Plan) -> str:
    """The stage graph, then every stage's sbatch script(s); job ids show as {stage}."""
    needs = {n: plan.workflow.stages[n].needs for n in plan.order}
    any_end = {n: plan.workflow.stages[n].after_any for n in plan.order}
    out = [graph_text(needs, any_end, {n: job_summary(plan, n) for n in plan.order}), ""]
    waiting_on = {name: "{" + name + "}" for name in plan.order}
    for name in plan.order:
        stage = plan.stages[name]
        value = stage_dependency(plan, name, waiting_on)
        out.append(f"# ===== stage {name} ({stage.kind}) " + "=" * 40)
        if stage.train is not None:
            options = dependency_options(value)
            if stage.sweep is not None:
                out.append(planned_array_script(stage.train.specs, stage.train.prefix,
                                                stage.sweep.parallelism, options=options))
            else:
                out.append(planned_script(stage.train.specs[0], stage.train.run_dirs[0],
                                          options=options))
            continue
        for job in stage.jobs:
            out.append(render(job, value))
            value = "afterok:{" + f"{name}.{job.part}" + "}"
    return "\n".join(out)


def run(file: str, overrides: list[str], root: str | None = None, use_slurm: bool | None = None,
        python: str = sys.executable, ask_slurm: bool | None = None) -> Started:
    """ask_slurm: hold the train stages against sinfo's nodes (None: when submitting to Slurm)."""
    use_slurm = scheduler.installed() if use_slurm is None else use_slurm
    ask_slurm = use_slurm if ask_slurm is None else ask_slurm
    planned = check(file, overrides, root, python, ask_slurm)   # every problem before anything exists
    executor = "slurm" if use_slurm else "local"
    workflow = planned.workflow
    paths = WorkflowPaths.new(workflow.root, workflow.name)
    plan = make_plan(workflow, paths, NewDirs(), python=python)
    resolved.write(paths, resolved.build(plan, str(Path(file).resolve()), executor, overrides))
    events.record(paths, events.created(str(Path(file).resolve()), executor, list(overrides)))
    if use_slurm:
        return Started(paths, plan, executor, submit_stages(plan, plan.order, {}), {})
    return Started(paths, plan, executor, {}, local.run_stages(plan, plan.order, {}))

"""workflow.yaml: the resolved workflow, written once when it is submitted (and again by resume
with its new --set), read by status, resume, cancel and the stages' own `workflow best`.

It holds the file's data with the --set overrides (`source` + `overrides`, from which resume
plans again), and per stage what was made of it: outputs with references resolved (a sweep's
best member stays `{stage.best.run_dir}`: it is chosen when a later stage starts), job names,
run directories, sweep members with their overrides and metric.
"""

from __future__ import annotations

from datetime import datetime

from hpc_train.errors import InspectError
from hpc_train.spec.yaml_io import dump_yaml, parse_yaml
from hpc_train.workflow import refs
from hpc_train.workflow.paths import WorkflowPaths
from hpc_train.workflow.plan import Plan, StagePlan
from hpc_train.workflow.sweep import label, mode_of

_HEADER = ("# Resolved workflow, written by hpc_train: the file with --set applied (source, overrides),\n"
           "# references resolved, run directories chosen. `workflow status|resume|cancel` read it.\n")


def stage_record(plan: StagePlan) -> dict:
    record = {"kind": plan.kind, "after": plan.stage.after, "after_any": plan.stage.after_any,
              "outputs": {name: refs.text(value) for name, value in plan.outputs.items()},
              "jobs": [job.name for job in plan.jobs]}
    if plan.train is not None:
        train = plan.train
        record.update({"spec_file": train.spec_file,
                       "run_dirs": [str(train.run_dirs[i]) for i in sorted(train.run_dirs)]})
        if plan.sweep is not None:
            record.update({
                "prefix": str(train.prefix), "parallelism": plan.sweep.parallelism,
                "best_by": plan.sweep.best_by,
                "best_mode": mode_of(plan.sweep.best_by, plan.sweep.best_mode) if plan.sweep.best_by else None,
                "members": [{"index": i, "overrides": train.values[i], "label": label(train.values[i]),
                             "run_dir": str(train.run_dirs[i])} for i in sorted(train.run_dirs)]})
    if plan.kind in ("shard", "command"):
        record["tasks"] = plan.stage.tasks
    if plan.kind == "evaluate":
        record["split"] = plan.stage.split
    return record


def build(plan: Plan, file: str, executor: str, overrides: list[str]) -> dict:
    return {"name": plan.workflow.name, "file": file, "dir": str(plan.paths.root),
            "cwd": str(plan.cwd),     # relative paths of the file mean this directory, also on resume
            "executor": executor, "created": datetime.now().isoformat(timespec="seconds"),
            "overrides": list(overrides), "order": plan.order,
            "stages": {name: stage_record(plan.stages[name]) for name in plan.order},
            "source": plan.workflow.source}


def write(paths: WorkflowPaths, data: dict) -> None:
    paths.resolved.write_text(_HEADER + dump_yaml(data))


def read(paths: WorkflowPaths) -> dict:
    """The resolved workflow; InspectError when DIR is not a workflow directory."""
    if not paths.resolved.is_file():
        raise InspectError(f"{paths.root}: not a workflow directory (no {paths.resolved.name}); "
                           "give the directory `workflow run` printed")
    data = parse_yaml(paths.resolved.read_text())
    if not isinstance(data, dict) or "stages" not in data:
        raise InspectError(f"{paths.resolved}: not a resolved workflow")
    return data

"""Rules between stages (pure): `after` names, cycles, references, sweeps, outputs written twice.

Each rule returns spec.Problems (key, value, rule, fix). The stages' own job specs are checked
when the workflow is planned (plan.py), with their references resolved.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

from hpc_train.spec.problems import Problem, value_problem
from hpc_train.workflow import graph, refs
from hpc_train.workflow.schema import MAX_TASKS, Stage, TrainStage, Workflow
from hpc_train.workflow.sweep import members

# What each kind of stage offers to later stages' references.
OUTPUTS = {"shard": ("out", "split_dir", "manifest"), "train": ("run_dir",),
           "evaluate": ("run_dir",), "export": ("output",), "command": ("dir",)}
WORKFLOW_OUTPUTS = ("dir", "name")
# Keys a sweep member may not change: members share one array, so one script and its options.
SHARED_BY_MEMBERS = ("slurm.", "run.name", "run.root")


def check(workflow: Workflow) -> list[Problem]:
    problems = after_problems(workflow.stages)
    needs = {name: [b for b in s.needs if b in workflow.stages] for name, s in workflow.stages.items()}
    cycle = graph.find_cycle(needs)
    if cycle:
        where = " -> ".join(cycle)
        problems.append(Problem(f"stages.{cycle[0]}.after", None, f"the stages wait for each "
                                f"other in a cycle ({where}: each waits for the next), so none "
                                "could ever start", f"remove {cycle[1]} from stages.{cycle[0]}.after, or "
                                "break another link of the cycle"))
        return problems
    # A stage whose after list is wrong is not also told that it does not wait for a stage.
    unsure = {p.key.split(".")[1] for p in problems}
    for name, stage in workflow.stages.items():
        problems += reference_problems(name, stage, workflow.stages, needs, name in unsure)
        if isinstance(stage, TrainStage) and stage.sweep is not None:
            problems += sweep_problems(name, stage)
    return problems + output_problems(workflow)


def after_problems(stages: dict[str, Stage]) -> list[Problem]:
    problems = []
    for name, stage in stages.items():
        for field in ("after", "after_any"):
            for i, before in enumerate(getattr(stage, field)):
                key = f"stages.{name}.{field}[{i}]"
                if before == name:
                    problems.append(value_problem(key, before, "a stage cannot wait for itself",
                                                  "remove it"))
                elif before not in stages:
                    close = difflib.get_close_matches(before, list(stages), n=1)
                    hint = f"did you mean {close[0]!r}? " if close else ""
                    problems.append(value_problem(key, before, f"no such stage (stages: "
                                                  f"{', '.join(stages)})", f"{hint}name a stage "
                                                  "of this workflow"))
        both = sorted(set(stage.after) & set(stage.after_any))
        if both:
            problems.append(value_problem(f"stages.{name}.after_any", both, "a stage is in both "
                                          "after and after_any", "keep it in one of them"))
    return problems


def strings(value: Any, key: str):
    """(key, text) of every string inside a stage field (lists and mappings included)."""
    if isinstance(value, str):
        yield key, value
    elif isinstance(value, dict):
        for name, item in value.items():
            yield from strings(item, f"{key}.{name}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from strings(item, f"{key}[{i}]")


def stage_strings(name: str, stage: Stage):
    for field in dataclasses.fields(stage):
        if field.name in ("kind", "after", "after_any"):
            continue
        value = getattr(stage, field.name)
        if dataclasses.is_dataclass(value):      # a sweep: its overrides may refer too
            value = dataclasses.asdict(value)
        yield from strings(value, f"stages.{name}.{field.name}")


def reference_problems(name: str, stage: Stage, stages: dict[str, Stage], needs: graph.Needs,
                       unsure: bool = False) -> list[Problem]:
    """unsure: the stage's after list has problems of its own; what it waits for is unknown."""
    problems = []
    before = set(stages) if unsure else graph.ancestors(needs, name)
    for key, text in stage_strings(name, stage):
        for ref in refs.references(text):
            rule, fix = reference_rule(ref, name, stage, stages, before) or (None, None)
            if rule:
                problems.append(value_problem(key, str(ref), rule, fix))
    return problems


def reference_rule(ref: refs.Ref, name: str, stage: Stage, stages: dict[str, Stage],
                   before: set[str]) -> tuple[str, str] | None:
    if ref.stage == "workflow":
        if ref.output not in WORKFLOW_OUTPUTS:
            return (f"the workflow offers {', '.join(WORKFLOW_OUTPUTS)}",
                    "write e.g. {workflow.dir}")
        return None
    target = stages.get(ref.stage)
    if target is None:
        close = difflib.get_close_matches(ref.stage, list(stages), n=1)
        return (f"refers to no stage of the workflow (stages: {', '.join(stages)})",
                f"did you mean {{{close[0]}.{ref.output}}}?" if close else "name a stage")
    if ref.stage == name:
        return ("a stage cannot refer to its own outputs", "refer to an earlier stage")
    sweep = isinstance(target, TrainStage) and target.sweep is not None
    if ref.output == refs.BEST:
        if not sweep:
            return (f"{ref.stage} is not a sweep: only a sweep has a best member",
                    f"write {{{ref.stage}.run_dir}}")
        if target.sweep.best_by is None:
            return (f"the sweep {ref.stage} has no best_by metric to choose its best member by",
                    f"add best_by (e.g. best_by: val.accuracy) under stages.{ref.stage}.sweep")
        if isinstance(stage, TrainStage):
            return ("the best member is known only when the sweep has run, but a train "
                    "stage's job spec is fixed when the workflow is submitted",
                    "refer to it from an evaluate, export or command stage")
    elif sweep and ref.output == "run_dir":
        return (f"the sweep {ref.stage} has one run directory per member",
                f"refer to its best member, {{{ref.stage}.{refs.BEST}}}")
    elif ref.output not in OUTPUTS[target.kind]:
        return (f"a {target.kind} stage has no output {ref.output!r} (it offers "
                f"{', '.join(OUTPUTS[target.kind])})", f"write e.g. {{{ref.stage}.{OUTPUTS[target.kind][0]}}}")
    if ref.stage not in before:
        return (f"{name} uses an output of {ref.stage} but does not wait for it, so it could "
                "start before that output exists", f"add {ref.stage} to stages.{name}.after")
    return None


def sweep_problems(name: str, stage: TrainStage) -> list[Problem]:
    key = f"stages.{name}.sweep"
    sweep = stage.sweep
    problems = []
    for grid_key, values in sweep.grid.items():
        if not values:
            problems.append(value_problem(f"{key}.grid.{grid_key}", values, "a grid key needs at "
                                          "least one value", "list the values, e.g. [0.1, 0.2]"))
    for i, chosen in enumerate(sweep.sets):
        for set_key in chosen:
            if set_key in sweep.grid:
                problems.append(value_problem(f"{key}.sets[{i}].{set_key}", chosen[set_key],
                                              "the key is also a grid key: the grid would "
                                              "override it", "keep it in one of them"))
    keys = {f"{key}.grid.{k}": k for k in sweep.grid}
    keys.update({f"{key}.sets[{i}].{k}": k for i, chosen in enumerate(sweep.sets) for k in chosen})
    for where, member_key in keys.items():
        if member_key.startswith(SHARED_BY_MEMBERS):
            problems.append(value_problem(where, member_key, "sweep members "
                                          "run as one Slurm job array: one script, one set of "
                                          "resources and one job name for all of them",
                                          f"set {member_key} for all members under "
                                          f"stages.{name}.set"))
    count = len(members(sweep)) if not problems else 0
    if count > MAX_TASKS:
        problems.append(value_problem(key, count, f"a sweep of {count} members is more than "
                                      f"{MAX_TASKS} array tasks", "split the sweep"))
    return problems


def output_problems(workflow: Workflow) -> list[Problem]:
    """Two stages writing one place: shard splits, export files."""
    problems, seen = [], {}
    for name, stage in workflow.stages.items():
        if stage.kind == "shard":
            where = f"{stage.out.rstrip('/')}/{stage.split}"
        elif stage.kind == "export" and stage.output:
            where = stage.output
        else:
            continue
        if where in seen:
            problems.append(value_problem(f"stages.{name}", where, f"{seen[where]} writes there "
                                          "too", "give each stage its own output"))
        seen.setdefault(where, name)
    return problems

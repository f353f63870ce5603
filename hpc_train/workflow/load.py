"""Workflow file (+ --set STAGE.KEY=VALUE) -> Workflow, strictly: every problem, one line each.

Order: read the YAML as a job spec is read (spec.yaml_io: no tags, no base-60, no duplicate
keys) -> apply --set -> old slurm key names moved -> build each part with the spec machinery
(unknown keys, types, limits) -> the rules between stages (checks.py). Problems are
spec.Problem, raised together as SpecInvalid (exit 2); nothing is created or submitted.

`--set STAGE.KEY=VALUE` sets a key of the stage; for a train stage, a key of its job spec
(`--set train.optim.epochs=1`, as if written under the stage's `set:`).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
from pathlib import Path
from typing import Any

import yaml

from hpc_train.spec import Resources
from hpc_train.spec.coerce import INVALID
from hpc_train.spec.deprecated import name_written_keys, rename_key
from hpc_train.spec.load import build_dataclass
from hpc_train.spec.overrides import FROM_SET
from hpc_train.spec.problems import Problem, SpecInvalid, show, value_problem
from hpc_train.spec.yaml_io import parse_yaml, read_spec_file, yaml_error_line
from hpc_train.workflow import checks
from hpc_train.workflow.schema import (KINDS, OLD_STAGE_KEYS, STAGE_DEFAULTS, SweepSpec,
                                       TrainStage, Workflow, WorkflowHead, check_stage_name)

_TRAIN_KEYS = {f.name for f in dataclasses.fields(TrainStage)}
_OLD_RULE = "deprecated: a stage's slurm keys are the job spec's (read as {} for now)"


def load_workflow(path: str | Path, overrides: list[str] = ()) -> Workflow:
    """The checked workflow in `path`; raises SpecInvalid listing every problem."""
    data, problems = read_spec_file(path)
    if data is None:
        raise SpecInvalid([_about_workflows(p) for p in problems])
    return workflow_from_dict(data, overrides)


_SPEC_WORDS = (("jobs/smoke.yaml", "workflows/smoke.yaml"), ("specs live in jobs/", "workflows live "
               "in workflows/"), ("(run, slurm, data, ...)", "(name, stages, ...)"),
               ("at least run: {name: my-run}", "at least name: and stages:"))


def _about_workflows(problem: Problem) -> Problem:
    """The file reader's problems (shared with job specs) in a workflow's words."""
    rule, fix = problem.rule, problem.fix
    for spec_words, workflow_words in _SPEC_WORDS:
        rule, fix = rule.replace(spec_words, workflow_words), fix.replace(spec_words, workflow_words)
    return dataclasses.replace(problem, rule=rule, fix=fix)


def workflow_from_dict(data: dict, overrides: list[str] = ()) -> Workflow:
    merged, problems = apply_overrides(data, overrides)
    moved, warnings = move_old_keys(merged)
    workflow = build(merged, problems)
    if workflow is not None:
        problems += checks.check(workflow)
    if problems:
        raise SpecInvalid(list(dict.fromkeys(name_written_keys(problems, moved))))   # each once
    return dataclasses.replace(workflow, warnings=warnings)


def move_old_keys(data: dict) -> tuple[dict[str, str], list[Problem]]:
    """Moves the stages' old slurm key names in `data` to the job spec's: ({new: old}, warnings)."""
    stages = data.get("stages") if isinstance(data.get("stages"), dict) else {}
    holders = {"slurm.": data, **{f"stages.{n}.slurm.": raw for n, raw in stages.items() if isinstance(raw, dict)}}
    moved, warnings = {}, []
    for prefix, holder in holders.items():
        for old, new in OLD_STAGE_KEYS.items() if isinstance(holder.get("slurm"), dict) else ():
            holder["slurm"], names, found = rename_key(holder["slurm"], old, new, prefix, _OLD_RULE.format(new))
            moved.update(names)
            warnings += found
    return moved, warnings


# -- --set -------------------------------------------------------------------------------------

def apply_overrides(data: dict, overrides: list[str]) -> tuple[dict, list[Problem]]:
    merged = copy.deepcopy(data)
    problems: list[Problem] = []
    stages = merged.get("stages") if isinstance(merged.get("stages"), dict) else {}
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        stage, _, rest = key.partition(".")
        if not sep or not rest:
            problems.append(Problem(f"--set {item!r}", None, "expected STAGE.KEY=VALUE",
                                    "write e.g. --set train.optim.epochs=1"))
            continue
        try:
            value = parse_yaml(text)
        except yaml.YAMLError as exc:
            problems.append(Problem(key + FROM_SET, show(text), f"the value is not YAML "
                                    f"({yaml_error_line(exc)})", f"quote it, e.g. --set '{key}=\"...\"'"))
            continue
        if stage not in stages or not isinstance(stages[stage], dict):
            close = difflib.get_close_matches(stage, list(stages), n=1)
            hint = f"did you mean {close[0]!r}? " if close else ""
            problems.append(Problem(key + FROM_SET, None, f"no stage {stage!r} in the workflow "
                                    f"(stages: {', '.join(stages) or 'none'})",
                                    f"{hint}name a stage of the file"))
            continue
        _set(stages[stage], rest, value)
    return merged, problems


def train_overrides(overrides: list[str], stage: str, workflow) -> list[str]:
    """The job spec overrides among `--set` for train stage `stage`, as `KEY=VALUE` for its
    runs (`resume` applies them to the saved spec of a run that already exists)."""
    if workflow.stages[stage].kind != "train":
        return []
    found = []
    for item in overrides:
        key, _, text = item.partition("=")
        name, _, rest = key.strip().partition(".")
        if name != stage or not rest:
            continue
        first, _, inner = rest.partition(".")
        if first == "set" and inner:
            found.append(f"{inner}={text}")
        elif first not in _TRAIN_KEYS:
            found.append(f"{rest}={text}")
    return found


def _set(raw: dict, key: str, value: Any) -> None:
    first, _, rest = key.partition(".")
    if raw.get("kind") == "train" and first not in _TRAIN_KEYS:
        first, rest = "set", key            # a job spec key of a train stage
    if first == "set" and rest:
        raw["set"] = dict(raw.get("set") or {})
        raw["set"][rest] = value
        return
    if first == "sweep" and rest.startswith("grid.") and rest.count(".") >= 2:
        sweep = raw["sweep"] = dict(raw.get("sweep") or {})
        sweep["grid"] = {**(sweep.get("grid") or {}), rest[len("grid."):]: value}
        return
    node = raw
    parts = key.split(".")
    for part in parts[:-1]:
        if not isinstance(node.get(part), dict):
            node[part] = {}
        node = node[part]
    node[parts[-1]] = value


# -- building ----------------------------------------------------------------------------------

def build(data: dict, problems: list[Problem]) -> Workflow | None:
    head = build_dataclass(WorkflowHead, data, "", problems)
    if head is INVALID:
        return None
    defaults = build_dataclass(Resources, {**STAGE_DEFAULTS, **head.slurm}, "slurm.", problems)
    if not head.stages:
        problems.append(Problem("stages", None, "a workflow needs at least one stage",
                                "add stages, as in workflows/smoke.yaml"))
    stages, slurm = {}, {}
    for name, raw in head.stages.items():
        built = _stage(name, raw, defaults, problems)
        if built is not None:
            stages[name], slurm[name] = built
    return None if problems else Workflow(head.name, head.root, stages, slurm, data)


def _stage(name: str, raw: Any, defaults, problems: list[Problem]):
    key = f"stages.{name}"
    if verdict := check_stage_name(name):
        problems.append(value_problem(key, name, *verdict))
        return None
    if not isinstance(raw, dict):
        problems.append(value_problem(key, raw, "a stage is a mapping of keys (kind, after, ...)",
                                      f"indent 'key: value' lines under '{name}:'"))
        return None
    kind = raw.get("kind")
    if kind not in KINDS:
        close = difflib.get_close_matches(str(kind), list(KINDS), n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        rule = "required key is missing" if kind is None else f"{show(kind)} is not a stage kind"
        problems.append(Problem(f"{key}.kind", None, f"{rule}; kinds: {', '.join(KINDS)}",
                                f"{hint}write e.g. kind: train"))
        return None
    raw = dict(raw)
    sweep_raw = raw.pop("sweep", None) if kind == "train" else None
    slurm_raw = raw.pop("slurm", None)
    if kind == "train" and slurm_raw is not None:
        problems.append(Problem(f"{key}.slurm", None, "a train stage's resources are its job "
                                "spec's slurm section", "set them under set:, e.g. "
                                "set: {slurm.time: \"01:00:00\"}"))
        return None
    stage = build_dataclass(KINDS[kind], raw, key + ".", problems)
    slurm = _slurm(defaults, slurm_raw, key + ".slurm", problems)
    if sweep_raw is not None:
        sweep = _section(SweepSpec, sweep_raw, f"{key}.sweep", problems)
        if stage is not INVALID and sweep is not INVALID:
            stage = dataclasses.replace(stage, sweep=sweep)
    return None if INVALID in (stage, slurm) else (stage, slurm)


def _section(cls: type, raw: Any, key: str, problems: list[Problem]):
    raw = {} if raw is None else raw
    if not isinstance(raw, dict):
        problems.append(value_problem(key, raw, "must be a mapping of keys", f"indent 'key: value' "
                                      f"lines under {key.rsplit('.', 1)[-1]}:"))
        return INVALID
    return build_dataclass(cls, raw, key + ".", problems)


def _slurm(defaults, raw: Any, key: str, problems: list[Problem]):
    """The workflow's slurm defaults with the stage's own keys over them."""
    own = _section(Resources, raw, key, problems)
    if own is INVALID or defaults is INVALID:
        return INVALID
    return dataclasses.replace(defaults, **{name: getattr(own, name) for name in (raw or {})})

"""A checked workflow made concrete, stage by stage in dependency order: references resolved,
paths absolute, each train stage's job spec(s) loaded and checked, each other stage's jobs.

The same planning serves a dry run and `workflow validate` (PlannedDirs: placeholder run
directories, nothing created), `workflow run` (NewDirs: run directories made as they are chosen)
and `workflow resume` (RecordedDirs: the ones chosen at the first submission). Problems in a
train stage's job spec come back with the stage's key: `stages.train.set.optim.base_lr: ...`.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from hpc_train.rundir import RunPaths
from hpc_train.slurm.array import member_dir, new_prefix
from hpc_train.spec import JobSpec, Problem, Resources, SpecInvalid, validate_spec_file
from hpc_train.spec.capacity import SlurmFacts, capacity_problems, gather_facts
from hpc_train.spec.overrides import FROM_SET, under
from hpc_train.spec.paths import resolve_paths
from hpc_train.workflow import graph, refs
from hpc_train.workflow.paths import WorkflowPaths
from hpc_train.workflow.schema import Stage, TrainStage, Workflow
from hpc_train.workflow.script import TASK, Shell, StageJob
from hpc_train.workflow.sweep import as_overrides, members


@dataclass
class TrainPlan:
    spec_file: str
    specs: dict[int, JobSpec]          # index -> spec (one, index 0, unless a sweep)
    run_dirs: dict[int, Path]
    values: dict[int, dict]            # a sweep member's own overrides
    prefix: Path | None = None         # a sweep's member prefix (slurm/array.py)


@dataclass
class StagePlan:
    name: str
    stage: Stage
    outputs: dict[str, refs.Value]
    jobs: list[StageJob] = field(default_factory=list)   # non-train stages, in order
    train: TrainPlan | None = None

    @property
    def kind(self) -> str:
        return self.stage.kind

    @property
    def sweep(self):
        return self.stage.sweep if isinstance(self.stage, TrainStage) else None


@dataclass
class Plan:
    workflow: Workflow
    paths: WorkflowPaths
    needs: graph.Needs
    order: list[str]
    stages: dict[str, StagePlan]
    cwd: Path
    warnings: list[Problem] = field(default_factory=list)


class PlannedDirs:
    """Placeholders for a dry run: nothing is created."""

    def run_dir(self, stage: str, spec: JobSpec) -> Path:
        return Path(spec.run.root) / f"{spec.run.name}-<timestamp>"

    def prefix(self, stage: str, spec: JobSpec, count: int) -> Path:
        return self.run_dir(stage, spec)


class NewDirs:
    """Run directories made as they are chosen (`workflow run`)."""

    def run_dir(self, stage: str, spec: JobSpec) -> Path:
        return RunPaths.new(spec.run.root, spec.run.name).root

    def prefix(self, stage: str, spec: JobSpec, count: int) -> Path:
        return new_prefix(spec.run.root, spec.run.name, count)


class RecordedDirs:
    """The directories recorded in workflow.yaml at the first submission (`workflow resume`)."""

    def __init__(self, resolved: dict):
        self.stages = resolved.get("stages", {})

    def run_dir(self, stage: str, spec: JobSpec) -> Path:
        return Path(self.stages[stage]["run_dirs"][0])

    def prefix(self, stage: str, spec: JobSpec, count: int) -> Path:
        return Path(self.stages[stage]["prefix"])


def make_plan(workflow: Workflow, paths: WorkflowPaths, dirs, cwd: Path | None = None,
              python: str = sys.executable, slurm: SlurmFacts = SlurmFacts()) -> Plan:
    """Raises SpecInvalid with every problem of every train stage's job spec, and of what each
    needs against the data it sees and the nodes `slurm` lists (spec/capacity.py)."""
    cwd = Path(cwd or Path.cwd())
    needs = {name: s.needs for name, s in workflow.stages.items()}
    plan = Plan(workflow, paths, needs, graph.order(needs), {}, cwd, list(workflow.warnings))
    known: dict[refs.Ref, refs.Value] = {refs.Ref("workflow", "dir"): refs.literal(str(paths.root)),
                                         refs.Ref("workflow", "name"): refs.literal(workflow.name)}
    problems: list[Problem] = []
    for name in plan.order:
        if any(ref not in known for ref in _references(workflow.stages[name])):
            continue                   # a stage before it could not be planned: reported there
        planner = _Planner(workflow, paths, name, known, cwd, python, dirs, problems, plan.warnings, slurm)
        stage_plan = PLAN_OF_KIND[workflow.stages[name].kind](planner)
        if stage_plan is None:
            continue
        plan.stages[name] = stage_plan
        known.update({refs.Ref(name, output): value for output, value in stage_plan.outputs.items()})
    if problems:
        raise SpecInvalid(problems)
    return plan


@dataclass
class _Planner:
    workflow: Workflow
    paths: WorkflowPaths
    name: str
    known: dict
    cwd: Path
    python: str
    dirs: PlannedDirs | NewDirs | RecordedDirs
    problems: list[Problem]           # a train stage's job spec problems, of every stage
    warnings: list[Problem]
    slurm: SlurmFacts                 # the nodes the capacity check holds the specs against

    @property
    def stage(self):
        return self.workflow.stages[self.name]

    def value(self, text: str | None) -> refs.Value | None:
        return None if text is None else refs.substitute(text, self.known)

    def path(self, text: str | None) -> refs.Value | None:
        """A path value made absolute against the directory the workflow is submitted from."""
        value = self.value(text)
        if value and isinstance(value[0], str) and not value[0].startswith(("/", "~")):
            return refs.join([str(self.cwd) + "/", *value])
        if value and isinstance(value[0], str) and value[0].startswith("~"):
            return refs.join([str(Path(value[0]).expanduser()), *value[1:]])
        return value

    def command(self, *words) -> list[refs.Value]:
        """argv words: Values as they are, plain strings and numbers made literal."""
        return [w if isinstance(w, tuple) else refs.literal(str(w)) for w in words]

    def job(self, part: str, lines: list, marker: refs.Value | None, tasks: int = 1) -> StageJob:
        return StageJob(self.workflow.name, self.name, self.stage.kind, part, self.resources(),
                        self.paths.output(self.name, tasks > 1), lines, marker, tasks,
                        str(self.paths.root), self.python)

    def resources(self) -> Resources:
        """The stage's resources; a relative site profile is the submit directory's, as in a spec."""
        slurm = self.workflow.slurm[self.name]
        profile = slurm.site_profile and str(self.cwd / Path(slurm.site_profile).expanduser())
        return replace(slurm, site_profile=profile)

    def marker(self) -> refs.Value:
        return refs.literal(str(self.paths.marker(self.name)))

    # -- kinds (PLAN_OF_KIND) -----------------------------------------------------------------

    def shard_jobs(self) -> StagePlan:
        s = self.stage
        src, out = self.path(s.src), self.path(s.out)
        split_dir = refs.join([*out, f"/{s.split}"])
        words = ["data", "shard", "--src", src, "--out", out, "--split", s.split]
        for flag, value in (("--labels", self.path(s.labels)), ("--classes", self.path(s.classes)),
                            ("--max-side", s.max_side)):
            if value is not None:
                words += [flag, value]
        words += ["--shard-size", s.shard_size, "--encoding", s.encoding, "--quality", s.quality,
                  "--raw-size", s.raw_size, "--seed", s.seed] + (["--strict"] if s.strict else [])
        convert = self.command(self.python, "-m", "hpc_train", *words)
        verify = [self.command(self.python, "-m", "hpc_train", "data", "verify", out, "--split",
                               s.split)] if s.verify else []
        if s.tasks == 1:
            jobs = [self.job("main", [convert, *verify], self.marker())]
        else:
            task = [*convert, *self.command("--task-index", (TASK,), "--task-count", s.tasks)]
            # The tasks race to write the manifest; a last job writes it for sure (every
            # shard is done, so the converter only lists and skips them) and verifies.
            last = [*convert, *self.command("--task-index", 0, "--task-count", 1)]
            jobs = [self.job("array", [task], None, s.tasks),
                    self.job("manifest", [last, *verify], self.marker())]
        outputs = {"out": out, "split_dir": split_dir,
                   "manifest": refs.join([*split_dir, "/manifest.json"])}
        return StagePlan(self.name, s, outputs, jobs)

    def evaluate_jobs(self) -> StagePlan:
        s = self.stage
        run_dir = self.path(s.run_dir)
        words = ["evaluate", run_dir, "--split", s.split]
        if s.checkpoint is not None:
            words += ["--checkpoint", s.checkpoint]
        if s.data is not None:
            words += ["--data", self.path(s.data)]
        line = self.command(self.python, "-m", "hpc_train", *words)
        return StagePlan(self.name, s, {"run_dir": run_dir}, [self.job("main", [line], self.marker())])

    def export_jobs(self) -> StagePlan:
        s = self.stage
        run_dir = self.path(s.run_dir)
        output = self.path(s.output) or refs.literal(str(self.paths.root / f"{self.name}.pt"))
        words = ["export", run_dir, "-o", output, "--format", s.format]
        if s.checkpoint is not None:
            words += ["--checkpoint", s.checkpoint]
        line = self.command(self.python, "-m", "hpc_train", *words)
        return StagePlan(self.name, s, {"output": output}, [self.job("main", [line], self.marker())])

    def command_jobs(self) -> StagePlan:
        s = self.stage
        used = {ref: self.known[ref] for ref in refs.references(s.run)}
        marker = self.marker() if s.tasks == 1 else \
            refs.join([str(self.paths.marker(self.name)) + ".", TASK])
        job = self.job("main", [Shell(s.run, used)], marker, s.tasks)
        return StagePlan(self.name, s, {"dir": refs.literal(str(self.paths.stage_dir(self.name)))}, [job])

    def train_runs(self) -> StagePlan | None:
        s: TrainStage = self.stage
        spec_file = refs.known_text(self.path(s.spec))
        shared = as_overrides({k: _known(v, self.known) for k, v in s.set.items()})
        member_values = members(s.sweep) if s.sweep else [{}]
        specs, values = {}, {}
        for index, own in enumerate(member_values):
            own = {k: _known(v, self.known) for k, v in own.items()}
            try:
                spec, found = validate_spec_file(spec_file, shared + as_overrides(own))
            except SpecInvalid as exc:
                self.problems += [_rekey(p, self.name, s.spec, set(s.set), own,
                                         index if s.sweep else None) for p in exc.problems]
                continue
            self.warnings += [_rekey(p, self.name, s.spec, set(s.set), own, None) for p in found]
            spec = resolve_paths(spec, self.cwd)
            unfit = capacity_problems(spec, gather_facts(spec, self.slurm))
            if unfit:
                self.problems += [_rekey(p, self.name, s.spec, set(s.set), own,
                                         index if s.sweep else None) for p in unfit]
                continue
            specs[index], values[index] = spec, own
        if len(specs) < len(member_values):
            return None
        if s.sweep:
            prefix = self.dirs.prefix(self.name, specs[0], len(specs))
            run_dirs = {i: member_dir(prefix, i) for i in specs}
            outputs = {refs.BEST: (refs.Best(self.name),)}
        else:
            prefix, run_dirs = None, {0: self.dirs.run_dir(self.name, specs[0])}
            outputs = {"run_dir": refs.literal(str(run_dirs[0]))}
        return StagePlan(self.name, s, outputs, train=TrainPlan(spec_file, specs, run_dirs, values, prefix))


# A stage's kind -> the planner's method that plans it.
PLAN_OF_KIND = {"shard": _Planner.shard_jobs, "train": _Planner.train_runs,
                "evaluate": _Planner.evaluate_jobs, "export": _Planner.export_jobs,
                "command": _Planner.command_jobs}


def _references(stage: Stage) -> list[refs.Ref]:
    from hpc_train.workflow.checks import stage_strings

    return [ref for _, text in stage_strings("", stage) for ref in refs.references(text)]


def _known(value, known: dict):
    """A `set:` value with references in its strings replaced (all known at submit time)."""
    if isinstance(value, str):
        return refs.known_text(refs.substitute(value, known))
    if isinstance(value, list):
        return [_known(v, known) for v in value]
    if isinstance(value, dict):
        return {k: _known(v, known) for k, v in value.items()}
    return value


def _rekey(problem: Problem, stage: str, spec_file: str, set_keys: set[str], own: dict,
           member: int | None) -> Problem:
    """A job spec problem, named where the user wrote the value: the stage's set, a sweep
    member, or the job spec file."""
    key = problem.key.replace(FROM_SET, "")
    if key.endswith(spec_file) or Path(key).name == Path(spec_file).name:   # the file itself
        return Problem(f"stages.{stage}.spec", None, f"{spec_file!r}: {problem.rule}", problem.fix)
    if member is not None and under(key, own):
        where = f"stages.{stage}.sweep member {member}: {key}"
    elif under(key, set_keys):
        where = f"stages.{stage}.set.{key}"
    else:
        where = f"stages.{stage}.spec ({spec_file}): {key}"
    return Problem(where, problem.given, problem.rule, problem.fix, problem.severity)

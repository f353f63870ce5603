"""The batch script of a non-train stage's job (pure): options and setup as a run's, the command.

    #!/bin/bash
    #SBATCH --job-name=smoke-chain.evaluate ... --dependency=afterok:123 --kill-on-invalid-dep=yes
    set -euo pipefail
    <slurm.site_profile sourced, slurm.setup lines>
    best_train=$(python -m hpc_train workflow best WF_DIR train --record)  # a sweep's best member
    python -m hpc_train evaluate "${best_train}" --split val
    touch WF_DIR/stages/evaluate/COMPLETE

Command lines are argv lists of Values (refs.py): known parts are shlex-quoted, a sweep's best
member becomes a shell variable set by `workflow best` when the job starts, an Env part the
variable Slurm sets. A `command` stage's text is the user's shell, with each reference replaced
by its quoted value. The marker is written only when everything before it succeeded (`set -e`);
`workflow resume` trusts it together with the stage's outputs. The local executor runs the same
file with bash (the #SBATCH lines are comments there).
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field

from hpc_train.slurm.options import JobShape, Options, sbatch_directives, sbatch_options, setup_lines
from hpc_train.spec import Resources
from hpc_train.workflow import refs

TASK = refs.Env("SLURM_ARRAY_TASK_ID")
Word = refs.Value                 # one argv word


@dataclass(frozen=True)
class Shell:
    """A command stage's text: the user's shell, references replaced by quoted values."""
    text: str
    known: dict = field(default_factory=dict)     # refs.Ref -> refs.Value


@dataclass(frozen=True)
class StageJob:
    workflow: str                 # the workflow's name (job names: <workflow>.<stage>[.<part>])
    stage: str
    kind: str
    part: str                     # "main", "array" (the converter tasks) or "manifest"
    slurm: Resources
    output: str                   # sbatch --output pattern
    lines: list                   # list[list[Word] | Shell]
    marker: Word | None           # touched at the end
    tasks: int = 1                # > 1: an array
    workflow_dir: str = ""        # for `workflow best`
    python: str = "python"

    @property
    def name(self) -> str:
        return f"{self.workflow}.{self.stage}" + ("" if self.part == "main" else f".{self.part}")


def dependency(after_ok: list[str], after_any: list[str]) -> str | None:
    """Slurm's --dependency value: every listed job must end (OK for afterok), or None."""
    parts = []
    if after_ok:
        parts.append("afterok:" + ":".join(after_ok))
    if after_any:
        parts.append("afterany:" + ":".join(after_any))
    return ",".join(parts) or None


def dependency_options(value: str | None) -> dict[str, str]:
    """--dependency plus --kill-on-invalid-dep: a job whose dependency can never be satisfied
    (a stage before it failed) is cancelled by Slurm instead of pending forever."""
    return {"dependency": value, "kill-on-invalid-dep": "yes"} if value else {}


def options(job: StageJob, dependency_value: str | None) -> Options:
    """The job's sbatch options: one task on one node (an array of them), waiting as told."""
    array = {"array": f"0-{job.tasks - 1}"} if job.tasks > 1 else {}
    return {**sbatch_options(job.slurm, JobShape(job.name, job.output)), **array,
            **dependency_options(dependency_value)}


def best_variable(stage: str) -> str:
    return f"best_{stage}"


def word(value: Word) -> str:
    """One shell word: known text quoted, a best member or Env as a quoted variable."""
    if not value:
        return "''"
    pieces = []
    for part in value:
        if isinstance(part, refs.Best):
            pieces.append('"${' + best_variable(part.stage) + '}"')
        elif isinstance(part, refs.Env):
            pieces.append('"${' + part.name + '}"')
        else:
            pieces.append(shlex.quote(part))
    return "".join(pieces)


def shell_line(line) -> str:
    if isinstance(line, Shell):
        return refs.REFERENCE.sub(lambda m: word(line.known[refs.Ref(*m.groups())]), line.text)
    return " ".join(word(w) for w in line)


def runtime_stages(job: StageJob) -> list[str]:
    """Sweeps whose best member the job's lines name, in order of first use."""
    found: list[str] = []
    values = [w for line in job.lines for w in (line.known.values() if isinstance(line, Shell) else line)]
    for value in values + ([job.marker] if job.marker else []):
        for stage in refs.runtime_stages(value):
            if stage not in found:
                found.append(stage)
    return found


def render(job: StageJob, dependency_value: str | None) -> str:
    lines = ["#!/bin/bash", f"# hpc_train workflow {job.workflow}: stage {job.stage} ({job.kind}"
             + ("" if job.part == "main" else f", {job.part}") + ")",
             sbatch_directives(options(job, dependency_value)), "", "set -euo pipefail"]
    lines += setup_lines(job.slurm)
    for stage in runtime_stages(job):
        # Known only now that the sweep has run: the best member by its metric, recorded.
        best = shlex.join([job.python, "-m", "hpc_train", "workflow", "best", job.workflow_dir,
                           stage, "--record"])
        lines.append(f"{best_variable(stage)}=$({best})")
    lines += [shell_line(line) for line in job.lines]
    if job.marker is not None:
        lines.append("touch -- " + word(job.marker))
    return "\n".join(lines) + "\n"


def local_env(task: int | None) -> dict[str, str]:
    """What Slurm would have set for the script, for the local executor."""
    return {} if task is None else {TASK.name: str(task)}

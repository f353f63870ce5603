"""A sweep as one Slurm job array: N run directories, one sbatch, `--array=0-3%2`.

Each task is a full run of its own (spec.yaml, checkpoints, events, requeue). The members' run
directories share a prefix, `<root>/<name>-<stamp>-m<index>`, so one script serves them all: its
driver line names the member's directory with `$SLURM_ARRAY_TASK_ID`, and sbatch's output goes
to that member's submitit/ folder (`%A_%a` in the path: the `<array>_<task>` id the member's
events carry), where `logs` and `diagnose` look for a driver's output. The driver requeues a
member as `<array>_<task>` (scheduler.job_ref), never the whole array. Members share one script,
hence its sbatch options (resources, time limit, job name): `submit_array` refuses otherwise.
"""

from __future__ import annotations

import shlex
import sys
from dataclasses import dataclass, replace
from datetime import datetime
from pathlib import Path

from hpc_train import events
from hpc_train.errors import SpecError, SubmitError
from hpc_train.rundir import RunPaths, new_stamped_dir
from hpc_train.slurm.options import Options
from hpc_train.slurm.script import run_options, script_parts
from hpc_train.slurm.submit import slurm_executor, with_options
from hpc_train.slurm.submitit_private import script_text, submit_command
from hpc_train.spec import JobSpec, spec_hash

MEMBER = "-m"     # <prefix>-m<index>: a member's run directory


@dataclass(frozen=True)
class ArraySubmission:
    job_id: str                  # the array's id; member k is `<job_id>_<k>`
    members: dict[int, Path]     # index -> run directory, of the tasks submitted
    script: str


def member_dir(prefix: Path, index: int) -> Path:
    return Path(f"{prefix}{MEMBER}{index}")


def member_job(job_id: str, index: int) -> str:
    return f"{job_id}_{index}"


def new_prefix(root: str | Path, name: str, count: int, now: datetime | None = None) -> Path:
    """A prefix whose member directories 0..count-1 are all new; they are created here (the
    first one exclusively, so two sweeps started in the same second do not share a prefix)."""
    def free(prefix: Path) -> bool:
        member_dir(prefix, 0).mkdir(parents=True)
        return not any(member_dir(prefix, k).exists() for k in range(1, count))

    prefix = new_stamped_dir(root, name, free, now)
    for k in range(count):
        RunPaths(member_dir(prefix, k)).make_dirs()
    return prefix


def array_range(indices: list[int], parallelism: int) -> str:
    """sbatch's --array value: `0-3%2` for every member, `1,3%2` for some (pure)."""
    if not indices:
        raise ValueError("a job array needs at least one task")
    ordered = sorted(set(indices))
    spans = [[ordered[0], ordered[0]]]
    for index in ordered[1:]:
        if index == spans[-1][1] + 1:
            spans[-1][1] = index
        else:
            spans.append([index, index])
    text = ",".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return f"{text}%{max(1, min(parallelism, len(ordered)))}"


def array_driver_command(python: str, prefix: Path) -> str:
    """The driver of the member this task is: the prefix quoted, the task index from Slurm."""
    return ("exec " + shlex.join([python, "-m", "hpc_train.job.driver"]) + " "
            + shlex.quote(f"{prefix}{MEMBER}") + '"${SLURM_ARRAY_TASK_ID}"')


def member_outputs(prefix: Path) -> Options:
    """submitit's output/error for every task: the member's own submitit/ folder."""
    escaped = str(prefix).replace("%", "%%")    # sbatch reads % in --output as a pattern
    folder = f"{escaped}{MEMBER}%a/submitit/%A_%a_0_log"
    return {"output": f"{folder}.out", "error": f"{folder}.err"}


def _check_shared_options(specs: dict[int, JobSpec]) -> None:
    """SpecError naming the first member whose sbatch options differ from the first one's."""
    first = min(specs)
    want = run_options(specs[first], "")         # the output is each member's own, and only it
    for index, spec in specs.items():
        if (got := run_options(spec, "")) != want:
            keys = sorted(k for k in set(got) | set(want) if got.get(k) != want.get(k))
            raise SpecError(f"sweep member {index}: sbatch options {', '.join(keys)} differ from "
                            f"member {first}'s; one job array has one set of options. Fix: set "
                            "run.name and slurm.* for all members, not per member")


def _array_job(specs: dict[int, JobSpec], prefix: Path, python: str, parallelism: int,
               options: Options | None):
    """(submitit's executor for the array, the driver line of its script)."""
    first = min(specs)
    _check_shared_options(specs)
    parts = script_parts(specs[first], RunPaths(member_dir(prefix, first)), python)
    parts = with_options(parts, {"array": array_range(list(specs), parallelism), **(options or {})})
    driver = array_driver_command(python, prefix)
    return slurm_executor(RunPaths(member_dir(prefix, first)), replace(parts, driver=driver),
                          member_outputs(prefix)), driver


def planned_array_script(specs: dict[int, JobSpec], prefix: Path, parallelism: int,
                         python: str = sys.executable, options: Options | None = None) -> str:
    """The script `submit_array` would hand to sbatch; nothing is created."""
    return script_text(*_array_job(specs, prefix, python, parallelism, options))


def submit_array(specs: dict[int, JobSpec], prefix: Path, parallelism: int,
                 python: str = sys.executable, options: Options | None = None,
                 again: bool = False) -> ArraySubmission:
    """Submit members `specs` (index -> spec, each spec.yaml already in its run directory) as
    one array; records `submitted` (`resubmitted` when `again`) in each member's events with its
    `<array>_<index>` id."""
    try:
        job = submit_command(*_array_job(specs, prefix, python, parallelism, options))
    except Exception as exc:  # submitit raises plain errors for sbatch failures
        for index in specs:
            events.try_record(RunPaths(member_dir(prefix, index)), events.submit_failed(str(exc)))
        raise SubmitError(f"submission of the sweep array failed: {exc}") from exc
    script = Path(job.paths.submission_file).read_text()
    members = {}
    for index, spec in specs.items():
        paths = RunPaths(member_dir(prefix, index))
        paths.sbatch.write_text(script)
        ref = member_job(str(job.job_id), index)
        event = events.resubmitted(ref, "slurm") if again else \
            events.submitted(ref, "slurm", spec_hash(spec))
        events.record(paths, event)
        members[index] = paths.root
    return ArraySubmission(str(job.job_id), members, script)

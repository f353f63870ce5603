"""Submission: a run directory, then submitit (Slurm, or its local executor without sbatch).

Uses the one-driver pattern: the batch script runs one process, the driver (`use_srun=False`,
made the batch shell itself by `exec`), and Slurm reserves `ntasks_per_node` slots per node for
mpirun. Under Slurm the script is made from the same parts as a rendered one (slurm/script.py).
"""

from __future__ import annotations

import dataclasses
import shlex
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hpc_train import events, scheduler
from hpc_train.errors import SlurmUnavailable, SpecError, SubmitError
from hpc_train.rundir import RunPaths
from hpc_train.slurm.options import Options, setup_lines, submitit_parameters
from hpc_train.slurm.run_code import CODE_NEW, attach_code, take_snapshot
from hpc_train.slurm.script import ScriptParts, code_assignments, script_parts
from hpc_train.slurm.submitit_private import script_text, submit_command
from hpc_train.spec import JobSpec, dump_spec_yaml, spec_hash


@dataclass(frozen=True)
class Submission:
    job_id: str
    run_dir: Path
    executor: str          # "slurm" or "local"
    script: str            # the sbatch script ("" for the local executor)
    job: Any = field(default=None, compare=False, repr=False)  # submitit's Job (wait on a local one)


def with_options(parts: ScriptParts, options: Options | None) -> ScriptParts:
    """`parts` plus sbatch options of one submission only (a workflow's --dependency): they go
    into the submitted script, never into the run's spec, so `resume` submits without them."""
    return dataclasses.replace(parts, options={**parts.options, **options}) if options else parts


def slurm_executor(paths: RunPaths, parts: ScriptParts, outputs: Options | None = None):
    """outputs: submitit's own `output`/`error` replaced (a job array writes each task's log
    into its member's run directory)."""
    import submitit

    # No `python` or `max_num_timeout`: they shape submitit's own entry point, which our driver
    # line replaces; the driver requeues the job itself (job/requeue.py).
    executor = submitit.SlurmExecutor(folder=paths.submitit)
    executor.update_parameters(use_srun=False, setup=parts.setup,
                               additional_parameters={**submitit_parameters(parts.options),
                                                      **(outputs or {})})
    return executor


def local_executor(spec: JobSpec, paths: RunPaths, python: str, code: Path | None = None):
    import submitit

    # No `exec` here: the local controller runs the command without a shell. The snapshot's
    # variables go last in the setup lines, which the controller and its task inherit.
    setup = setup_lines(spec.slurm) + ([f"export {code_assignments(code)}"] if code else [])
    executor = submitit.LocalExecutor(folder=paths.submitit, python=shlex.quote(python),
                                      max_num_timeout=spec.checkpoint.max_requeues)
    executor.update_parameters(timeout_min=spec.slurm.time_minutes, tasks_per_node=1,
                               signal_delay_s=spec.slurm.signal_seconds, setup=setup)
    return executor


def planned_script(spec: JobSpec, run_dir: Path, python: str = sys.executable,
                   snapshot: bool = False, options: Options | None = None) -> str:
    """The exact sbatch script `submit` would hand to Slurm, without creating anything."""
    paths = RunPaths(run_dir)
    parts = with_options(script_parts(spec, paths, python, paths.code if snapshot else None), options)
    return script_text(slurm_executor(paths, parts), parts.driver)


def _submit_job(spec: JobSpec, paths: RunPaths, python: str, use_slurm: bool, code: Path | None,
                options: Options | None):
    if use_slurm:
        parts = with_options(script_parts(spec, paths, python, code), options)
        return submit_command(slurm_executor(paths, parts), parts.driver)
    from hpc_train.job.driver import Driver

    # Locally submitit runs a pickled callable: there is no batch script to share. The pickle
    # names the driver's module only; the task process imports it from the snapshot.
    return local_executor(spec, paths, python, code).submit(Driver(paths.root))


def submit(spec: JobSpec, python: str = sys.executable, use_slurm: bool | None = None,
           paths: RunPaths | None = None, code: str = CODE_NEW,
           options: Options | None = None) -> Submission:
    """Submit `spec` as a new run, or again into an existing run directory (`resume`).
    code: CODE_NEW, CODE_KEEP or CODE_NONE, what the job imports (slurm/run_code.py);
    options: sbatch options of this submission only (Slurm; see with_options)."""
    use_slurm = shutil.which("sbatch") is not None if use_slurm is None else use_slurm
    if not use_slurm and spec.launch.method == "srun":
        raise SpecError("launch.method: 'srun' is not allowed without Slurm (submitit's local "
                        "executor): srun starts ranks inside a Slurm allocation only. Fix: "
                        "--set launch.method=mpirun to run here, or submit to Slurm")
    if use_slurm and (problem := scheduler.controller_problem()) is not None:
        raise SlurmUnavailable(
            f"Slurm's controller does not answer ({problem}); nothing was submitted. Fix: start "
            "the project's single-node Slurm with `bash env/slurm/start.sh` (root), or run the "
            "job on this machine with --local")
    taken = take_snapshot(spec, paths, code)
    where = "resume" if paths else "submit"
    if paths is None:
        paths = RunPaths.new(spec.run.root, spec.run.name)
        paths.spec.write_text(dump_spec_yaml(spec))
    code_link = attach_code(paths, code, taken, where)
    try:
        job = _submit_job(spec, paths, python, use_slurm, code_link, options)
    except Exception as exc:  # submitit raises plain errors for sbatch failures
        events.try_record(paths, events.submit_failed(str(exc)))
        raise SubmitError(f"submission failed: {exc}\n(run directory kept: {paths.root})") from exc
    script = ""
    if use_slurm:
        script = Path(job.paths.submission_file).read_text()
        paths.sbatch.write_text(script)
    events.record(paths, events.submitted(str(job.job_id), "slurm" if use_slurm else "local",
                                          spec_hash(spec)))
    return Submission(str(job.job_id), paths.root, "slurm" if use_slurm else "local", script, job)

"""Submission: a run directory, then submitit (Slurm, or its local executor without sbatch).

Uses the one-driver pattern: submitit runs one Python task (`use_srun=False`, made the batch
shell itself by `exec`), and Slurm reserves `ntasks_per_node` slots per node for mpirun.
"""

from __future__ import annotations

import shlex
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path

from hpc_train.errors import SubmitError
from hpc_train import events
from hpc_train.rundir import RunPaths
from hpc_train.slurm.options import sbatch_options
from hpc_train.spec import JobSpec, dump_spec_yaml, spec_hash


@dataclass(frozen=True)
class Submission:
    job_id: str
    run_dir: Path
    executor: str          # "slurm" or "local"
    script: str            # the sbatch script ("" for the local executor)


def setup_lines(spec: JobSpec) -> list[str]:
    """Site profile first (sourced), then the spec's own lines: both are the user's shell."""
    lines = []
    if spec.slurm.site_profile:
        lines.append(f"source {shlex.quote(str(Path(spec.slurm.site_profile).resolve()))}")
    return lines + list(spec.slurm.setup)


def slurm_executor(spec: JobSpec, paths: RunPaths, python: str):
    import submitit

    # `exec`: without it bash stays the batch process, dies on USR2, and orphans Python.
    executor = submitit.SlurmExecutor(folder=paths.submitit, python="exec " + shlex.quote(python),
                                      max_num_timeout=spec.checkpoint.max_requeues)
    # submitit spells option keys with underscores (and turns them into dashes); ours must use
    # the same keys to replace its values instead of adding a second, conflicting line.
    # It sets --output/--error (its log files) and --open-mode=append itself.
    options = {name.replace("-", "_"): value
               for name, value in sbatch_options(spec, output="unused").items()
               if name not in ("output", "open-mode")}
    executor.update_parameters(
        job_name=spec.run.name, time=spec.time_minutes, nodes=spec.slurm.nodes,
        ntasks_per_node=1, use_srun=False, signal_delay_s=spec.slurm.signal_seconds,
        setup=setup_lines(spec),
        # Our options win over submitit's own: ntasks_per_node=N slots, B:USR2, --requeue.
        additional_parameters=options)
    return executor


def local_executor(spec: JobSpec, paths: RunPaths, python: str):
    import submitit

    # No `exec` here: the local controller runs the command without a shell.
    executor = submitit.LocalExecutor(folder=paths.submitit, python=shlex.quote(python),
                                      max_num_timeout=spec.checkpoint.max_requeues)
    executor.update_parameters(timeout_min=spec.time_minutes, tasks_per_node=1,
                               signal_delay_s=spec.slurm.signal_seconds, setup=setup_lines(spec))
    return executor


def planned_script(spec: JobSpec, run_dir: Path, python: str = sys.executable) -> str:
    """The exact sbatch script `submit` would hand to Slurm, without creating anything."""
    executor = slurm_executor(spec, RunPaths(run_dir), python)
    # submitit's own renderer, so the dry run prints what a real submission writes.
    return executor._make_submission_file_text(executor._submitit_command_str, "dry-run")


def submit(spec: JobSpec, python: str = sys.executable, use_slurm: bool | None = None,
           paths: RunPaths | None = None) -> Submission:
    """Submit `spec` as a new run, or again into an existing run directory (`resume`)."""
    from hpc_train.job.driver import Driver

    use_slurm = shutil.which("sbatch") is not None if use_slurm is None else use_slurm
    if paths is None:
        paths = RunPaths.new(spec.run.root, spec.run.name)
        paths.spec.write_text(dump_spec_yaml(spec))
    make = slurm_executor if use_slurm else local_executor
    try:
        job = make(spec, paths, python).submit(Driver(paths.root))
    except Exception as exc:  # submitit raises plain errors for sbatch failures
        events.try_record(paths, events.submit_failed(str(exc)))
        raise SubmitError(f"submission failed: {exc}\n(run directory kept: {paths.root})") from exc
    script = ""
    if use_slurm:
        script = Path(job.paths.submission_file).read_text()
        paths.sbatch.write_text(script)
    events.record(paths, events.submitted(str(job.job_id), "slurm" if use_slurm else "local",
                                          spec_hash(spec)))
    return Submission(str(job.job_id), paths.root, "slurm" if use_slurm else "local", script)

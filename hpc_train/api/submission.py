"""`submit` and `resume` from Python: what the commands do, returning a Run to follow.

The commands `submit` and `resume` call these (hpc_train/cli.py), so a job submitted from a
notebook is the job the command line would submit: the same checks before the queue, the same
run directory, the same events.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from hpc_train.api.run import Run
from hpc_train.api.specs import SpecSource, submission_spec
from hpc_train.slurm import submit as slurm_submit
from hpc_train.slurm.resume import resume_run
from hpc_train.slurm.run_code import CODE_KEEP, CODE_NEW, CODE_NONE


def submit(spec: SpecSource, overrides: Iterable[str] = (), local: bool = False,
           snapshot: bool = True, ask_slurm: bool = True) -> Run:
    """Check `spec` (a YAML file's path, a dict of sections or a JobSpec) with KEY=VALUE
    `overrides`, create its run directory and submit it; the Run of the new job.

    local: run here through submitit's local executor (also the case without sbatch on PATH:
    Run.executor says which); snapshot: the job imports a copy of the source taken now (else
    the installed package); ask_slurm: check nodes and per-node resources against sinfo.
    Raises SpecInvalid (`.problems`) on a bad spec, SlurmUnavailable, SubmitError."""
    checked = submission_spec(spec, overrides, ask_slurm=ask_slurm and not local)
    result = slurm_submit.submit(checked, use_slurm=False if local else None,
                                 code=CODE_NEW if snapshot else CODE_NONE)
    return Run(result.run_dir, result.job)


def resume(run_dir: str | Path, overrides: Iterable[str] = (), allow_spec_change: bool = False,
           local: bool = False, code: str = CODE_KEEP) -> Run:
    """Submit the run in `run_dir` again; it continues from its latest complete checkpoint.
    Refused (SubmitError) while its job is still queued or running; overrides that change the
    spec need `allow_spec_change` (SpecError otherwise). code: slurm/run_code.py's modes."""
    result = resume_run(run_dir, list(overrides), allow_spec_change,
                        use_slurm=False if local else None, code=code)
    return Run(result.run_dir, result.job)

"""The one place that uses submitit's private API.

submitit's public `submit(fn)` pickles a callable and runs it with `python -m
submitit.core._submit`. Our Slurm job runs the driver line that a rendered script runs
(slurm/script.py), so both forms start a job the same way; submitit has no public call to submit
a command, nor to show the script without submitting it (`submit --dry-run`). Its executors have
both as private methods, used here only and checked on each call: a submitit release that
changes them fails with a SubmitError that says so (tests/slurm/test_render.py checks the installed
submitit), not with an AttributeError or a wrong script.
"""

from __future__ import annotations

import inspect

from hpc_train.errors import SubmitError

# The private methods and their parameters after `self`, as in submitit 1.5.4.
PRIVATE = {"_submit_command": ("command",), "_make_submission_file_text": ("command", "uid")}


def private_method(executor, name: str):
    method = getattr(executor, name, None)
    expected = PRIVATE[name]
    if method is None or tuple(inspect.signature(method).parameters) != expected:
        import submitit

        raise SubmitError(f"submitit {submitit.__version__} has no {type(executor).__name__}."
                          f"{name}({', '.join(expected)}), which hpc_train uses to submit the driver "
                          "command. Fix: install submitit 1.5.4 (pip install submitit==1.5.4), or "
                          "adapt hpc_train/slurm/submitit_private.py to this release")
    return method


def script_text(executor, command: str) -> str:
    """The sbatch script `executor` would submit for `command`; nothing is written."""
    return private_method(executor, "_make_submission_file_text")(command, "dry-run")


def submit_command(executor, command: str):
    """Submit `command` as the body of the job's script; submitit's Job (id, paths)."""
    return private_method(executor, "_submit_command")(command)

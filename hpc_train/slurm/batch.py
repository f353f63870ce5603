"""A small batch job of our own (`doctor --nodes`, `bench train --submit`): its script, sbatch's
arguments and a bounded wait for its end (submitted with scheduler.submit).

It uses whichever Slurm the environment points at (SLURM_CONF included), and sbatch exports this
environment to the job (its default, --export=ALL), so the job runs this Python and package.
Every value travels as an argv element; the one generated text, the script, quotes each word.
"""

from __future__ import annotations

import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

from hpc_train import scheduler

POLL_SECONDS = 2.0


def script_text(command: Sequence[str], setup: Sequence[str] = (), comment: str = "") -> str:
    """`#!/bin/bash`, a comment, the site's setup lines (its shell, as written; a failing one
    stops the script), then `exec` of the command, every word quoted."""
    lines = ["#!/bin/bash"]
    if comment:
        lines.append(f"# {comment}")
    if setup:
        lines += ["set -euo pipefail", *setup]
    lines.append("exec " + shlex.join(command))
    return "\n".join(lines) + "\n"


def sbatch_args(options: Mapping[str, str | bool], script: Path) -> list[str]:
    """sbatch's arguments `--NAME=VALUE ... SCRIPT` (True: a bare flag)."""
    flags = [f"--{name}" if value is True else f"--{name}={value}" for name, value in options.items()]
    return [*flags, str(script)]


def wait_for(job_id: str, timeout: float, poll: float = POLL_SECONDS) -> tuple[bool, str]:
    """Poll squeue until the job has left the queue or the timeout: (ended, the last state
    seen; '' when squeue never listed it)."""
    until = time.monotonic() + timeout
    seen = ""
    while time.monotonic() < until:
        jobs = scheduler.queue([job_id])     # None: squeue failed this time; ask again
        if jobs == [] or (jobs and not jobs[0].state.active):
            return True, jobs[0].label if jobs else seen
        seen = jobs[0].label if jobs else seen
        time.sleep(poll)
    return False, seen

"""A batch job's sbatch options and setup lines from a Resources value, made in one place.

Every job we submit asks for resources here (a run: submit, render; a workflow stage; `doctor
--nodes`; `bench train --submit`), so a key means one option everywhere and no two generators
drift. Out as `#SBATCH` lines or as submitit's parameters."""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from hpc_train.spec import Resources

Options = dict[str, "str | bool"]   # sbatch option name (no --) -> value, True for a bare flag
_NAMED = ("partition", "account", "qos", "constraint", "mem", "mail_type", "mail_user")


@dataclass(frozen=True)
class JobShape:
    """What a job is, apart from its resources. signal_seconds: a run's driver stops at USR2
    (sent to the batch shell: `B:`) and requeues itself; a stage's job and ours do neither."""
    name: str
    output: str                        # sbatch --output pattern
    nodes: int = 1
    tasks_per_node: int = 1
    signal_seconds: int | None = None


def sbatch_options(resources: Resources, shape: JobShape) -> Options:
    """Ordered sbatch options: the shape, the resources, then the user's `extra` ones."""
    r = resources
    options: Options = {"job-name": shape.name, "nodes": str(shape.nodes),
                        "ntasks-per-node": str(shape.tasks_per_node),
                        "cpus-per-task": str(r.cpus_per_task), "time": str(r.time_minutes)}
    if shape.signal_seconds is not None:
        options.update({"signal": f"B:USR2@{shape.signal_seconds}", "requeue": True})
    options.update({"open-mode": "append", "output": shape.output})   # a rerun keeps the earlier output
    named = {"gpus-per-node": r.gpus_per_node or None, **{n.replace("_", "-"): getattr(r, n) for n in _NAMED}}
    options.update({name: str(value) for name, value in named.items() if value is not None})
    return {**options, **{name: value if value != "" else True for name, value in r.extra.items()}}


def setup_lines(resources: Resources) -> list[str]:
    """Site profile first (sourced), then the `setup` lines: both are the user's shell."""
    profile = resources.site_profile
    return ([f"source {shlex.quote(str(Path(profile).resolve()))}"] if profile else []) + list(resources.setup)


def sbatch_directives(options: Options) -> str:
    """The `#SBATCH` lines, every value shell-quoted."""
    return "\n".join(f"#SBATCH --{name}" if value is True else f"#SBATCH --{name}={shlex.quote(value)}"
                     for name, value in options.items())


def submitit_parameters(options: Options) -> Options:
    """`options` as submitit's `additional_parameters`, which replace its own: with its
    underscored keys, so they replace its values instead of adding conflicting lines. It sets
    --output/--error (its log files: the driver's output) and --open-mode=append itself."""
    return {name.replace("-", "_"): value for name, value in options.items()
            if name not in ("output", "open-mode")}

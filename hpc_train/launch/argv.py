"""The mpirun command line: a pure function of the launch settings and the allocation.

Flags per implementation follow what each documents for Horovod-style jobs. Open MPI:
`-bind-to none -map-by slot` (Horovod's recommendation; ranks pin their own GPU) and `-x` to
export variables. MPICH/Hydra: `-hosts h:n` and `-genv`. Intel MPI: `-ppn` and `-genv`.
The result is an argv list: spec values are never pasted into a shell string.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hpc_train.launch.allocation import Allocation

# Variables every rank needs from the driver's environment, whatever the spec exports.
PASS_THROUGH = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "SLURM_JOB_ID", "SLURM_RESTART_COUNT")


def inherited(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The PASS_THROUGH variables that are set: Open MPI warns about each `-x` of an unset one."""
    return tuple(name for name in PASS_THROUGH if name in environ)


@dataclass(frozen=True)
class LaunchPlan:
    flavour: str                      # "openmpi" | "mpich" | "intel"
    allocation: Allocation
    worker: Sequence[str]             # e.g. [python, "-m", "hpc_train.job.worker", run_dir]
    env: Mapping[str, str] = field(default_factory=dict)
    extra_args: Sequence[str] = ()
    inherit: Sequence[str] = PASS_THROUGH  # names copied from the driver's environment
    as_root: bool = False             # Open MPI refuses root without an explicit flag
    mpirun: str = "mpirun"


def _hosts_with_slots(allocation: Allocation) -> str:
    return ",".join(f"{host}:{slots}" for host, slots in allocation.hosts)


def _openmpi(plan: LaunchPlan) -> list[str]:
    argv = [plan.mpirun, "-np", str(plan.allocation.world_size),
            "-H", _hosts_with_slots(plan.allocation), "-bind-to", "none", "-map-by", "slot"]
    if plan.as_root:
        argv.append("--allow-run-as-root")
    for name in plan.inherit:
        argv += ["-x", name]
    for name, value in plan.env.items():
        argv += ["-x", f"{name}={value}"]
    return argv


def _mpich(plan: LaunchPlan) -> list[str]:
    argv = [plan.mpirun, "-n", str(plan.allocation.world_size),
            "-hosts", _hosts_with_slots(plan.allocation), "-genvlist", ",".join(plan.inherit)]
    for name, value in plan.env.items():
        argv += ["-genv", name, value]
    return argv


def _intel(plan: LaunchPlan) -> list[str]:
    slots = {slots for _, slots in plan.allocation.hosts}
    if len(slots) != 1:
        raise ValueError(f"Intel MPI's -ppn needs the same ranks on every host, got {plan.allocation.hosts}")
    argv = [plan.mpirun, "-n", str(plan.allocation.world_size), "-ppn", str(slots.pop()),
            "-hosts", ",".join(plan.allocation.host_names), "-genvlist", ",".join(plan.inherit)]
    for name, value in plan.env.items():
        argv += ["-genv", name, value]
    return argv


_BUILDERS = {"openmpi": _openmpi, "mpich": _mpich, "intel": _intel}


def mpirun_argv(plan: LaunchPlan) -> list[str]:
    try:
        build = _BUILDERS[plan.flavour]
    except KeyError:
        raise ValueError(f"unknown MPI flavour {plan.flavour!r}; known: {', '.join(_BUILDERS)}") from None
    return [*build(plan), *plan.extra_args, *plan.worker]

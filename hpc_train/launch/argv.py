"""The launcher command line: a pure function of the launch settings and the allocation.

Two methods start the ranks from the one driver process:

- `mpirun` (Open MPI, MPICH/Hydra, Intel MPI). Open MPI: `-bind-to none -map-by slot` (Horovod's
  recommendation; ranks pin their own GPU) and `-x` to export variables. MPICH/Hydra: `-hosts h:n`
  and `-genv`. Intel MPI: `-ppn` and `-genv`. Inside a Slurm job Open MPI starts its remote
  daemons through Slurm itself (an `orted` step), so no ssh is needed.
- `srun --mpi=<pmi>`: Slurm starts every rank itself (direct launch, PMIx wire-up), as sites that
  want Slurm's binding and accounting ask. Variables reach the ranks through srun's environment
  (`launcher_env`), which it exports to every task.

The result is an argv list: spec values are never pasted into a shell string.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from hpc_train.launch.allocation import Allocation
from hpc_train.launch.identity import LAUNCHER_ENV
from hpc_train.launch.network import mpirun_interface_args, srun_interface_env

# Variables every rank needs from the driver's environment, whatever the spec exports.
# PYTHONPATH and PYTHONSAFEPATH: the ranks import the run's code snapshot as the driver does.
PASS_THROUGH = ("PATH", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSAFEPATH", "SLURM_JOB_ID",
                "SLURM_RESTART_COUNT")
# A task of a job array (a sweep member): the ranks name their job `<array>_<task>` in events.
ARRAY_PASS_THROUGH = ("SLURM_ARRAY_JOB_ID", "SLURM_ARRAY_TASK_ID")


def inherited(environ: Mapping[str, str]) -> tuple[str, ...]:
    """The PASS_THROUGH variables that are set: Open MPI warns about each `-x` of an unset one."""
    return tuple(name for name in PASS_THROUGH + ARRAY_PASS_THROUGH if name in environ)


@dataclass(frozen=True)
class LaunchPlan:
    flavour: str                      # "openmpi" | "mpich" | "intel": the MPI the ranks use
    allocation: Allocation
    worker: Sequence[str]             # e.g. [python, "-m", "hpc_train.job.worker", run_dir]
    env: Mapping[str, str] = field(default_factory=dict)
    extra_args: Sequence[str] = ()
    inherit: Sequence[str] = PASS_THROUGH  # names copied from the driver's environment
    as_root: bool = False             # Open MPI refuses root without an explicit flag
    mpirun: str = "mpirun"            # the mpirun (or mpiexec) to run
    method: str = "mpirun"            # "mpirun" | "srun"
    pmi: str = "pmix"                 # srun --mpi=<pmi>
    cpus_per_task: int = 1            # srun needs it spelled out (22.05 no longer inherits -c)
    network_interface: str | None = None  # an interface name or a subnet, for every layer

    @property
    def rank_env(self) -> dict[str, str]:
        """What every rank gets on top of the inherited variables."""
        return {LAUNCHER_ENV: self.method, **self.env}


def _hosts_with_slots(allocation: Allocation) -> str:
    return ",".join(f"{host}:{slots}" for host, slots in allocation.hosts)


def _openmpi(plan: LaunchPlan) -> list[str]:
    argv = [plan.mpirun, "-np", str(plan.allocation.world_size),
            "-H", _hosts_with_slots(plan.allocation), "-bind-to", "none", "-map-by", "slot"]
    if plan.as_root:
        argv.append("--allow-run-as-root")
    for name in plan.inherit:
        argv += ["-x", name]
    for name, value in plan.rank_env.items():
        argv += ["-x", f"{name}={value}"]
    return argv


def _mpich(plan: LaunchPlan) -> list[str]:
    argv = [plan.mpirun, "-n", str(plan.allocation.world_size),
            "-hosts", _hosts_with_slots(plan.allocation), "-genvlist", ",".join(plan.inherit)]
    for name, value in plan.rank_env.items():
        argv += ["-genv", name, value]
    return argv


def _intel(plan: LaunchPlan) -> list[str]:
    slots = {slots for _, slots in plan.allocation.hosts}
    if len(slots) != 1:
        raise ValueError(f"Intel MPI's -ppn needs the same ranks on every host, got {plan.allocation.hosts}")
    argv = [plan.mpirun, "-n", str(plan.allocation.world_size), "-ppn", str(slots.pop()),
            "-hosts", ",".join(plan.allocation.host_names), "-genvlist", ",".join(plan.inherit)]
    for name, value in plan.rank_env.items():
        argv += ["-genv", name, value]
    return argv


_BUILDERS = {"openmpi": _openmpi, "mpich": _mpich, "intel": _intel}


def mpirun_argv(plan: LaunchPlan) -> list[str]:
    try:
        build = _BUILDERS[plan.flavour]
    except KeyError:
        raise ValueError(f"unknown MPI flavour {plan.flavour!r}; known: {', '.join(_BUILDERS)}") from None
    interface = mpirun_interface_args(plan.flavour, plan.network_interface)
    return [*build(plan), *interface, *plan.extra_args, *plan.worker]


def srun_argv(plan: LaunchPlan) -> list[str]:
    """srun inside the job's allocation: the tasks laid out exactly as the allocation's slots.

    --kill-on-bad-exit: a rank that fails ends the step at once, as mpirun does, instead of
    leaving its peers blocked in a collective. CPU binding is left to the site's Slurm (its
    reason to ask for srun); launch.extra_args can pass `--cpu-bind=...`.
    """
    return ["srun", f"--mpi={plan.pmi}", f"--ntasks={plan.allocation.world_size}",
            *_srun_layout(plan.allocation), f"--cpus-per-task={plan.cpus_per_task}",
            "--kill-on-bad-exit=1", *plan.extra_args, *plan.worker]


def _srun_layout(allocation: Allocation) -> list[str]:
    """The same slots on every host: per-node counts. Uneven slots (e.g. `2(x3),1`): the
    `arbitrary` distribution, which places task i on the i-th name of the node list."""
    hosts = allocation.host_names
    slots = {n for _, n in allocation.hosts}
    if len(slots) == 1:
        return [f"--nodes={len(hosts)}", f"--ntasks-per-node={slots.pop()}",
                f"--nodelist={','.join(hosts)}"]
    placement = [host for host, n in allocation.hosts for _ in range(n)]
    return [f"--nodes={len(hosts)}", "--distribution=arbitrary", f"--nodelist={','.join(placement)}"]


def launch_argv(plan: LaunchPlan) -> list[str]:
    """The command that starts the ranks, by the plan's method."""
    if plan.method == "srun":
        return srun_argv(plan)
    if plan.method == "mpirun":
        return mpirun_argv(plan)
    raise ValueError(f"unknown launch method {plan.method!r}; known: mpirun, srun")


def launcher_env(plan: LaunchPlan, environ: Mapping[str, str]) -> dict[str, str]:
    """The launcher process's environment. mpirun gets the driver's own (the ranks' variables
    travel in its argv); srun exports its environment to every task, so they go here."""
    if plan.method != "srun":
        return dict(environ)
    return {**environ, **srun_interface_env(plan.network_interface), **plan.rank_env}

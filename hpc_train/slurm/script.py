"""What both forms of a run's sbatch script share: the sbatch options and setup lines (made by
slurm/options.py) and the driver line. submitit's script (`submit`) and the rendered one
(`render`) lay them out their own way, but a job of either form runs the same shell.

The one-driver pattern (docs/architecture.md): Slurm reserves `tasks_per_node` slots per node,
but the batch script runs one driver process, which starts the ranks with mpirun. `B:` sends the
stop signal to the batch shell (and, through `exec`, to the driver itself), not to job steps.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path

from hpc_train.rundir import RunPaths
from hpc_train.slurm.options import JobShape, Options, sbatch_options, setup_lines
from hpc_train.spec import JobSpec


@dataclass(frozen=True)
class ScriptParts:
    options: Options                 # sbatch options in order; --output is a rendered script's
    setup: list[str]                 # shell lines run before the driver
    driver: str                      # the last line: the driver replaces the batch shell


def run_options(spec: JobSpec, output: str) -> Options:
    """A run's sbatch options: its resources, nodes x ranks (a range MIN-MAX as Slurm's own,
    spares on both ends), the stop signal and requeue."""
    s = spec.slurm
    options = sbatch_options(s, JobShape(spec.run.name, output, s.nodes + s.spare_nodes,
                                         s.tasks_per_node, s.signal_seconds))
    ranged = s.fewest_nodes < s.nodes
    if ranged:
        options["nodes"] = f"{s.fewest_nodes + s.spare_nodes}-{s.nodes + s.spare_nodes}"
        # Asked for a range alone, Slurm (22.05, cons_tres, nodes shared) starts the job on its
        # fewest nodes, however many are idle: the tasks of every node make it start on the
        # most. The range stays what a job may shrink to when nodes die under it (--no-kill).
        options["ntasks"] = str((s.nodes + s.spare_nodes) * s.tasks_per_node)
    # Spares and a range only help if a node's death does not end the allocation.
    return {**options, "no-kill": True} if s.spare_nodes or ranged else options


def code_assignments(code: Path) -> str:
    """Shell assignments that make a process import the run's code snapshot (slurm/snapshot.py):
    its folder first on PYTHONPATH (the user's entries kept after it; the ranks inherit the
    variable), and PYTHONSAFEPATH so that the current directory, which Python otherwise puts
    first for `-m`, cannot shadow it with a checkout of its own."""
    return f'PYTHONPATH={shlex.quote(str(code))}"${{PYTHONPATH:+:$PYTHONPATH}}" PYTHONSAFEPATH=1'


def driver_command(python: str, run_dir: Path, code: Path | None = None) -> str:
    """The script's last line. `code`: the run's snapshot link, imported instead of the installed
    package (after the setup lines, so no module load can put another copy ahead of it)."""
    # `exec`: without it bash stays the batch process, dies on USR2, and orphans Python.
    # `exec env ...`: env replaces itself with Python, which still is the batch process.
    driver = shlex.join([python, "-m", "hpc_train.job.driver", str(run_dir)])
    return f"exec env {code_assignments(code)} {driver}" if code else f"exec {driver}"


def script_parts(spec: JobSpec, paths: RunPaths, python: str, code: Path | None = None) -> ScriptParts:
    return ScriptParts(run_options(spec, str(paths.slurm_output())), setup_lines(spec.slurm),
                       driver_command(python, paths.root, code))

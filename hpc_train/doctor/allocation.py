"""`doctor --allocation`: inside a Slurm allocation, start one probe per node with the launcher
jobs use, and compare what the nodes report.

One probe per node, not per slot: what must agree (installed packages, Horovod's build, GPUs)
belongs to a node, not to a slot, and each probe imports torch and Horovod, which on a node of
eight GPU slots would cost eight imports to learn one thing eight times. The allreduce still
crosses every node, the path that breaks between nodes; the slots of one node share its memory.

The probes start exactly as a job's ranks do (launch.argv's LaunchPlan, launch_argv,
launcher_env), so a launcher that cannot start a job here cannot start the doctor either, and
the failure shows up where it would in a job. The launch is bounded by a timeout; the probes
write their reports to files on the shared filesystem (OUT_DIR/rank-N.json).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from hpc_train.doctor.compare import LaunchResult, compare
from hpc_train.doctor.faults import DOCTOR_FAULT_ENV
from hpc_train.errors import LaunchError
from hpc_train.launch.allocation import Allocation, allocation_from_slurm
from hpc_train.launch.argv import LaunchPlan, inherited, launch_argv, launcher_env
from hpc_train.launch.local import LocalMpirun, find_local_mpirun, free_port
from hpc_train.launch.mpi import MpiFlavour

PROBE_MODULE = "hpc_train.doctor.node_probe"
DEFAULT_TIMEOUT = 180.0
TAIL_CHARS = 4000


def one_per_node(allocation: Allocation) -> Allocation:
    return Allocation(tuple((host, 1) for host in allocation.host_names))


def default_out_dir(environ: Mapping[str, str], stamp: str) -> Path:
    """runs/doctor-<job id>-<stamp> under the working directory: the probes on every node must
    see it, and the submit directory is on the shared filesystem where the run directories are."""
    return Path("runs") / f"doctor-{environ.get('SLURM_JOB_ID', 'nojob')}-{stamp}"


def probe_plan(allocation: Allocation, method: str, out_dir: Path, environ: Mapping[str, str],
               port: int, mpirun: LocalMpirun | None, python: str, as_root: bool) -> LaunchPlan:
    """The LaunchPlan of the probes: MASTER_ADDR is the first host, where rank 0 runs."""
    env = {"MASTER_ADDR": allocation.host_names[0], "MASTER_PORT": str(port)}
    if environ.get(DOCTOR_FAULT_ENV):
        env[DOCTOR_FAULT_ENV] = environ[DOCTOR_FAULT_ENV]
    flavour, path = "openmpi", "mpirun"
    if method == "mpirun":
        if mpirun is None:
            raise LaunchError("mpirun is not on PATH in this allocation: load your MPI module, or "
                              "use --launcher srun")
        if mpirun.info.flavour is MpiFlavour.UNKNOWN:
            raise LaunchError(f"{mpirun.path} is no MPI the doctor knows (Open MPI, MPICH, Intel "
                              "MPI); use --launcher srun")
        flavour, path = mpirun.info.flavour.value, mpirun.path
    return LaunchPlan(flavour=flavour, allocation=allocation, env=env,
                      worker=[python, "-m", PROBE_MODULE, str(out_dir)], inherit=inherited(environ),
                      as_root=as_root, mpirun=path, method=method)


def run_launcher(argv: list[str], env: dict[str, str], timeout: float) -> LaunchResult:
    """Run mpirun/srun to the end or the timeout. On timeout: SIGTERM first (both pass it on to
    their ranks and clean up), SIGKILL only if that is not enough within 10 s."""
    start = time.monotonic()
    try:
        process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   text=True, errors="replace")
    except FileNotFoundError as exc:
        return LaunchResult(argv, 127, 0.0, str(exc))
    try:
        output, _ = process.communicate(timeout=timeout)
        returncode = process.returncode
    except subprocess.TimeoutExpired:
        process.terminate()
        try:
            output, _ = process.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            output, _ = process.communicate()
        returncode = 124
    return LaunchResult(argv, returncode, time.monotonic() - start, (output or "")[-TAIL_CHARS:])


def read_reports(out_dir: Path, world_size: int) -> dict[int, dict]:
    reports = {}
    for rank in range(world_size):
        try:
            reports[rank] = json.loads((out_dir / f"rank-{rank}.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
    return reports


def check_allocation(method: str, out_dir: Path | None, timeout: float, environ: Mapping[str, str]) -> dict:
    if "SLURM_JOB_NODELIST" not in environ:
        raise LaunchError("doctor --allocation runs inside a Slurm allocation (salloc or sbatch); "
                          "from a login node use `doctor --nodes N`")
    allocation = one_per_node(allocation_from_slurm(environ))
    out_dir = (out_dir or default_out_dir(environ, time.strftime("%Y%m%d-%H%M%S"))).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    for stale in out_dir.glob("rank-*.json"):  # an earlier doctor's reports must not count
        stale.unlink()
    plan = probe_plan(allocation, method, out_dir, environ, free_port(),
                      find_local_mpirun() if method == "mpirun" else None, sys.executable,
                      as_root=os.geteuid() == 0)
    launch = run_launcher(launch_argv(plan), launcher_env(plan, environ), timeout)
    placement = [host for host, slots in allocation.hosts for _ in range(slots)]
    report = compare(placement, read_reports(out_dir, allocation.world_size), launch)
    report["out_dir"] = str(out_dir)
    report["launcher"]["method"] = method
    return report

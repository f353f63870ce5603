"""The driver: the one process of a job that starts the ranks with mpirun and reports how they ended.

It runs as the batch script itself (submitit's callable, or `exec python -m hpc_train.slurm.driver
RUN_DIR` from a rendered script), so Slurm's `B:USR2` reaches it; it forwards a stop to mpirun,
which passes it to the ranks, and never lets mpirun be SIGKILLed (its ranks would outlive the job).
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from hpc_train.errors import LaunchError
from hpc_train.launch.allocation import Allocation, allocation_from_slurm, local_allocation
from hpc_train.launch.argv import LaunchPlan, inherited, mpirun_argv
from hpc_train.rundir import RunPaths, record_event
from hpc_train.spec import JobSpec, load_spec

log = logging.getLogger("hpc_train.driver")

STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)
GRACE_SECONDS = 60  # ranks get this long to save and exit after a forwarded stop


def rendezvous_port(job_id: str | None) -> int:
    """A port for torch.distributed that differs between jobs sharing a node."""
    return 29500 + (int(job_id) % 2000 if job_id and job_id.isdigit() else 0)


def current_allocation(spec: JobSpec, environ) -> Allocation:
    if environ.get("SUBMITIT_EXECUTOR") != "local" and "SLURM_JOB_NODELIST" in environ:
        allocation = allocation_from_slurm(environ)
    else:
        allocation = local_allocation(socket.gethostname(), spec.world_size)
    if allocation.world_size != spec.world_size:
        raise LaunchError(f"the allocation has {allocation.world_size} slots "
                          f"({allocation.hosts}) but the spec asks for {spec.world_size} ranks")
    return allocation


def launch_plan(spec: JobSpec, paths: RunPaths, allocation: Allocation, environ) -> LaunchPlan:
    mpirun = shutil.which("mpiexec" if spec.launch.mpi == "mpich" else "mpirun")
    if mpirun is None:
        raise LaunchError("mpirun is not on PATH in the job: add your MPI module to slurm.setup")
    env = {
        "MASTER_ADDR": allocation.host_names[0],
        "MASTER_PORT": str(rendezvous_port(environ.get("SLURM_JOB_ID"))),
        **spec.launch.env,
    }
    return LaunchPlan(
        flavour=spec.launch.mpi, allocation=allocation, env=env,
        worker=[sys.executable, "-m", "hpc_train.runtime.worker", str(paths.root)],
        extra_args=spec.launch.extra_args, inherit=inherited(environ),
        as_root=os.geteuid() == 0, mpirun=mpirun)


class _StopForwarder:
    """Signal handlers that pass a stop on to mpirun once, and remember why."""

    def __init__(self, process: subprocess.Popen):
        self.process = process
        self.reason: str | None = None
        self.previous = {sig: signal.signal(sig, self._handle) for sig in STOP_SIGNALS}

    def _handle(self, signum, _frame) -> None:
        if self.reason is None:
            self.reason = signal.Signals(signum).name
            # Open MPI forwards SIGTERM/USR2 to the ranks; they stop at a step boundary.
            self.process.send_signal(signum)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def run_driver(run_dir: str | Path) -> int:
    """Start the ranks, wait for them, record the outcome. Returns mpirun's exit status."""
    paths = RunPaths(Path(run_dir))
    spec = load_spec(paths.spec)
    environ = dict(os.environ)
    allocation = current_allocation(spec, environ)
    argv = mpirun_argv(launch_plan(spec, paths, allocation, environ))
    record_event(paths, "started", hosts=list(allocation.host_names), ranks=allocation.world_size,
                 argv=argv)
    log.info("starting %d ranks: %s", allocation.world_size, " ".join(argv))
    start = time.monotonic()
    process = subprocess.Popen(argv)
    forwarder = _StopForwarder(process)
    try:
        while True:
            try:
                returncode = process.wait(timeout=GRACE_SECONDS if forwarder.reason else None)
                break
            except subprocess.TimeoutExpired:
                # The ranks had their grace period; a second SIGTERM makes mpirun end them.
                log.warning("ranks still running %d s after %s; terminating", GRACE_SECONDS,
                            forwarder.reason)
                process.terminate()
    finally:
        forwarder.restore()
    elapsed = round(time.monotonic() - start, 1)
    if forwarder.reason:
        record_event(paths, "stop_requested", reason=forwarder.reason, returncode=returncode)
    record_event(paths, "finished", returncode=returncode, seconds=elapsed,
                 status="completed" if returncode == 0 else "failed")
    return returncode


def main(argv: list[str] | None = None) -> int:
    """`python -m hpc_train.slurm.driver RUN_DIR`: the rendered sbatch script's entry point."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hpc_train.slurm.driver RUN_DIR", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(asctime)s driver %(levelname)s %(message)s")
    return run_driver(args[0])


class Driver:
    """The callable submitit pickles into the job; it only carries the run directory."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = str(run_dir)

    def __call__(self) -> int:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s driver %(levelname)s %(message)s")
        returncode = run_driver(self.run_dir)
        if returncode != 0:
            raise LaunchError(f"ranks failed (mpirun exit {returncode}); see {self.run_dir}/logs/")
        return returncode


if __name__ == "__main__":
    raise SystemExit(main())

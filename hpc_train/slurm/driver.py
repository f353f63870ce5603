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
from hpc_train.rundir import RunPaths, read_jsonl, record_event
from hpc_train.runtime.stop import DEADLINE_ENV, STOP_EXIT
from hpc_train.slurm.requeue import Decision, decide, job_end_time, requeue
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


def under_slurm(environ) -> bool:
    return environ.get("SUBMITIT_EXECUTOR") != "local" and "SLURM_JOB_ID" in environ


def stop_deadline(spec: JobSpec, environ, started: float) -> float | None:
    """When the ranks must stop by themselves: the job's end minus the signal's lead time.

    Slurm's own end time where it can be had, else our start plus the limit (an upper bound
    that still saves before the kill, since the job started before the driver did)."""
    if not under_slurm(environ):
        return None
    end = job_end_time(environ["SLURM_JOB_ID"], environ) or started + spec.time_seconds
    return end - spec.slurm.signal_seconds


def launch_plan(spec: JobSpec, paths: RunPaths, allocation: Allocation, environ,
                deadline: float | None = None) -> LaunchPlan:
    mpirun = shutil.which("mpiexec" if spec.launch.mpi == "mpich" else "mpirun")
    if mpirun is None:
        raise LaunchError("mpirun is not on PATH in the job: add your MPI module to slurm.setup")
    env = {
        "MASTER_ADDR": allocation.host_names[0],
        "MASTER_PORT": str(rendezvous_port(environ.get("SLURM_JOB_ID"))),
        **spec.launch.env,
    }
    if deadline is not None:
        env[DEADLINE_ENV] = f"{deadline:.0f}"
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
            # Always USR2 to mpirun: Open MPI passes USR1/USR2 on to the ranks, but treats a
            # SIGTERM as "abort the job" and kills the ranks (and their data workers) before
            # they can save. The ranks stop at a step boundary either way.
            self.process.send_signal(signal.SIGUSR2)

    def restore(self) -> None:
        for sig, handler in self.previous.items():
            signal.signal(sig, handler)


def _failed_runs(paths: RunPaths) -> int:
    return sum(1 for e in read_jsonl(paths.events)
               if e["event"] == "requeued" and e.get("reason", "").startswith("failure"))


def _ranks_stop_reason(paths: RunPaths, since: float) -> str | None:
    stops = [e for e in read_jsonl(paths.events) if e["event"] == "stop_saved" and e["time"] >= since]
    return stops[-1].get("reason") if stops else None


def run_driver(run_dir: str | Path) -> Decision:
    """Start the ranks, wait for them, then finish, fail or requeue the job; returns what it did."""
    paths = RunPaths(Path(run_dir))
    spec = load_spec(paths.spec)
    environ = dict(os.environ)
    started = time.time()
    allocation = current_allocation(spec, environ)
    deadline = stop_deadline(spec, environ, started)
    argv = mpirun_argv(launch_plan(spec, paths, allocation, environ, deadline))
    record_event(paths, "started", hosts=list(allocation.host_names), ranks=allocation.world_size,
                 deadline=deadline, argv=argv)
    log.info("starting %d ranks: %s", allocation.world_size, " ".join(argv))
    process = subprocess.Popen(argv)
    forwarder = _StopForwarder(process)
    try:
        while True:
            try:
                returncode = process.wait(timeout=GRACE_SECONDS if forwarder.reason else None)
                break
            except subprocess.TimeoutExpired:
                # The ranks had their grace period; SIGTERM makes mpirun abort them.
                log.warning("ranks still running %d s after %s; terminating", GRACE_SECONDS,
                            forwarder.reason)
                process.terminate()
    finally:
        forwarder.restore()
    if forwarder.reason:
        record_event(paths, "stop_requested", reason=forwarder.reason, source="driver signal")
    decision = decide(
        returncode, stop_reason=_ranks_stop_reason(paths, started) or forwarder.reason,
        restarts=int(environ.get("SLURM_RESTART_COUNT") or 0), failed_runs=_failed_runs(paths),
        max_requeues=spec.checkpoint.max_requeues,
        retries_on_failure=spec.checkpoint.retries_on_failure, can_requeue=under_slurm(environ),
        driver_signalled=forwarder.reason is not None)
    seconds = round(time.time() - started, 1)
    if decision.action == "requeue":
        done, detail = requeue(environ["SLURM_JOB_ID"])
        record_event(paths, "requeued", reason=decision.reason, by_driver=done, detail=detail,
                     returncode=returncode, seconds=seconds)
    else:
        record_event(paths, "finished", status=decision.action, reason=decision.reason,
                     returncode=returncode, seconds=seconds)
    log.info("ranks exited %d: %s (%s)", returncode, decision.action, decision.reason)
    return decision


def _exit_status(decision: Decision) -> int:
    return {"completed": 0, "requeue": 0, "stopped": STOP_EXIT}.get(decision.action, 1)


def _setup_logging() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s driver %(levelname)s %(message)s")


def main(argv: list[str] | None = None) -> int:
    """`python -m hpc_train.slurm.driver RUN_DIR`: the rendered sbatch script's entry point."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m hpc_train.slurm.driver RUN_DIR", file=sys.stderr)
        return 2
    _setup_logging()
    return _exit_status(run_driver(args[0]))


class Driver:
    """The callable submitit pickles into the job; it only carries the run directory."""

    def __init__(self, run_dir: str | Path):
        self.run_dir = str(run_dir)

    def __call__(self) -> int:
        _setup_logging()
        decision = run_driver(self.run_dir)
        if decision.action in ("failed", "stopped"):
            raise LaunchError(f"{decision.action}: {decision.reason}; see {self.run_dir}/logs/")
        return decision.action


if __name__ == "__main__":
    raise SystemExit(main())

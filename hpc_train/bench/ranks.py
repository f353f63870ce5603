"""A benchmark's ranks, started by the driver's `launch_plan` (its rank program as the worker)
and supervised as a job's (bounded waits, stops passed on, the watchdog on their heartbeats): what
a benchmark measures is launched as a job is. `bench train` runs each launch with `run_ranks`;
`bench gpu` and `bench pipeline` use `run_here`, whose ranks `serve` it."""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from hpc_train.errors import LaunchError
from hpc_train.job.driver import launch_plan, stop_grace
from hpc_train.job.supervise import StopForwarder, Watch, supervise
from hpc_train.job.worker import start_heartbeat
from hpc_train.launch.allocation import Allocation, local_allocation
from hpc_train.launch.argv import launch_argv, launcher_env
from hpc_train.launch.identity import RankInfo, rank_from_env
from hpc_train.rundir import RunPaths, write_atomic
from hpc_train.spec import JobSpec, spec_from_dict

SETTINGS = "settings.json"    # what `run_here` gives its ranks, in the run directory


@dataclasses.dataclass(frozen=True)
class RanksEnded:
    """How a launch's ranks ended: after how long, and why they failed (the watchdog's finding, a
    stop this process was sent and passed on, or the launcher's exit status; None: all exited 0)."""
    seconds: float
    failure: str | None


def run_ranks(spec: JobSpec, paths: RunPaths, allocation: Allocation, worker: str,
              env: Mapping[str, str] | None = None) -> RanksEnded:
    """Start `worker` (a module, given the run directory) on every slot of `allocation` by the
    driver's launch plan for `spec`, `env` added to the ranks' variables; wait for them under
    the driver's supervision."""
    environ = dict(os.environ)
    plan = launch_plan(spec, paths, allocation, environ, worker=worker)
    plan = dataclasses.replace(plan, env={**plan.env, **(env or {})})
    started = time.time()
    # The launcher's own output goes to stderr: stdout carries the benchmark's report (--json).
    process = subprocess.Popen(launch_argv(plan), env=launcher_env(plan, environ), stdout=sys.stderr)
    forwarder = StopForwarder(process)
    watch = Watch(paths, allocation.world_size, spec.launch.stall_seconds,
                  stop_grace(spec.slurm.signal_seconds), started, plan.method,
                  start_seconds=spec.launch.start_seconds)
    try:
        returncode, stall = supervise(process, forwarder, watch)
    finally:
        forwarder.restore()
    failure = None
    if returncode != 0 or forwarder.reason:
        failure = (stall.why if stall else None) or forwarder.reason or f"exit {returncode}"
    return RanksEnded(round(time.time() - started, 1), failure)


def _result(root: Path, rank: int) -> Path:
    return root / f"rank-{rank}.json"


def run_here(name: str, worker: str, settings: dict, ranks: int, spec: dict | None = None) -> list[dict]:
    """`ranks` ranks of `worker` on this host, given `settings`, in a run directory of their own
    for the time they run; their results in rank order. `spec`: keys of the launch's job spec
    (e.g. launch.stall_seconds)."""
    given = spec or {}
    launch = spec_from_dict({**given, "run": {"name": name},
                             "slurm": {**given.get("slurm", {}), "tasks_per_node": ranks}})
    with tempfile.TemporaryDirectory(prefix=f"{name}-") as tmp:
        root = Path(tmp)
        (root / SETTINGS).write_text(json.dumps(settings))
        ended = run_ranks(launch, RunPaths(root), local_allocation(socket.gethostname(), ranks), worker)
        done = [rank for rank in range(ranks) if _result(root, rank).is_file()]
        if ended.failure or len(done) != ranks:
            raise LaunchError(f"{name}: the ranks failed ({ended.failure or 'exit 0'}, {len(done)}/{ranks} "
                              "results); their output is above")
        return [json.loads(_result(root, rank).read_text()) for rank in range(ranks)]


def serve(measure: Callable[[dict, RankInfo, object], dict]) -> None:
    """One rank of `run_here` (`python -m WORKER RUN_DIR`): `measure(settings, identity,
    heartbeat)` with its heartbeat beating, then its result written for the launcher."""
    root = Path(sys.argv[1])
    identity = rank_from_env(os.environ)
    heartbeat = start_heartbeat(RunPaths(root), identity.rank)
    try:
        result = measure(json.loads((root / SETTINGS).read_text()), identity, heartbeat)
    finally:
        heartbeat.close()
    write_atomic(_result(root, identity.rank), json.dumps(result).encode())

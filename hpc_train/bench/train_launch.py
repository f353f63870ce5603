"""`bench train` inside an allocation (or on this host): start each launch's ranks the way the
driver starts a job's, and supervise them the same way.

The command line and the ranks' environment come from the driver's own `launch_plan` (mpirun or
srun, MASTER_ADDR and the rendezvous port, the network setting, Horovod's knobs, launch.env),
with the bench's rank program as the worker; the watchdog (heartbeats, stall_seconds) ends a
launch whose ranks stop progressing. A launch of one rank runs on the allocation's first slot.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

from hpc_train.bench.train_rank import LAUNCH_ENV
from hpc_train.errors import LaunchError
from hpc_train.job.driver import current_allocation, launch_plan, stop_grace
from hpc_train.job.supervise import StopForwarder, Watch, supervise
from hpc_train.launch.allocation import Allocation
from hpc_train.launch.argv import launch_argv, launcher_env
from hpc_train.rundir import RunPaths
from hpc_train.spec import JobSpec

RANK_MODULE = "hpc_train.bench.train_rank"
log = logging.getLogger("hpc_train.bench")


def first_slots(allocation: Allocation, ranks: int) -> Allocation:
    """The allocation itself, or its first slot for a one-rank launch."""
    if ranks == allocation.world_size:
        return allocation
    if ranks != 1:
        raise LaunchError(f"a launch of {ranks} ranks in an allocation of {allocation.world_size}")
    return Allocation(((allocation.host_names[0], 1),))


def run_launch(spec: JobSpec, paths: RunPaths, allocation: Allocation, launch: dict,
               environ: dict) -> dict:
    """Start one launch's ranks, wait for them under the watchdog; how they ended."""
    slots = first_slots(allocation, launch["ranks"])
    plan = launch_plan(spec, paths, slots, environ, worker=RANK_MODULE)
    plan = dataclasses.replace(plan, env={**plan.env, LAUNCH_ENV: str(launch["id"])})
    argv = launch_argv(plan)
    log.info("launch %d (round %d, %d rank(s)): %s", launch["id"], launch["round"], launch["ranks"],
             " ".join(argv))
    started = time.time()
    process = subprocess.Popen(argv, env=launcher_env(plan, environ))
    forwarder = StopForwarder(process)
    watch = Watch(paths, slots.world_size, spec.launch.stall_seconds,
                  stop_grace(spec.slurm.signal_seconds), started, plan.method)
    try:
        returncode, stall = supervise(process, forwarder, watch)
    finally:
        forwarder.restore()
    return {"id": launch["id"], "returncode": returncode, "seconds": round(time.time() - started, 1),
            "stalled": stall.why if stall else None, "signal": forwarder.reason}


def run_all(spec: JobSpec, root: Path, plan: dict) -> list[dict]:
    """Every launch in the plan's order; stops at the first that fails, naming the logs."""
    environ = dict(os.environ)
    allocation = current_allocation(spec, environ)
    paths = RunPaths(root)
    outcomes = []
    for launch in plan["launches"]:
        outcome = run_launch(spec, paths, allocation, launch, environ)
        outcomes.append(outcome)
        if outcome["returncode"] != 0 or outcome["signal"]:
            why = outcome["stalled"] or outcome["signal"] or f"exit {outcome['returncode']}"
            raise LaunchError(f"bench train: launch {launch['id']} ({launch['ranks']} rank(s)) "
                              f"failed ({why}); see {paths.logs}/rank-*.log")
        print(f"bench train: launch {launch['id'] + 1}/{len(plan['launches'])} done in "
              f"{outcome['seconds']:.0f} s", file=sys.stderr, flush=True)
    return outcomes

"""`bench scale`: what launching, stopping, checking, staging and watching cost at 2, 4, 8 nodes.

On the Slurm the environment points at (the 8-node cluster of `env/slurm/start.sh --nodes 8`
with its SLURM_CONF, or a real one), for each node count N, one rank per node, the spec's tiny
model (jobs/smoke.yaml) trained for real. Up to four jobs per N, one after another:
- launch: the run started under mpirun, then the same under srun: submit to first step;
- stops (the mpirun run goes on): USR2 to the batch step (the time limit's signal), then
  `scontrol requeue`: each from the moment it was sent to the first step of the ranks started
  again; and the driver's CPU seconds per second while it watched the ranks of the first start
  (its own `process_time`, recorded in its `requeued` event: exact, and also where the driver
  runs on another host than the benchmark, which reading /proc could not do);
- freeze: data.copy_to staging (the slowest node's copy), then the last rank freezes (fault
  freeze:N-1:STEP) and the watchdog's `ranks_stalled` event must name it: how long after its
  last progress;
- doctor: `python -m hpc_train doctor --nodes N` as a user runs it, wall time.
Every wait is bounded (--timeout); every job is cancelled at the end, by Ctrl-C too.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, fields
from pathlib import Path

from hpc_train import scheduler
from hpc_train.bench import scale_measures as measure
from hpc_train.bench.scale_jobs import Jobs, Run, wait_until
from hpc_train.errors import LaunchError

FREEZE_STEP = 3
# Above the start-up of 8 ranks on 2 shared cores (about 15 s here): a watchdog that fires in
# the start-up names ranks that never froze.
STALL_SECONDS = 30
# One rank per node, every step logged (the first step's time), no loader workers (the cores
# are few), and long enough to be stopped twice; the benchmark cancels it when it is done.
COMMON = ["slurm.tasks_per_node=1", "log.every_steps=1", "data.workers=0", "slurm.time=00:20:00",
          "checkpoint.every_steps=5"]
LONG = ["optim.epochs=50"]


@dataclass
class Row:
    """One node count's measurements (seconds, CPU seconds per second); None: not measured."""
    nodes: int
    launch_mpirun: float | None = None
    launch_srun: float | None = None
    usr2_to_training: float | None = None
    requeue_to_training: float | None = None
    doctor: float | None = None
    staging: float | None = None
    stall_named: float | None = None
    driver_cpu_per_s: float | None = None


def _launch(jobs: Jobs, nodes: int, method: str, extra: list[str], timeout: float) -> tuple[Run, float]:
    run = jobs.submit(f"scale-{nodes}-{method}", [f"slurm.nodes={nodes}", *COMMON,
                                                  f"launch.method={method}", *extra])
    seconds = wait_until(lambda: measure.launch_seconds(run.history(), run.metrics()), timeout,
                         f"first step of {run.paths.root.name} (job {run.job_id})")
    return run, seconds


def _stop_and_train_again(run: Run, stop, what: str, timeout: float) -> float:
    """Send `stop`, then wait for the ranks started again to train: seconds in between."""
    sent = time.time()
    if problem := stop():
        raise LaunchError(f"bench scale: {what} for job {run.job_id}: {problem}")
    return wait_until(lambda: measure.back_to_training_seconds(run.history(), run.metrics(), sent),
                      timeout, f"training again after {what} (job {run.job_id})")


def _requeue(run: Run) -> str | None:
    """`scontrol requeue` of the run's job: None, or why Slurm refused."""
    job = scheduler.show_job(run.job_id)
    who, detail = scheduler.requeue(run.job_id, job.restarts if job else 0)
    return None if who else detail


def measure_stops(run: Run, row: Row, timeout: float) -> None:
    row.usr2_to_training = _stop_and_train_again(
        run, lambda: scheduler.signal_batch(run.job_id, "USR2"), "USR2", timeout)
    row.driver_cpu_per_s = measure.driver_cpu_per_second(run.history())
    row.requeue_to_training = _stop_and_train_again(run, lambda: _requeue(run), "scontrol requeue",
                                                    timeout)


def measure_freeze(jobs: Jobs, nodes: int, place: Path, timeout: float, row: Row) -> None:
    rank = nodes - 1
    run = jobs.submit(f"scale-{nodes}-freeze", [
        f"slurm.nodes={nodes}", *COMMON, *LONG, f"data.copy_to={place}/$SLURMD_NODENAME",
        f"launch.env.HPC_TRAIN_FAULT=freeze:{rank}:{FREEZE_STEP}", f"launch.stall_seconds={STALL_SECONDS}",
        "launch.restarts_in_job=0", "checkpoint.retries_on_failure=0"])
    row.stall_named = wait_until(lambda: measure.naming_seconds(run.history(), run.metrics(), rank),
                                 timeout, f"ranks_stalled event naming rank {rank} (job {run.job_id})")
    row.staging = measure.staging_seconds(run.history())
    jobs.cancel(run)


def measure_doctor(jobs: Jobs, nodes: int, out: Path, timeout: float) -> float:
    """`doctor --nodes N`'s wall time, Python's start included; its job id (from its output)
    joins the ones cancelled at the end."""
    log = out / f"doctor-{nodes}.log"
    argv = [sys.executable, "-m", "hpc_train", "doctor", "--nodes", str(nodes), "--json",
            "--out", str(out / f"doctor-{nodes}"), "--timeout", str(timeout)]
    began = time.monotonic()
    try:
        with open(log, "w") as output:
            done = subprocess.run(argv, stdout=output, stderr=subprocess.STDOUT, timeout=timeout + 60)
    finally:
        jobs.adopt_from(log.read_text(errors="replace") if log.is_file() else "")
    seconds = time.monotonic() - began
    if done.returncode != 0:
        raise LaunchError(f"bench scale: doctor --nodes {nodes} exited {done.returncode}; see {log}")
    return seconds


def measure_nodes(jobs: Jobs, nodes: int, chosen: tuple[str, ...], out: Path, timeout: float) -> Row:
    row = Row(nodes)
    if "launch" in chosen or "stops" in chosen:
        run, row.launch_mpirun = _launch(jobs, nodes, "mpirun", LONG, timeout)
        if "stops" in chosen:
            measure_stops(run, row, timeout)
        jobs.cancel(run)
    if "launch" in chosen:
        run, row.launch_srun = _launch(jobs, nodes, "srun", ["optim.max_steps=3"], timeout)
        jobs.cancel(run)
    if "freeze" in chosen:
        measure_freeze(jobs, nodes, out / "local", timeout, row)
    if "doctor" in chosen:
        row.doctor = measure_doctor(jobs, nodes, out, timeout)
    return row


# -- the report --------------------------------------------------------------------------------

HEADER = ("nodes", "launch mpirun s", "launch srun s", "USR2 -> training s", "requeue -> training s",
          "doctor s", "staging s", "stall named s", "driver CPU s/s")


def table_rows(rows: list[Row]) -> list[list[str]]:
    def cell(value) -> str:
        return "-" if value is None else f"{value:.3f}" if value < 1 else f"{value:.1f}"
    return [[str(r.nodes), *(cell(getattr(r, f.name)) for f in fields(Row)[1:])] for r in rows]


def report(rows: list[Row], load: list[float], spec_file: str) -> dict:
    """load: the 1-minute load average before and after (the cores may be shared)."""
    return {"spec": spec_file, "ranks_per_node": 1, "load_average": load,
            "slurm_conf": os.environ.get("SLURM_CONF"), "rows": [asdict(r) for r in rows]}


def main(args: argparse.Namespace) -> int:
    from hpc_train.inspection.text import print_table

    out = Path(args.out or f"runs/bench-scale-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    rows, load = [], [os.getloadavg()[0]]
    with Jobs(args.spec, out / "runs") as jobs:
        for nodes in args.nodes:
            print(f"bench scale: {nodes} nodes ({out})", file=sys.stderr, flush=True)
            rows.append(measure_nodes(jobs, nodes, args.measure, out, args.timeout))
    document = report(rows, [*load, os.getloadavg()[0]], args.spec)
    (out / "scale.json").write_text(json.dumps(document, indent=2) + "\n")
    if args.json:
        print(json.dumps(document, indent=2))
    else:
        print_table(HEADER, table_rows(rows), title=f"bench scale ({args.spec}, 1 rank per node; "
                    "load average %.2f before, %.2f after)" % tuple(document["load_average"]))
    return 0

"""`bench inspect`: how long `status` and `logs` take on a big synthetic run directory.

The run has RANKS ranks, METRIC_LINES metric lines, a requeue, a rank log line per logged step
on rank 0 (every rank logs its start and end), heartbeats and checkpoints: what a long job
leaves. Timed in-process (the work) and as subprocesses (what a user waits for, Python's
start-up and imports included).
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from hpc_train import events
from hpc_train.rundir import RunPaths, append_jsonl
from hpc_train.runtime.heartbeat import Phase
from hpc_train.spec.schema import DEFAULT_STALL_SECONDS
from hpc_train.train.timing import medians, repeat

_T0 = 1_790_000_000.0


def _stamp(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(t)) + f",{int(t * 1000) % 1000:03d}"


def make_run(root: Path, ranks: int = 8, metric_lines: int = 10_000, every: int = 10) -> RunPaths:
    """A finished run of `metric_lines` logged steps on `ranks` ranks, requeued once halfway."""
    paths = RunPaths(root / "bench-inspect")
    paths.make_dirs()
    total, half = metric_lines * every, metric_lines // 2
    starts = [_T0, _T0 + half + 30]
    job = {"SLURM_JOB_ID": "42"}

    def at(t: float, event: dict, restart: int) -> dict:
        return events.stamped(event, environ={**job, "SLURM_RESTART_COUNT": str(restart)}, now=t)

    history = [
        events.stamped(events.submitted("42", "slurm", "0" * 64), environ={}, now=_T0 - 5),
        at(starts[0], events.started(["node0"], ranks, None, [], DEFAULT_STALL_SECONDS), 0),
        at(starts[0] + 5, events.training_started(total_steps=total, steps_per_epoch=total // 10,
                                                  world_size=ranks), 0),
        at(starts[0] + half + 6, events.requeued("SIGUSR2", events.CAUSE_STOP, "driver",
                                                 "scontrol requeue accepted", 75, half + 6.0), 0),
        at(starts[1], events.started(["node0"], ranks, None, [], DEFAULT_STALL_SECONDS), 1),
        at(starts[1] + 5, events.resumed(half * every, half * every, [], ranks, []), 1),
        at(starts[1] + half + 12, events.finished("completed", "all ranks finished", 0, half + 12.0), 1),
    ]
    paths.events.write_text("".join(json.dumps(e) + "\n" for e in history))
    metrics, rank0 = [], []
    for i in range(metric_lines):
        t = starts[i >= half] + 10 + i % half + (i >= half) * 0.5
        step = (i + 1) * every
        metrics.append(json.dumps({"time": t, "step": step, "epoch": step * 10 // total,
                                   "loss": 2.0 / (1 + i / 500), "lr": 0.1, "images_per_s": 1000.0 + i % 7,
                                   "step_time": 0.1, "data_time": 0.01, "loss_scale": 1.0,
                                   "skipped_steps": 0}) + "\n")
        rank0.append(f"{_stamp(t)} rank 0 hpc_train.trainer INFO step {step}/{total} loss 1.0\n")
    paths.metrics.write_text("".join(metrics))
    for rank in range(ranks):
        lines = [f"{_stamp(s + 1)} rank {rank} hpc_train.worker INFO rank {rank}/{ranks} start\n"
                 for s in starts]
        body = rank0 if rank == 0 else []
        paths.rank_log(rank).write_text(lines[0] + "".join(body[:half]) + lines[1] + "".join(body[half:])
                                        + f"{_stamp(starts[1] + half + 11)} rank {rank} done\n")
        ended = starts[1] + half + 9
        paths.rank_heartbeat(rank).write_text(json.dumps({
            "rank": rank, "host": "node0", "pid": 1000 + rank, "step": total, "phase": Phase.SAVED,
            "progress": ended, "time": ended}))
    for step in (half * every, total):
        directory = paths.checkpoints / f"step-{step:08d}"
        directory.mkdir()
        (directory / "COMPLETE").write_text("")
    append_jsonl(paths.events, {"time": _T0 - 4, "event": "note"})   # a foreign event is ignored
    return paths


def main(args) -> int:
    from hpc_train.inspection import logs
    from hpc_train.inspection.cli import build_status

    with tempfile.TemporaryDirectory() as tmp:
        paths = make_run(Path(tmp), args.ranks, args.metric_lines)
        sink = io.StringIO()
        actions = {
            "status (in-process)": lambda: build_status(paths.root, slurm=False),
            "logs --all-ranks (in-process)": lambda: logs.write(logs.select(paths, None, None), True, sink),
        }
        for name, argv in (("status --no-slurm (subprocess)", ["status", str(paths.root), "--no-slurm"]),
                           ("status --json --no-slurm (subprocess)", ["status", str(paths.root), "--json",
                                                                       "--no-slurm"]),
                           ("logs --all-ranks (subprocess)", ["logs", str(paths.root), "--all-ranks"]),
                           ("logs --run 1 --grep (subprocess)", ["logs", str(paths.root), "--run", "1",
                                                                 "--grep", "step 9"])):
            command = [sys.executable, "-m", "hpc_train", *argv]
            actions[name] = lambda c=command: subprocess.run(c, stdout=subprocess.DEVNULL, check=True)
        figures = medians({name: repeat(action, args.rounds) for name, action in actions.items()})
    result = {"ranks": args.ranks, "metric_lines": args.metric_lines, "rounds": args.rounds,
              "median_seconds": figures}
    if args.json:
        print(json.dumps(result, indent=1))
    else:
        print(f"run: {args.ranks} ranks, {args.metric_lines} metric lines; median of {args.rounds}")
        for name, seconds in figures.items():
            print(f"  {name:<40} {seconds * 1000:8.1f} ms")
    return 0

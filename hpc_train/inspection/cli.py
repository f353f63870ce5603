"""`status`, `logs`, `diagnose`, `plot` and `report` (registered by hpc_train/cli.py; light
imports only)."""

from __future__ import annotations

import argparse
import contextlib
import json
import re
import sys
import time
from pathlib import Path

from hpc_train import scheduler
from hpc_train.argtypes import add_command, positive_int
from hpc_train.errors import InspectError
from hpc_train.rundir import RunPaths

_JOB_ID = re.compile(r"\d+(_\d+)?")
_FAILED = {*scheduler.FAILED_STATES, "CANCELLED"}
QUIET_MINUTES = 10.0   # status --stall-minutes: no heartbeat nor metric this long reads "no progress"


def run_dirs(root: Path) -> list[Path]:
    """Run directories under the run root, newest first (by their events file)."""
    if not root.is_dir():
        raise InspectError(f"--root {root}: no such directory")
    found = [p for p in root.iterdir() if RunPaths(p).events.is_file()]
    return sorted(found, key=lambda p: RunPaths(p).events.stat().st_mtime, reverse=True)


def find_run(target: str, root: Path) -> Path:
    """RUN_DIR, or a Slurm job id looked up in the events under the run root."""
    path = Path(target)
    if path.is_dir():
        paths = RunPaths(path)
        if not paths.spec.is_file() and not paths.events.is_file():
            raise InspectError(f"{path}: not a run directory (no {paths.spec.name}, no {paths.events.name})")
        return path.resolve()
    if _JOB_ID.fullmatch(target) and root.is_dir():
        from hpc_train import events
        from hpc_train.rundir import read_jsonl

        for candidate in run_dirs(root):
            if events.has_job(read_jsonl(RunPaths(candidate).events), target):
                return candidate.resolve()
        raise InspectError(f"job {target}: no run under {root} has it (try --root)")
    raise InspectError(f"{target}: neither a run directory nor a job id")


def build_status(run_dir: Path, slurm: bool = True, baseline: float | None = None,
                 quiet_minutes: float = QUIET_MINUTES):
    """One run's RunStatus, with Slurm's live state and a diagnosis when it failed or stalls."""
    from hpc_train import events as ev
    from hpc_train.inspection import diagnose, logs, signatures, summary

    paths = RunPaths(run_dir)
    run = summary.RunFiles.read(paths)
    submission = ev.last_submission(run.events)
    live = None
    if slurm and submission and submission[1] == "slurm":
        live = scheduler.live_state(submission[0])
    if (live.state if live else ev.state(run.events)) == "RUNNING":
        for lines in logs.tails(paths):
            run.waiting_ranks += signatures.missing_ranks(lines)
    now = time.time()
    status = summary.summarize(run, now, live, baseline, quiet_minutes * 60)
    if live is not None and live.state.active:
        # The job's nodes, and those that died under it earlier (a requeued job runs without
        # them): each named for as long as Slurm shows it lost.
        died = {node for lost in ev.named(run.events, ev.NODE_LOST) for node in lost.get("nodes") or []}
        nodes = sorted(died.union(scheduler.expand_hostlist(live.nodes) if live.nodes else []))
        states = (scheduler.node_states(nodes) if nodes else None) or {}
        status.lost_nodes = {node: state for node, state in states.items() if scheduler.node_lost(state)}
    if status.state in _FAILED or status.state == "STOPPED" or not status.health.ok:
        status.diagnosis = diagnose.diagnose(paths, slurm=live, now=now).to_json()
    return status


def _status(args: argparse.Namespace) -> int:
    from hpc_train.inspection import summary, text

    root = Path(args.root)
    if args.all:
        targets = run_dirs(root)[:args.limit]
    elif args.targets:
        targets = [find_run(t, root) for t in args.targets]
    else:
        raise InspectError("status: give RUN_DIR or JOB_ID, or --all for the runs under --root")
    baseline = summary.baseline_per_rank(args.baseline) if args.baseline else None

    def show() -> None:
        statuses = [build_status(t, args.slurm, baseline, args.stall_minutes) for t in targets]
        if args.json:
            print(json.dumps({"runs": [s.to_json() for s in statuses]}, indent=1))
        elif args.all:
            text.print_runs(statuses)
        else:
            text.print_status(statuses)

    if args.watch is None:
        show()
        return 0
    try:
        while True:
            if sys.stdout.isatty():
                print("\033[2J\033[H", end="")
            show()
            sys.stdout.flush()
            time.sleep(args.watch)
    except KeyboardInterrupt:
        return 0


def _logs(args: argparse.Namespace) -> int:
    from hpc_train.inspection import logs

    paths = RunPaths(find_run(args.run_dir, Path(args.root)))
    ranks = None if args.all_ranks else [args.rank]
    prefix = args.all_ranks
    with contextlib.suppress(KeyboardInterrupt, BrokenPipeError):
        logs.write(logs.select(paths, ranks, args.run, args.grep), prefix)
        if args.follow:
            logs.follow(paths, ranks, args.grep, prefix)
    return 0


def _diagnose(args: argparse.Namespace) -> int:
    from hpc_train import events
    from hpc_train.inspection import diagnose, text

    paths = RunPaths(find_run(args.run_dir, Path(args.root)))
    job_ids = events.job_ids(events.read(paths))
    slurm = scheduler.live_state(job_ids[-1]) if args.slurm and job_ids and args.run is None else None
    result = diagnose.diagnose(paths, args.run, slurm)
    print(json.dumps(result.to_json(), indent=1) if args.json else text.diagnosis_text(result))
    return 0


def _plot(args: argparse.Namespace) -> int:
    from hpc_train.inspection.plot import plot_run

    paths = RunPaths(find_run(args.run_dir, Path(args.root)))
    plot_run(paths, Path(args.output))
    print(f"wrote {args.output}")
    return 0


def _report(args: argparse.Namespace) -> int:
    from hpc_train.inspection.report import build_report
    from hpc_train.inspection.report_text import print_report

    paths = RunPaths(find_run(args.run_dir, Path(args.root)))
    report = build_report(paths, slurm=args.slurm, plot=args.plot)
    if args.json:
        print(json.dumps(report.to_json(), indent=1))
    else:
        print_report(report)
    return 0


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--root", default="runs", metavar="DIR",
                   help="run root where job ids and --all are looked up (default runs/)")


def register(commands: argparse._SubParsersAction) -> None:
    status = add_command(
        commands, "status", _status, help="state, progress, throughput, ETA and health of runs",
        description="Read the run directory (events, metrics, heartbeats, checkpoints) and add "
                    "Slurm's live state (squeue, sacct) where it answers.")
    status.add_argument("targets", nargs="*", metavar="RUN_DIR|JOB_ID")
    status.add_argument("--all", action="store_true", help="the most recent runs under --root")
    status.add_argument("--limit", type=positive_int, default=20, metavar="N", help="runs for --all (20)")
    status.add_argument("--json", action="store_true", help="machine-readable (docs/status-schema.json)")
    status.add_argument("--watch", type=float, nargs="?", const=5.0, metavar="SECONDS",
                        help="refresh every SECONDS (default 5) until Ctrl-C")
    status.add_argument("--baseline", metavar="RUN_DIR",
                        help="a single-rank run of the same job: shows the scaling efficiency")
    status.add_argument("--stall-minutes", type=float, default=QUIET_MINUTES, metavar="M",
                        help=f"no heartbeat or metric for M minutes counts as no progress ({QUIET_MINUTES:g})")
    status.add_argument("--no-slurm", dest="slurm", action="store_false",
                        help="do not ask squeue/sacct; the events alone give the state")
    _common(status)

    logs = add_command(
        commands, "logs", _logs, help="per-rank logs, merged by time, one run (requeue) at a time",
        description="Print rank N's log (default 0) or all ranks merged by time with [rank N] "
                    "prefixes; --run K keeps the K-th run (0 = first start, -1 = last).")
    logs.add_argument("run_dir", metavar="RUN_DIR|JOB_ID")
    which = logs.add_mutually_exclusive_group()
    which.add_argument("--rank", type=int, default=0, metavar="N", help="one rank's log (default 0)")
    which.add_argument("--all-ranks", action="store_true", help="every rank, merged by time")
    logs.add_argument("--run", type=int, metavar="K", help="only the K-th run (0-based; -1 = last)")
    logs.add_argument("--grep", metavar="REGEX", help="only lines matching REGEX")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing new lines (Ctrl-C)")
    _common(logs)

    diag = add_command(
        commands, "diagnose", _diagnose, help="the first failed rank, its traceback, and known failure signatures",
        description="Find the first rank that failed from the rank logs (first traceback by "
                    "time), cross-check with rank_failed events, and match known signatures "
                    "(OOM, NCCL/Gloo, stalls, mpirun, Slurm limits, shards, spec) with fixes.")
    diag.add_argument("run_dir", metavar="RUN_DIR|JOB_ID")
    diag.add_argument("--run", type=int, metavar="K", help="the K-th run (default: the last)")
    diag.add_argument("--json", action="store_true", help="machine-readable output")
    diag.add_argument("--no-slurm", dest="slurm", action="store_false", help="do not ask sacct")
    _common(diag)

    plot = add_command(
        commands, "plot", _plot, help="loss, accuracy, LR and throughput against step, requeues marked (PNG)")
    plot.add_argument("run_dir", metavar="RUN_DIR|JOB_ID")
    plot.add_argument("-o", "--output", required=True, metavar="FILE.png")
    _common(plot)

    report = add_command(
        commands, "report", _report,
        help="efficiency of a run across its requeues: hours used, CPU, memory, GPU, lost time",
        description="Core- and GPU-hours, CPU efficiency and peak memory from sacct (every run "
                    "segment), GPU utilisation from the ranks' NVML samples, images per GPU-hour "
                    "(core-hour on CPU jobs), time lost to requeues and checkpoint saves from the "
                    "run directory; writes RUN_DIR/timeline.png. What cannot be known (no "
                    "accounting, nothing sampled) is listed, not an error.")
    report.add_argument("run_dir", metavar="RUN_DIR|JOB_ID")
    report.add_argument("--json", action="store_true", help="machine-readable output")
    report.add_argument("--no-slurm", dest="slurm", action="store_false",
                        help="do not ask sacct; the run directory alone (estimates)")
    report.add_argument("--no-plot", dest="plot", action="store_false",
                        help="do not write RUN_DIR/timeline.png")
    _common(report)

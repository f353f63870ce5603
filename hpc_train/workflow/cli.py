"""`python -m hpc_train workflow validate|run|status|resume|cancel|best` (light imports only)."""

from __future__ import annotations

import argparse
import json
import sys

from hpc_train.argtypes import add_command, print_warnings


def _jobs(done, name: str) -> str:
    """A stage's jobs as submitted to Slurm (`part id, ...`), or how it ended here (local)."""
    if done.submitted:
        return ", ".join(f"{part} {job}" for part, job in done.submitted[name].jobs.items())
    return done.states.get(name, "-")


def _validate(args: argparse.Namespace) -> int:
    from hpc_train.workflow.run import check, job_summary

    plan = check(args.file, args.overrides, ask_slurm=_ask_slurm(args))
    print_warnings(plan.warnings)
    print(f"{args.file}: OK ({len(plan.order)} stages)")
    for name in plan.order:
        print(f"  {name:<16} {plan.stages[name].kind:<9} {'; '.join(job_summary(plan, name))}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from hpc_train import scheduler
    from hpc_train.workflow.run import check, dry_run_text, run

    if args.dry_run:
        plan = check(args.file, args.overrides, args.root, ask_slurm=_ask_slurm(args))
        print_warnings(plan.warnings)
        print(dry_run_text(plan))
        print("# dry run: nothing was submitted and no directory was created", file=sys.stderr)
        return 0
    if args.local:
        print("note: --local: running the stages here, one after another", file=sys.stderr)
    elif not scheduler.installed():
        print("note: sbatch is not on PATH: running the stages here, one after another "
              "(the local executor)", file=sys.stderr)
    started = run(args.file, args.overrides, args.root, use_slurm=False if args.local else None,
                  ask_slurm=_ask_slurm(args))
    print_warnings(started.plan.warnings)
    print(f"workflow dir: {started.paths.root}")
    for name in started.plan.order:
        print(f"  {name:<16} {started.plan.stages[name].kind:<9} {_jobs(started, name)}")
    print(f"status: python -m hpc_train workflow status {started.paths.root}")
    failed = [n for n, s in started.states.items() if s != "COMPLETED"]
    return 1 if failed else 0


def _status(args: argparse.Namespace) -> int:
    from hpc_train.workflow.text import print_status
    from hpc_train.workflow.status import collect

    status = collect(args.dir, slurm=args.slurm)
    if args.json:
        print(json.dumps(status.to_json(), indent=1))
    else:
        print_status(status)
    return 0


def _resume(args: argparse.Namespace) -> int:
    from hpc_train.workflow.resume import resume

    done = resume(args.dir, args.overrides, args.allow_spec_change)
    print(f"workflow dir: {done.paths.root}")
    print(f"  complete, skipped:   {', '.join(done.complete) or '-'}")
    print(f"  still queued/running: {', '.join(f'{n} ({j})' for n, j in done.active.items()) or '-'}")
    if not done.again:
        print("  nothing to submit")
        return 0
    for name in done.again:
        print(f"  again: {name:<14} {_jobs(done, name)}")
    return 1 if any(s != "COMPLETED" for s in done.states.values()) else 0


def _cancel(args: argparse.Namespace) -> int:
    from hpc_train.workflow.resume import cancel

    cancelled = cancel(args.dir)
    print(f"cancelled: {' '.join(cancelled)}" if cancelled else "no job of the workflow is queued or running")
    return 0


def _best(args: argparse.Namespace) -> int:
    from hpc_train.workflow.best import choose

    choice = choose(args.dir, args.stage, record=args.record)
    if args.json:
        print(json.dumps(choice.__dict__, indent=1))
    else:
        print(choice.run_dir)
        print(f"member {choice.index}: {choice.metric} {choice.value:.4f} ({choice.mode})",
              file=sys.stderr)
    return 0


def _overrides(p: argparse.ArgumentParser) -> None:
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="STAGE.KEY=VALUE",
                   help="override a stage's key; for a train stage also a job spec key, e.g. "
                   "train.optim.epochs=1 (value read as YAML; repeatable)")
    p.add_argument("--no-slurm", action="store_true",
                   help="do not ask sinfo whether each train stage's nodes and per-node resources "
                   "fit its partition (a file for another cluster)")


def _ask_slurm(args: argparse.Namespace) -> bool | None:
    """None: ask where sbatch is (workflow/run.py: check)."""
    return False if args.no_slurm or getattr(args, "local", False) else None


def register(commands: argparse._SubParsersAction) -> None:
    workflow = commands.add_parser(
        "workflow", help="multi-stage pipelines and sweeps on Slurm (shard -> train -> evaluate -> export)",
        description="Workflows (workflows/*.yaml): stages submitted at once, chained by Slurm's own "
                    "dependencies, in a workflow directory runs/<name>-<stamp>/.")
    sub = workflow.add_subparsers(dest="workflow_command", metavar="WORKFLOW_COMMAND", required=True)

    validate = add_command(sub, "validate", _validate, help="check a workflow file without submitting",
                           description="Check FILE (stages, graph, references, each train "
                           "stage's job spec); exit 2 listing every problem.")
    validate.add_argument("file", metavar="FILE")
    _overrides(validate)

    run = add_command(sub, "run", _run, help="check, then submit every stage at once and return",
                      description="Check FILE, make the workflow directory, submit every stage "
                      "with Slurm dependencies and return. Without sbatch (or with --local) "
                      "the stages run here one after another.")
    run.add_argument("file", metavar="FILE", help="e.g. workflows/smoke.yaml")
    _overrides(run)
    run.add_argument("--dry-run", action="store_true",
                     help="print the stage graph and every sbatch script; create nothing")
    run.add_argument("--local", action="store_true", help="run the stages here, without Slurm")
    run.add_argument("--root", metavar="DIR", help="where the workflow directory goes (default: "
                     "the file's root, runs/)")

    status = add_command(sub, "status", _status, help="stages and sweep members: state, jobs, metric, why",
                         description="One table of the workflow's stages (and sweep members, "
                         "ranked): state from squeue/sacct, job ids, elapsed, key metric, what "
                         "a pending job waits for, which stage failed and the rank's error.")
    status.add_argument("dir", metavar="DIR")
    status.add_argument("--json", action="store_true", help="machine-readable output")
    status.add_argument("--no-slurm", dest="slurm", action="store_false",
                        help="do not ask squeue/sacct; the workflow's files alone give the state")

    resume = add_command(sub, "resume", _resume, help="submit again what failed or was cancelled, and all after it",
                         description="Skip stages whose outputs are complete and verified, leave "
                         "queued or running ones alone, submit the rest again (train runs continue "
                         "from their checkpoints). Running it twice submits nothing new.")
    resume.add_argument("dir", metavar="DIR")
    _overrides(resume)
    resume.add_argument("--allow-spec-change", action="store_true",
                        help="accept --set changes to a train run's spec (its checkpoints were made "
                        "under the old one)")

    cancel = add_command(sub, "cancel", _cancel, help="scancel every job of the workflow still queued or running")
    cancel.add_argument("dir", metavar="DIR")

    best = add_command(sub, "best", _best, help="the best member of a sweep by its metric (prints its run dir)")
    best.add_argument("dir", metavar="DIR")
    best.add_argument("stage", metavar="STAGE")
    best.add_argument("--record", action="store_true", help="record the choice in the workflow's events")
    best.add_argument("--json", action="store_true", help="machine-readable output")

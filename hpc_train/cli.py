"""Command line: `python -m hpc_train COMMAND ...`.

Each command imports what it needs inside its handler, so `--help` and the login-node commands
start without torch. Known errors (HpcTrainError) become one line on stderr and their exit code.
"""

from __future__ import annotations

import argparse
import sys

from hpc_train import __version__
from hpc_train.argtypes import add_command, positive_float, positive_int
from hpc_train.errors import HpcTrainError


def _doctor(args: argparse.Namespace) -> int:
    if args.allocation or args.nodes:
        return _doctor_across_nodes(args)
    if args.launcher or args.partition or args.time or args.out or args.timeout:
        raise HpcTrainError("doctor: --launcher, --partition, --time, --out and --timeout go with "
                            "--allocation or --nodes N")
    from hpc_train.doctor.report import main

    return main(json_output=args.json)


def _doctor_across_nodes(args: argparse.Namespace) -> int:
    """doctor --allocation (inside a job) or --nodes N (submits one): the nodes must agree."""
    import os
    from pathlib import Path

    from hpc_train.doctor.table import show

    method = args.launcher or "mpirun"
    out = Path(args.out) if args.out else None
    if args.allocation:
        if args.partition or args.time:
            raise HpcTrainError("doctor --allocation: --partition and --time are for --nodes N")
        from hpc_train.doctor.allocation import DEFAULT_TIMEOUT, check_allocation

        report = check_allocation(method, out, args.timeout or DEFAULT_TIMEOUT, os.environ)
    else:
        from hpc_train.doctor.nodes import DEFAULT_TIME, DEFAULT_WAIT, check_nodes

        report = check_nodes(args.nodes, method, args.partition, args.time or DEFAULT_TIME,
                             args.timeout or DEFAULT_WAIT, out)
    return show(report, args.json)


def _validate(args: argparse.Namespace) -> int:
    from hpc_train.spec import describe_spec

    spec = _load_checked(args)
    print(f"{args.file}: OK")
    print(describe_spec(spec))
    if _ask_slurm(args) and (said := _preemption_note(spec)):
        print(f"preemption: {said}")
    if args.import_code:
        from pathlib import Path

        from hpc_train.job.code_probe import probe

        built, said = probe(args.file, args.overrides, Path.cwd())
        print(said if built else f"error: importing your code failed:\n{said}",
              file=sys.stdout if built else sys.stderr)
        return 0 if built else 2
    return 0


def _preemption_note(spec) -> str | None:
    """What a preemption would do to this job where Slurm answers, beside the longest save of
    the latest run of the same name (under run.root), if there is one."""
    from pathlib import Path

    from hpc_train import events, scheduler
    from hpc_train.rundir import RunPaths
    from hpc_train.scheduler.policy import for_partition, preemption_words

    if not scheduler.installed() or scheduler.controller_problem(timeout=10):
        return None           # what could not be asked, the capacity check's notes said already
    policies, problem = scheduler.preemption(timeout=10)
    policy = None if problem else for_partition(policies, spec.slurm.partition)
    if policy is None:
        return None
    runs = sorted(Path(spec.run.root).glob(f"{spec.run.name}-*/events.jsonl"))
    save = events.longest_save(events.read(RunPaths(runs[-1].parent))) if runs else None
    return preemption_words(policy, save)


def _load_checked(args: argparse.Namespace, notes: bool = True):
    """The spec of FILE with --set applied, checked as the API checks it (api/specs.py)."""
    from hpc_train.api.specs import checked_spec

    return checked_spec(args.file, args.overrides, _ask_slurm(args), notes)


def _load_for_submission(args: argparse.Namespace):
    """The checked spec with absolute paths (api/specs.py: submission_spec)."""
    from hpc_train.api.specs import submission_spec

    return submission_spec(args.file, args.overrides, _ask_slurm(args))


def _ask_slurm(args: argparse.Namespace) -> bool:
    return not (args.no_slurm or getattr(args, "local", False))


def _submit(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hpc_train import api
    from hpc_train.slurm import submit

    if args.dry_run:
        spec = _load_for_submission(args)
        run_dir = Path(spec.run.root).resolve() / f"{spec.run.name}-<timestamp>"
        print(submit.planned_script(spec, run_dir, snapshot=args.snapshot))
        print("# dry run: nothing was submitted and no run directory was created", file=sys.stderr)
        return 0
    run = api.submit(args.file, args.overrides, local=args.local, snapshot=args.snapshot,
                     ask_slurm=_ask_slurm(args))
    if run.executor == "local":
        reason = "--local" if args.local else "sbatch is not on PATH"
        print(f"note: {reason}: running the job on this machine with submitit's local executor",
              file=sys.stderr)
    print(f"job id:  {run.job_id}")
    print(f"run dir: {run.path}")
    print(following(run.spec(), run.path))
    return 0


def following(spec, run_dir) -> str:
    """How to follow a submitted job: the commands a user runs next, quoted for the shell."""
    from shlex import quote

    run = quote(str(run_dir))
    lines = ["follow it:", f"  python -m hpc_train status {run}         # state, progress, ETA, health",
             f"  python -m hpc_train logs {run} -f --all-ranks   # the ranks' logs as they come",
             f"  python -m hpc_train diagnose {run}       # when it fails: the first failed rank"]
    lines += tracker_lines(spec, run_dir)
    return "\n".join(lines)


def tracker_lines(spec, run_dir) -> list[str]:
    """The commands to see the run's trackers (TensorBoard, W&B's sync, MLflow's UI)."""
    from pathlib import Path

    from hpc_train.inspection.trackers import follow_lines, tracker_views
    from hpc_train.rundir import RunPaths
    from hpc_train.spec import spec_to_dict

    return follow_lines(tracker_views(spec_to_dict(spec)["log"], RunPaths(Path(str(run_dir))), {}))


def _resume(args: argparse.Namespace) -> int:
    from hpc_train import api

    run = api.resume(args.run_dir, args.overrides, args.allow_spec_change, local=args.local,
                     code=args.code)
    print(f"job id:  {run.job_id}")
    print(f"run dir: {run.path} (continues from its latest complete checkpoint)")
    return 0


def _render(args: argparse.Namespace) -> int:
    from pathlib import Path

    from hpc_train.rundir import RunPaths
    from hpc_train.slurm.standalone import load_template, render_script
    from hpc_train.slurm.run_code import CODE_NEW, CODE_NONE, attach_code, take_snapshot
    from hpc_train.spec import dump_spec_yaml

    spec = _load_for_submission(args)
    # Checked before the run directory exists: a bad template leaves nothing behind.
    template = load_template(args.template)
    mode = CODE_NEW if args.snapshot else CODE_NONE
    taken = take_snapshot(spec, None, mode)
    # The script needs a run directory holding the resolved spec, like a submitted job.
    paths = RunPaths.new(spec.run.root, spec.run.name)
    paths.spec.write_text(dump_spec_yaml(spec))
    code = attach_code(paths, mode, taken, "render")
    text = render_script(spec, paths, sys.executable, template, code)
    paths.sbatch.write_text(text)
    output = Path(args.output)
    output.write_text(text)
    output.chmod(0o755)
    print(f"wrote {output} (run dir {paths.root}); submit it with: sbatch {output}")
    return 0


def _add_no_snapshot(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--no-snapshot", dest="snapshot", action="store_false",
                        help="do not copy the package's source for the job: it imports the installed "
                        "hpc_train at every start (by default it imports a copy taken now, kept "
                        "under RUN_ROOT/.code/ and linked as RUN_DIR/code)")


def _add_spec_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("file", metavar="FILE", help="job spec YAML, e.g. jobs/smoke.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[],
                        metavar="KEY=VALUE", help="override a key, e.g. optim.base_lr=0.2 "
                        "(value read as YAML; repeatable; wins over the file)")
    parser.add_argument("--no-slurm", action="store_true",
                        help="do not ask sinfo whether the nodes and per-node resources fit the partition")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_train",
        description="Submit, run and inspect distributed training jobs on Slurm.")
    parser.add_argument("--version", action="version", version=f"hpc_train {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    doctor = add_command(
        commands, "doctor", _doctor, help="check packages, Horovod, mpirun, Slurm, GPUs and networking",
        description="Run every environment check on this machine; exit 0 only when none FAILs. "
                    "--allocation (inside salloc/sbatch) or --nodes N (from a login node) instead "
                    "start one probe per node and check that the nodes agree: same versions and "
                    "Horovod build, MASTER_ADDR reachable, a correct allreduce across them.")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    across = doctor.add_mutually_exclusive_group()
    across.add_argument("--allocation", action="store_true",
                        help="probe every node of the Slurm allocation this runs in")
    across.add_argument("--nodes", type=positive_int, metavar="N",
                        help="submit one small job over N nodes that runs --allocation; wait, report")
    doctor.add_argument("--launcher", choices=("mpirun", "srun"),
                        help="how the probes start, as launch.method (default mpirun)")
    doctor.add_argument("--partition", metavar="P", help="--nodes: the partition to submit to")
    doctor.add_argument("--time", metavar="LIMIT", help="--nodes: the job's time limit (default 5 minutes)")
    doctor.add_argument("--out", metavar="DIR", help="where the probes' reports go; on a filesystem "
                        "every node sees (default runs/doctor-...)")
    doctor.add_argument("--timeout", type=positive_float, metavar="SECONDS",
                        help="--allocation: for the probes to finish (default 180); "
                        "--nodes: for the job, queue wait included (default 600)")

    validate = add_command(
        commands, "validate", _validate, help="check a job spec (types, ranges, cross-field rules) without submitting",
        description="Load FILE strictly, apply --set overrides, print warnings and a summary; "
                    "exit 2 listing every problem.")
    _add_spec_arguments(validate)
    validate.add_argument("--import", dest="import_code", action="store_true",
                          help="also import your code the spec names (in a subprocess): build "
                          "the model on the meta device (its parameter count), the dataset's "
                          "splits (their lengths)")

    submit = add_command(
        commands, "submit", _submit, help="validate a job spec and submit it to Slurm (submitit)",
        description="Validate FILE, create a run directory and submit the job; prints the job id "
                    "and the run directory. Without sbatch on PATH the job runs here through "
                    "submitit's local executor.")
    _add_spec_arguments(submit)
    submit.add_argument("--dry-run", action="store_true",
                        help="print the sbatch script; submit nothing, create nothing")
    submit.add_argument("--local", action="store_true",
                        help="run on this machine with submitit's local executor")
    _add_no_snapshot(submit)

    resume = add_command(
        commands, "resume", _resume, help="submit a run again; it continues from its latest complete checkpoint",
        description="Submit RUN_DIR again with its saved spec. --set changes need "
                    "--allow-spec-change (the checkpoints were made under the old spec).")
    resume.add_argument("run_dir", metavar="RUN_DIR")
    resume.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    resume.add_argument("--allow-spec-change", action="store_true",
                        help="accept a spec that differs from the one the checkpoints were made with")
    resume.add_argument("--local", action="store_true", help="run here with submitit's local executor")
    code = resume.add_mutually_exclusive_group()
    code.add_argument("--new-snapshot", dest="code", action="store_const", const="new", default="keep",
                      help="import a copy of the current source from now on (default: the code the "
                      "run was submitted with, RUN_DIR/code, or the installed package if it has none)")
    code.add_argument("--no-snapshot", dest="code", action="store_const", const="none",
                      help="import the installed hpc_train from now on (RUN_DIR/code is removed)")

    render = add_command(
        commands, "render", _render, help="write a standalone sbatch script for plain `sbatch`",
        description="Validate FILE, create its run directory and write an sbatch script that "
                    "needs only sbatch and this package.")
    _add_spec_arguments(render)
    render.add_argument("-o", "--output", required=True, metavar="FILE", help="script to write")
    render.add_argument("--template", metavar="FILE",
                        help="your site's sbatch template with the placeholders {sbatch_directives}, "
                        "{setup}, {driver_command} (required), {run_dir} and {job_name}")
    _add_no_snapshot(render)

    # Command groups that live beside their code; these modules import nothing heavy.
    from hpc_train.bench.cli import register as register_bench
    from hpc_train.data.cli import register as register_data
    from hpc_train.evaluate.cli import register as register_evaluate
    from hpc_train.export.cli import register as register_export
    from hpc_train.inspection.cli import register as register_inspect
    from hpc_train.workflow.cli import register as register_workflow

    register_data(commands)
    register_bench(commands)
    register_inspect(commands)
    register_workflow(commands)
    register_evaluate(commands)
    register_export(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except HpcTrainError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return 130

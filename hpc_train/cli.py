"""Command line: `python -m hpc_train COMMAND ...`.

Each command imports what it needs inside its handler, so `--help` and the login-node commands
start without torch. Known errors (HpcTrainError) become one line on stderr and their exit code.
"""

from __future__ import annotations

import argparse
import sys

from hpc_train import __version__
from hpc_train.errors import HpcTrainError


def _doctor(args: argparse.Namespace) -> int:
    from hpc_train.doctor.report import main

    return main(json_output=args.json)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hpc_train",
        description="Submit, run and inspect distributed training jobs on Slurm.")
    parser.add_argument("--version", action="version", version=f"hpc_train {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    doctor = commands.add_parser(
        "doctor", help="check packages, Horovod, mpirun, Slurm, GPUs and networking",
        description="Run every environment check; exit 0 only when none FAILs.")
    doctor.add_argument("--json", action="store_true", help="machine-readable output")
    doctor.set_defaults(handler=_doctor)
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

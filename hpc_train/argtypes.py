"""What the command groups share (no heavy imports): argparse value types, `add_command`, and
how a command prints its result (`print_result`) and its warnings (`print_warnings`)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable


def add_command(commands: argparse._SubParsersAction, name: str,
                handler: Callable[[argparse.Namespace], int], **options) -> argparse.ArgumentParser:
    """The parser of command `name` (`options`: add_parser's help, description); the CLI runs
    `handler(args)` when it is chosen."""
    parser = commands.add_parser(name, **options)
    parser.set_defaults(handler=handler)
    return parser


def print_result(as_json: bool, document: str, table: Callable[[], None], text: Callable[[], str]) -> None:
    """A result for machines (`document`, JSON text: --json), or for people: a rich `table()`
    on a terminal, `text()` in a pipe or a job's output file."""
    if as_json:
        print(document)
    elif sys.stdout.isatty():
        table()
    else:
        print(text())


def print_warnings(warnings) -> None:
    """A command's warnings (spec.Problems that do not stop it), one line each on stderr."""
    for warning in warnings:
        print(f"warning: {warning}", file=sys.stderr)


def positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be a positive integer")
    return value


def positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text}: must be a positive number")
    return value

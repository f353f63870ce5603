"""References between stages, `{stage.output}`, in a workflow's string values (pure).

Most are known when the workflow is submitted (`{train.run_dir}`: run directories are chosen
then) and are replaced by their text. One is not: `{sweep.best.run_dir}`, the best member of a
sweep, exists only once the sweep has run. A value holding it stays a list of parts, and the
stage's batch script resolves it when the job starts (`workflow best`), see script.py.

A reference is `{name.output}` with identifier-like names; a `$` before the brace (`${VAR}`) and
anything else in braces (`{a,b}`, `{ cmd; }`) is the shell's own and left as written.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Union

REFERENCE = re.compile(r"(?<!\$)\{([A-Za-z_][A-Za-z0-9_]*)\.([A-Za-z_][A-Za-z0-9_]*"
                       r"(?:\.[A-Za-z_][A-Za-z0-9_]*)*)\}")
BEST = "best.run_dir"            # the one output known only when a dependent stage starts


@dataclass(frozen=True)
class Ref:
    stage: str
    output: str

    def __str__(self) -> str:
        return "{" + f"{self.stage}.{self.output}" + "}"


@dataclass(frozen=True)
class Best:
    """The run directory of the best member of sweep `stage`: resolved when the job starts."""
    stage: str

    def __str__(self) -> str:
        return "{" + f"{self.stage}.{BEST}" + "}"


@dataclass(frozen=True)
class Env:
    """A variable the batch shell sets (SLURM_ARRAY_TASK_ID), in a generated command line."""
    name: str

    def __str__(self) -> str:
        return "${" + self.name + "}"


Part = Union[str, Best, Env]
Value = tuple[Part, ...]          # a string with some parts known only at run time


def references(text: str) -> list[Ref]:
    return [Ref(*m.groups()) for m in REFERENCE.finditer(text)]


def substitute(text: str, known: dict[Ref, Value]) -> Value:
    """`text` with each reference replaced by its value (every reference must be in `known`)."""
    parts: list[Part] = []
    position = 0
    for match in REFERENCE.finditer(text):
        parts.append(text[position:match.start()])
        parts.extend(known[Ref(*match.groups())])
        position = match.end()
    parts.append(text[position:])
    return join(parts)


def join(parts) -> Value:
    """Adjacent strings merged, empty ones dropped: a canonical Value."""
    out: list[Part] = []
    for part in parts:
        if isinstance(part, str):
            if not part:
                continue
            if out and isinstance(out[-1], str):
                out[-1] += part
                continue
        out.append(part)
    return tuple(out)


def literal(text: str) -> Value:
    return join([text])


def is_known(value: Value) -> bool:
    return all(isinstance(part, str) for part in value)


def text(value: Value) -> str:
    """The value as written in the resolved workflow: run-time parts as their reference."""
    return "".join(str(part) for part in value)


def known_text(value: Value) -> str:
    if not is_known(value):
        raise ValueError(f"{text(value)} is only known when the stage runs")
    return "".join(value)  # type: ignore[arg-type]


def runtime_stages(value: Value) -> list[str]:
    return [part.stage for part in value if isinstance(part, Best)]

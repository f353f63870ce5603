"""Command-line overrides, `--set a.b=value`, applied to the raw file data before validation.

The value is read as YAML, like the file (`optim.base_lr=0.2` is a number, `slurm.setup=[]` a
list, `data.path=` is null), so an override is checked exactly as if it were in the file.
Precedence, in one place: command line > file > schema defaults.
"""

from __future__ import annotations

import copy
from typing import Iterable

import yaml

from hpc_train.spec.problems import Problem, show
from hpc_train.spec.values import DOTTED_KEY
from hpc_train.spec.yaml_io import parse_yaml, yaml_error_line

FROM_SET = " (from --set)"


def apply_overrides(data: dict, overrides: Iterable[str]) -> tuple[dict, set[str], list[Problem]]:
    """(new data, dotted keys that were set, problems); `data` itself is not changed."""
    merged = copy.deepcopy(data)
    keys: set[str] = set()
    problems: list[Problem] = []
    for item in overrides:
        key, sep, text = item.partition("=")
        key = key.strip()
        if not sep or not DOTTED_KEY.fullmatch(key):
            problems.append(Problem(f"--set {item!r}", None,
                                    "expected SECTION.KEY=VALUE with a dotted key",
                                    "write e.g. --set optim.base_lr=0.2"))
            continue
        try:
            value = parse_yaml(text)
        except yaml.YAMLError as exc:
            problems.append(Problem(key + FROM_SET, show(text),
                                    f"the value is not YAML ({yaml_error_line(exc)})",
                                    f"quote the value, e.g. --set '{key}=\"...\"'"))
            continue
        problem = _set_path(merged, key.split("."), value)
        if problem:
            problems.append(problem)
        else:
            keys.add(key)
    return merged, keys, problems


def _set_path(data: dict, parts: list[str], value: object) -> Problem | None:
    node = data
    for depth, part in enumerate(parts[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        if not isinstance(child, dict):
            inside = ".".join(parts[:depth + 1])
            return Problem(".".join(parts) + FROM_SET, None,
                           f"{inside} is {show(child)}, not a mapping, so nothing can be set "
                           "inside it", f"set {inside} itself, or fix it in the file")
        node = child
    node[parts[-1]] = value
    return None


def under(key: str, keys) -> bool:
    """Whether `key` is one of `keys` or inside one (`a.b` and `a[0]` are inside `a`)."""
    return any(key == k or key.startswith((k + ".", k + "[")) for k in keys)


def mark_overridden(problems: list[Problem], keys: set[str]) -> list[Problem]:
    """Label problems whose key came from --set, so the user looks at the command, not the file."""
    return [Problem(p.key + FROM_SET, p.given, p.rule, p.fix, p.severity)
            if under(p.key, keys) else p for p in problems]

"""Old key names that still work, with a warning that names the new key.

`data.num_classes` used to be the gpt vocabulary size too; token data (text, tokens) now has
`data.vocab_size`. The old key is moved to the new one before the schema is walked, so the
resolved spec, its dump and its hash hold the new key only, and a problem with the moved value
names both keys: the user looks for the one in the file.
"""

from __future__ import annotations

import dataclasses

from hpc_train.spec.problems import Problem, show
from hpc_train.spec.schema import TOKEN_KINDS


def move_deprecated_keys(data: dict) -> tuple[dict, dict[str, str], list[Problem]]:
    """(data with old keys moved, {new key: old key} for each move, warnings); `data` itself is
    not changed. With both keys given, nothing moves: num_classes is then the image setting,
    unused by token data (as a dumped resolved spec has it)."""
    section = data.get("data")
    if not (isinstance(section, dict) and section.get("kind") in TOKEN_KINDS
            and "num_classes" in section and "vocab_size" not in section):
        return data, {}, []
    moved = dict(section)
    moved["vocab_size"] = moved.pop("num_classes")
    warning = Problem("data.num_classes", f"{show(moved['vocab_size'])} with data.kind "
                      f"{section['kind']!r}", "deprecated for token data, whose vocabulary "
                      "size is data.vocab_size (read as that for now)",
                      "rename it to data.vocab_size", severity="warning")
    return {**data, "data": moved}, {"data.vocab_size": "data.num_classes"}, [warning]


def name_written_keys(problems: list[Problem], moved: dict[str, str]) -> list[Problem]:
    """Problems of a moved value also name the key that was written."""
    return [dataclasses.replace(p, key=f"{p.key} (written as {moved[p.key]})")
            if p.key in moved else p for p in problems]

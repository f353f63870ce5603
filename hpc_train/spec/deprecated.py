"""Old key names that still work, with a warning that names the new key.

`data.num_classes` used to be the gpt vocabulary size too; token data (text, tokens) now has
`data.vocab_size`. The old key is moved to the new one before the schema is walked, so the
resolved spec, its dump and its hash hold the new key only, and a problem with the moved value
names both keys: the user looks for the one in the file. `data.stage_to` is now `data.copy_to`
("stage" is a pipeline's or a workflow's word). A workflow stage's `slurm.cpus` and
`slurm.gpus` are moved the same way (`rename_key`, from workflow/load.py) to the job spec's names.
"""

from __future__ import annotations

import dataclasses

from hpc_train.spec.problems import Problem, show
from hpc_train.spec.schema import TOKEN_KINDS


def rename_key(section: dict, old: str, new: str, prefix: str, rule: str,
               context: str = "") -> tuple[dict, dict[str, str], list[Problem]]:
    """(section with `old` moved to `new` when only `old` is given, {new key: old key}, its
    warning), `section` unchanged. prefix: the section's path ("data."); context: after the value."""
    if old not in section or new in section:
        return section, {}, []
    moved = {**{k: v for k, v in section.items() if k != old}, new: section[old]}
    warning = Problem(prefix + old, show(section[old]) + context, rule, f"rename it to {prefix + new}",
                      severity="warning")
    return moved, {prefix + new: prefix + old}, [warning]


def move_deprecated_keys(data: dict) -> tuple[dict, dict[str, str], list[Problem]]:
    """(data with old keys moved, {new key: old key} for each move, warnings); `data` itself is
    not changed. With both keys given, nothing moves: num_classes is then the image setting,
    unused by token data (as a dumped resolved spec has it)."""
    section = data.get("data")
    if not isinstance(section, dict):
        return data, {}, []
    moved, renamed, warnings = rename_key(section, "stage_to", "copy_to", "data.",
                                          "renamed (read as data.copy_to for now)")
    if section.get("kind") in TOKEN_KINDS:
        moved, more, also = rename_key(
            moved, "num_classes", "vocab_size", "data.", "deprecated for token data, whose "
            "vocabulary size is data.vocab_size (read as that for now)",
            f" with data.kind {section['kind']!r}")
        renamed, warnings = {**renamed, **more}, warnings + also
    return {**data, "data": moved}, renamed, warnings


def name_written_keys(problems: list[Problem], moved: dict[str, str]) -> list[Problem]:
    """Problems of a moved value also name the key that was written."""
    return [dataclasses.replace(p, key=f"{p.key} (written as {moved[p.key]})")
            if p.key in moved else p for p in problems]

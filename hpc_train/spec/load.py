"""YAML file (+ --set overrides) -> JobSpec, strictly: every problem found, all reported at once.

Order: read the file -> apply overrides -> move deprecated keys (deprecated.py) -> read a node
range `slurm.nodes: MIN-MAX` as its two numbers (node_range.py) -> walk the
schema dataclasses (unknown keys, types, ranges, single-value rules; model.options against the
model's entry in the catalog) -> cross-field rules (rules.py). Field problems stop before the
cross-field rules, which need a complete spec.
"""

from __future__ import annotations

import dataclasses
from functools import lru_cache
from pathlib import Path
from typing import Any, Iterable, get_type_hints

from hpc_train.spec.coerce import INVALID, coerce
from hpc_train.spec.deprecated import move_deprecated_keys, name_written_keys
from hpc_train.spec.node_range import split_node_range
from hpc_train.spec.overrides import apply_overrides, mark_overridden
from hpc_train.spec.problems import Problem, SpecInvalid, dotted, show, value_problem
from hpc_train.spec.rules import check_spec
from hpc_train.spec.schema import JobSpec
from hpc_train.spec.suggest import suggest_key
from hpc_train.spec.yaml_io import read_spec_file

_LIMITS = (("ge", ">=", lambda v, n: v >= n), ("gt", ">", lambda v, n: v > n),
           ("le", "<=", lambda v, n: v <= n), ("lt", "<", lambda v, n: v < n))


@lru_cache(maxsize=None)
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls)


def _required(f: dataclasses.Field) -> bool:
    return f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING


def _unknown_key(key: Any, value: Any, prefix: str, valid: list[str]) -> Problem:
    where = prefix.rstrip(".") or "the top level"
    guess = suggest_key(str(key), prefix, valid)
    hint = f"did you mean {guess!r}? " if guess else ""
    fix = f"rename it to {guess}" if guess else "remove it or use one of the valid keys"
    return Problem(dotted(prefix, key), None,
                   f"unknown key (value {show(value)}); {hint}valid keys in {where}: "
                   f"{', '.join(valid)}", fix)


def _limit_problems(key: str, value: Any, given: Any, meta: dict, example: Any) -> list[Problem]:
    """Range checks on a converted number; `given` is what the user wrote, for the message."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return []
    out = []
    for name, symbol, ok in _LIMITS:
        bound = meta.get(name)
        if bound is not None and not ok(value, bound):
            rule = f"must be {symbol} {bound:g} ({meta['doc']})"
            out.append(value_problem(key, given, rule,
                                     f"set a value {symbol} {bound:g}, e.g. {key}: {example}"))
    return out


def _rule_problems(key: str, value: Any, meta: dict) -> list[Problem]:
    """The field's `check`, `each` and `key_check` rules from values.py."""
    verdicts = []
    if meta.get("check") and value is not None:
        verdicts.append((key, value, meta["check"](value)))
    if isinstance(value, dict):
        items = [(dotted(key + ".", name), name, item) for name, item in value.items()]
    elif isinstance(value, list):
        items = [(f"{key}[{i}]", i, item) for i, item in enumerate(value)]
    else:
        items = []
    for item_key, name, item in items:
        if meta.get("key_check"):
            verdicts.append((item_key, name, meta["key_check"](name)))
        if meta.get("each"):
            verdicts.append((item_key, item, meta["each"](item)))
    return [value_problem(k, v, *verdict) for k, v, verdict in verdicts if verdict]


def _leaf(f: dataclasses.Field, tp: Any, raw: Any, key: str, problems: list[Problem]) -> Any:
    meta = f.metadata
    example = meta.get("example")
    if example is None and f.default is not dataclasses.MISSING:
        example = f.default
    before = len(problems)
    value = coerce(raw, tp, key, problems.append, example)
    if value is INVALID:
        return INVALID
    problems.extend(_limit_problems(key, value, raw, meta, example))
    problems.extend(_rule_problems(key, value, meta))
    return value if len(problems) == before else INVALID


def _declared(cls: type | None, given: dict, key: str, problems: list[Problem]) -> Any:
    """`given`, a mapping whose keys and types the dataclass `cls` declares, checked like a
    section and converted; only the keys given are kept (see spec_field's `declared_by`)."""
    if cls is None:   # the field it depends on is invalid, and already reported
        return given
    built = build_dataclass(cls, given, key + ".", problems)
    return INVALID if built is INVALID else {name: getattr(built, name) for name in given}


def build_dataclass(cls: type, raw: dict, prefix: str, problems: list[Problem]) -> Any:
    """An instance of the frozen dataclass `cls` (fields made with schema.spec_field) from `raw`,
    checked like a spec section: unknown keys with a suggestion, types, limits, rules. Returns
    INVALID (coerce.INVALID) after appending the problems, keys prefixed with `prefix`. Other
    strict file formats (workflows) use it, so every file of ours reports problems one way."""
    fields = dataclasses.fields(cls)
    names = [f.name for f in fields]
    before = len(problems)
    for key, value in raw.items():
        if key not in names:
            problems.append(_unknown_key(key, value, prefix, names))
    kwargs = {}
    for f in fields:
        key, tp = prefix + f.name, _hints(cls)[f.name]
        is_section = dataclasses.is_dataclass(tp)
        if f.name not in raw:
            if is_section and _required(f):
                kwargs[f.name] = build_dataclass(tp, {}, key + ".", problems)
            elif _required(f):
                problems.append(Problem(key, None, "required key is missing",
                                        f"add it, e.g. {key}: {f.metadata.get('example')}"))
            continue
        value = raw[f.name]
        if is_section:
            value = {} if value is None else value   # `optim:` with everything under it commented out
            if not isinstance(value, dict):
                problems.append(value_problem(key, value, "a section must be a mapping of keys",
                                              f"indent 'key: value' lines under '{f.name}:'"))
                continue
            kwargs[f.name] = build_dataclass(tp, value, key + ".", problems)
        else:
            kwargs[f.name] = _leaf(f, tp, value, key, problems)
            declared_by = f.metadata.get("declared_by")
            if declared_by and kwargs[f.name] is not INVALID:
                section = {g.name: kwargs.get(g.name, g.default) for g in fields}  # + defaults
                kwargs[f.name] = _declared(declared_by(section), kwargs[f.name], key, problems)
    return INVALID if len(problems) > before else cls(**kwargs)


def build_spec(data: dict, overrides: Iterable[str] = ()) -> tuple[JobSpec | None, list[Problem],
                                                                     list[Problem]]:
    """(spec or None, errors, warnings) from raw YAML data and KEY=VALUE overrides."""
    merged, keys, problems = apply_overrides(data, overrides)
    merged, moved, deprecations = move_deprecated_keys(merged)
    merged, wrong_range = split_node_range(merged)
    problems += wrong_range
    spec = build_dataclass(JobSpec, merged, "", problems)
    problems = name_written_keys(mark_overridden(problems, keys), moved)
    if problems or spec is INVALID:
        return None, problems, []
    errors, warnings = check_spec(spec)
    warnings = mark_overridden(deprecations, keys) + warnings
    return (spec if not errors else None), name_written_keys(errors, moved), warnings


def validate_spec_file(path: str | Path, overrides: Iterable[str] = ()) -> tuple[JobSpec,
                                                                                list[Problem]]:
    """(spec, warnings) for a spec file; raises SpecInvalid (a SpecError) listing every error."""
    data, problems = read_spec_file(path)
    if data is None:
        raise SpecInvalid(problems)
    spec, errors, warnings = build_spec(data, overrides)
    if spec is None:
        raise SpecInvalid(errors)
    return spec, warnings


def load_spec(path: str | Path, overrides: Iterable[str] = ()) -> JobSpec:
    """The validated spec in `path`, with `--set` style overrides applied; warnings are dropped
    (use validate_spec_file to see them)."""
    return validate_spec_file(path, overrides)[0]


def spec_from_dict(data: dict, overrides: Iterable[str] = ()) -> JobSpec:
    """Like load_spec, from already-parsed data (tests, other tools). Raises SpecInvalid."""
    if not isinstance(data, dict):
        raise SpecInvalid([Problem("spec", show(data), "the top level must be a mapping",
                                   "pass a dict of sections")])
    spec, errors, _ = build_spec(data, overrides)
    if spec is None:
        raise SpecInvalid(errors)
    return spec

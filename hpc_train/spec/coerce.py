"""Convert one YAML value to the type a schema annotation asks for, reporting what cannot be.

Why not trust YAML's types: PyYAML (YAML 1.1) reads `1e-4` as the string '1e-4', `yes`/`on` as
booleans, and Python's bool is an int subclass, so `nodes: yes` would quietly be 1. Each
function below accepts only what a user plausibly meant and names the rule otherwise.
"""

from __future__ import annotations

import math
import re
import types
from typing import Any, Callable, Literal, Union, get_args, get_origin

from hpc_train.spec.problems import Problem, dotted, show, value_problem

INVALID = object()  # returned when a problem was reported; the caller keeps going
Report = Callable[[Problem], None]

_CLEAN_INT = re.compile(r"^[+-]?\d+$")
_DECIMAL = re.compile(r"^[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?$")
_BOOL_HINT = "YAML reads yes/no/true/false/on/off as booleans"


def _example(key: str, tp: Any, example: Any) -> str:
    what = f"write {_describe(tp)}"
    return f"{what}, e.g. {key}: {example}" if example is not None else what


def _to_int(value: Any) -> Any:
    if isinstance(value, bool):
        return INVALID
    if isinstance(value, int):
        return value
    if isinstance(value, float) and math.isfinite(value) and value.is_integer():
        return int(value)
    if isinstance(value, str) and _CLEAN_INT.match(value.strip()):
        return int(value.strip())
    return INVALID


def _to_float(value: Any) -> Any:
    if isinstance(value, bool):
        return INVALID
    if isinstance(value, (int, float)):
        number = float(value)
    elif isinstance(value, str) and _DECIMAL.match(value.strip()):
        number = float(value.strip())  # '1e-4' and friends, which YAML 1.1 leaves as strings
    else:
        return INVALID
    return number if math.isfinite(number) else INVALID


def _to_str(value: Any) -> Any:
    if isinstance(value, str):
        return value
    if isinstance(value, int) and not isinstance(value, bool):
        return str(value)  # `OMP_NUM_THREADS: 1`, `mem: 0`, `time: 30` mean the digits
    return INVALID


def _describe(tp: Any) -> str:
    origin = get_origin(tp)
    if origin is Literal:
        return "one of " + ", ".join(repr(c) for c in get_args(tp))
    if origin in (Union, types.UnionType):
        return " or ".join(_describe(a) for a in get_args(tp))
    if tp is type(None):
        return "null"
    if origin is list:
        return "a list"
    if origin is dict:
        return "a mapping"
    return {int: "a whole number", float: "a number", str: "a string", bool: "true or false",
            Any: "plain data"}.get(tp, str(tp))


def _plain_data(value: Any) -> bool:
    """True for what JSON can hold; YAML may also give dates, sets and bytes."""
    if value is None or isinstance(value, (str, bool, int)):
        return True
    if isinstance(value, float):
        return math.isfinite(value)
    if isinstance(value, list):
        return all(_plain_data(v) for v in value)
    if isinstance(value, dict):
        return all(isinstance(k, str) and _plain_data(v) for k, v in value.items())
    return False


def _closest_choice(value: Any, choices: tuple) -> str:
    import difflib

    words = [c for c in choices if isinstance(c, str)]
    close = difflib.get_close_matches(str(value).lower(), words, n=1, cutoff=0.5)
    return f"did you mean {close[0]!r}? " if close else ""


def coerce(value: Any, tp: Any, key: str, report: Report, example: Any = None) -> Any:
    """`value` converted to `tp`, or INVALID after reporting one problem for each bad part."""
    origin = get_origin(tp)
    if origin in (Union, types.UnionType):
        options = get_args(tp)
        if value is None and type(None) in options:
            return None
        real = [option for option in options if option is not type(None)]
        if len(real) == 1:  # Optional[X]: X's own, more precise, message
            return coerce(value, real[0], key, report, example)
        for option in real:
            converted = coerce(value, option, key, lambda _p: None, example)
            if converted is not INVALID:
                return converted
        report(value_problem(key, value, f"must be {_describe(tp)}", _example(key, tp, example)))
        return INVALID
    if origin is Literal:
        choices = get_args(tp)
        if value in choices and not isinstance(value, bool):
            return value
        hint = _closest_choice(value, choices)
        report(value_problem(key, value, f"must be {_describe(tp)}",
                             f"{hint}write one of the choices, e.g. {key}: {choices[0]}"))
        return INVALID
    if origin is list:
        return _coerce_list(value, get_args(tp)[0], key, report)
    if origin is dict:
        return _coerce_dict(value, get_args(tp)[1], key, report)
    converter = {int: _to_int, float: _to_float, str: _to_str, bool: _to_bool}.get(tp)
    if converter is None:
        if tp is Any and _plain_data(value):
            return value
        report(value_problem(key, value, "must be plain data (strings, numbers, lists, maps)",
                             "quote dates and remove YAML tags"))
        return INVALID
    converted = converter(value)
    if converted is INVALID:
        report(value_problem(key, value, _type_rule(tp, value), _example(key, tp, example)))
    return converted


def _to_bool(value: Any) -> Any:
    return value if isinstance(value, bool) else INVALID


def _type_rule(tp: Any, value: Any) -> str:
    rule = f"must be {_describe(tp)}"
    if isinstance(value, bool):
        return f"{rule}, not a boolean ({_BOOL_HINT})"
    if tp is int and isinstance(value, float):
        return f"{rule}, without a fractional part"
    if tp is str and value is not None:
        return f"{rule} (quote it: YAML read it as {type(value).__name__})"
    if tp is bool:
        return f"{rule} (unquoted)"
    return rule


def _coerce_list(value: Any, item_tp: Any, key: str, report: Report) -> Any:
    if not isinstance(value, list):
        report(value_problem(key, value, f"must be a list of {_describe(item_tp)}",
                             f"write a YAML list, e.g. {key}: [] or one '- item' per line"))
        return INVALID
    items = [coerce(item, item_tp, f"{key}[{i}]", report) for i, item in enumerate(value)]
    return INVALID if any(item is INVALID for item in items) else items


def _coerce_dict(value: Any, item_tp: Any, key: str, report: Report) -> Any:
    if not isinstance(value, dict):
        report(value_problem(key, value, f"must be a mapping of names to {_describe(item_tp)}",
                             f"write 'name: value' lines under {key}, or {key}: {{}}"))
        return INVALID
    result: dict[str, Any] = {}
    ok = True
    for name, item in value.items():
        if not isinstance(name, str):
            report(Problem(dotted(key + ".", name), show(name), "names must be strings",
                           "quote the name"))
            ok = False
            continue
        converted = coerce(item, item_tp, dotted(key + ".", name), report)
        ok = ok and converted is not INVALID
        result[name] = converted
    return result if ok else INVALID

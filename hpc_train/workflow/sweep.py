"""Sweeps (pure): the members' overrides, their metric, and which member is best.

A member is one combination of the grid (keys in file order, the last varying fastest), combined
with one entry of `sets`. Its metric is a field of the last `val` (or train) line of its
metrics.jsonl; the best member is the highest (or lowest, for `min`) value, the lowest index on a
tie, among members that finished and logged the metric.
"""

from __future__ import annotations

import itertools
import json
import math
from typing import Any

from hpc_train.workflow.schema import SweepSpec


def members(sweep: SweepSpec) -> list[dict[str, Any]]:
    """Each member's job spec overrides (key -> value), in array index order."""
    keys = list(sweep.grid)
    points = [dict(zip(keys, combo)) for combo in itertools.product(*sweep.grid.values())] or [{}]
    return [{**chosen, **point} for chosen in (sweep.sets or [{}]) for point in points]


def as_overrides(values: dict[str, Any]) -> list[str]:
    """KEY=VALUE strings as --set takes them; JSON is YAML, so each value reads back as given."""
    return [f"{key}={json.dumps(value)}" for key, value in values.items()]


def label(values: dict[str, Any]) -> str:
    return " ".join(f"{key}={json.dumps(value)}" for key, value in values.items()) or "(no overrides)"


def mode_of(best_by: str, best_mode: str | None) -> str:
    """max unless said otherwise; a loss is minimised by default."""
    if best_mode:
        return best_mode
    return "min" if best_by.split(".", 1)[1].endswith("loss") else "max"


def metric_value(metrics: list[dict], best_by: str) -> float | None:
    """The metric from a run's metrics.jsonl lines: the last val (or train) line that has it."""
    source, field = best_by.split(".", 1)
    for line in reversed(metrics):
        if (line.get("split") == "val") != (source == "val"):
            continue
        value = line.get(field)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            return float(value)
    return None


def ranking(values: dict[int, float | None], mode: str) -> list[int]:
    """Member indices, best first; members without a value last, by index."""
    scored = sorted((i for i, v in values.items() if v is not None),
                    key=lambda i: (-values[i] if mode == "max" else values[i], i))
    return scored + sorted(i for i, v in values.items() if v is None)


def best(values: dict[int, float | None], mode: str) -> int | None:
    order = ranking(values, mode)
    return order[0] if order and values[order[0]] is not None else None

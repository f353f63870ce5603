"""`workflow best DIR STAGE`: the best member of a sweep, by its metric, chosen now.

A later stage's batch script runs it when that job starts (the sweep has run by then), and uses
the run directory it prints; `--record` writes the choice into the workflow's events, so status
and resume know which member was evaluated. Only members whose run finished `completed` count.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hpc_train.errors import InspectError
from hpc_train.rundir import RunPaths, read_jsonl
from hpc_train.workflow import events, resolved, verify
from hpc_train.workflow.paths import WorkflowPaths
from hpc_train.workflow.sweep import best, metric_value


@dataclass(frozen=True)
class Choice:
    stage: str
    index: int
    run_dir: str
    metric: str
    value: float
    mode: str
    values: dict[int, float | None]


def choose(directory: str | Path, stage: str, record: bool = False) -> Choice:
    paths = WorkflowPaths(Path(directory).resolve())
    data = resolved.read(paths)
    sweep = data["stages"].get(stage)
    if sweep is None or "members" not in sweep:
        sweeps = [n for n, s in data["stages"].items() if "members" in s]
        raise InspectError(f"{stage}: not a sweep stage of {paths.root} (sweeps: "
                           f"{', '.join(sweeps) or 'none'})")
    metric, mode = sweep["best_by"], sweep.get("best_mode") or "max"
    if not metric:
        raise InspectError(f"sweep {stage} has no best_by metric")
    values = {m["index"]: (metric_value(read_jsonl(RunPaths(Path(m["run_dir"])).metrics), metric)
                           if verify.run_completed(m["run_dir"]) else None)
              for m in sweep["members"]}
    index = best(values, mode)
    if index is None:
        raise InspectError(f"no member of sweep {stage} finished with {metric} in its metrics.jsonl "
                           f"(members: {', '.join(m['run_dir'] for m in sweep['members'])})")
    run_dir = sweep["members"][index]["run_dir"]
    if record:
        events.record(paths, events.best_chosen(stage, index, run_dir, metric, values[index], mode))
    return Choice(stage, index, run_dir, metric, values[index], mode, values)

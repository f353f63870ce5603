"""Is a stage's work done? From its outputs, not from Slurm (which forgets, or may not answer):
what `workflow resume` skips, and what status shows when Slurm has nothing to say.

  shard     its last job's COMPLETE marker, a manifest that loads, every shard it lists present
            with the recorded size (the full checksum and decode check is `data verify`, run by
            the stage itself)
  train     the run finished `completed` (its events); a sweep: every member did
  evaluate  the marker and an eval-<split>-*.json in the evaluated run directory
  export    the marker and the exported file
  command   the marker (one per task of an array)
"""

from __future__ import annotations

import json
from pathlib import Path

from hpc_train import events as run_events
from hpc_train.rundir import RunPaths
from hpc_train.workflow import events, refs
from hpc_train.workflow.paths import WorkflowPaths


def run_completed(run_dir: str | Path) -> bool:
    return run_events.state(run_events.read(RunPaths(Path(run_dir)))) == "COMPLETED"


def manifest_problem(split_dir: Path) -> str | None:
    try:
        manifest = json.loads((split_dir / "manifest.json").read_text())
        shards = manifest["shards"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        return f"{split_dir / 'manifest.json'}: {exc}"
    for entry in shards:
        path = split_dir / str(entry.get("file"))
        if not path.is_file() or path.stat().st_size != entry.get("bytes"):
            return f"{path}: missing or not the size the manifest records"
    return None


def evaluated_run(record: dict, history: list[dict]) -> str | None:
    """The run directory an evaluate (or export) stage worked on: as resolved, or the sweep
    member its job chose when it started (None before it chose)."""
    run_dir = record["outputs"].get("run_dir", "")
    for ref in refs.references(run_dir):
        choice = events.best_choice(history, ref.stage)
        if choice is None:
            return None
        run_dir = run_dir.replace(str(ref), choice["run_dir"])
    return run_dir


def evaluations(run_dir: str | None, split: str) -> list[Path]:
    """The run's evaluation files of `split`, by checkpoint step (the last is the latest)."""
    if not run_dir:
        return []
    found = [(int(p.stem.rsplit("-", 1)[1]), p) for p in Path(run_dir).glob(f"eval-{split}-*.json")
             if p.stem.rsplit("-", 1)[1].isdigit()]
    return [p for _, p in sorted(found)]


def incomplete(paths: WorkflowPaths, name: str, record: dict, history: list[dict]) -> str | None:
    """Why stage `name` is not done (None when it is verified complete)."""
    kind = record["kind"]
    if kind == "train":
        unfinished = [d for d in record["run_dirs"] if not run_completed(d)]
        return f"run(s) not finished: {', '.join(unfinished)}" if unfinished else None
    tasks = record.get("tasks", 1) if kind == "command" else 1
    markers = [paths.marker(name)] if tasks == 1 else [paths.marker(name, k) for k in range(tasks)]
    missing = [m.name for m in markers if not m.exists()]
    if missing:
        return f"its job did not finish successfully (no {', '.join(missing)})"
    if kind == "shard":
        return manifest_problem(Path(record["outputs"]["split_dir"]))
    if kind == "evaluate" and not evaluations(evaluated_run(record, history), record.get("split", "val")):
        return "no evaluation file in the evaluated run directory"
    if kind == "export" and not Path(record["outputs"]["output"]).is_file():
        return f"{record['outputs']['output']} is missing"
    return None

"""The metrics as a Weights & Biases run, offline by default, under the run directory's wandb/.

Compute nodes often have no internet: with log.wandb.mode offline (the default) each segment
writes wandb/offline-run-<time>-<id>/, all with the run directory's one run id
(runtime/tracker_state.py: wandb_run_id), and `wandb sync --id <id> RUN/wandb/offline-run-*`
from the login node uploads them in order as one run (`status` prints the command). Online,
`resume="allow"` continues the same run. Steps already logged are not logged again (W&B drops
a step lower than its run's current one).

wandb buffers its offline file (x_transaction_log_flush_interval, 15 s): a segment killed
outright (SIGKILL, a dead node) loses what it had not flushed. So a new offline segment reads
back, with wandb's own reader (`wandb leet inspect --json`), the steps its earlier segments'
files hold (`offline_steps`); the steps missing from them are replayed from metrics.jsonl
(tracker_set.py).
"""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

from hpc_train.rundir import parse_json
from hpc_train.runtime.tracker_state import TrackerRun, wandb_run_id
from hpc_train.train.trackers.protocol import Opened, Param, TrackerContext, last_steps

log = logging.getLogger("hpc_train.trackers")

READ_SECONDS = 120.0     # the bound on reading back one segment's offline file


class WandbTracker:
    rewrites_steps = False

    def __init__(self, run):
        self.run = run

    def log_params(self, params: Mapping[str, Param]) -> None:
        self.run.config.update(dict(params), allow_val_change=True)

    def log_metrics(self, step: int, metrics: Mapping[str, float], walltime: float | None) -> None:
        self.run.log(dict(metrics), step=step)

    def log_final_checkpoint(self, path: Path) -> None:
        self.run.summary["final_checkpoint"] = str(path)

    def close(self) -> None:
        self.run.finish()


def open_wandb(context: TrackerContext) -> Opened | None:
    """This segment's W&B run (the run directory's), or None (said) without the package."""
    try:
        import wandb
    except ImportError as exc:
        log.warning("log.trackers wandb: %s; no W&B run for this run", exc)
        return None
    spec, paths = context.spec, context.paths
    settings = spec.log.wandb
    run_id = context.stored.run_id if context.stored else wandb_run_id(paths.root)
    held = offline_steps(paths.wandb, run_id) if context.stored and settings.mode == "offline" else None
    paths.wandb.mkdir(exist_ok=True)
    # console off: the rank's own log already has its output; wandb's capture would wrap it.
    run = wandb.init(id=run_id, resume="allow", mode=settings.mode, dir=str(paths.root),
                     project=settings.project or spec.run.name, entity=settings.entity,
                     name=settings.name or paths.root.name,
                     settings=wandb.Settings(console="off", silent=True))
    stored = context.stored or TrackerRun(run_id)
    return Opened(WandbTracker(run), stored, is_new=context.stored is None, held=held)


def history_steps(lines: list[str]) -> dict[str, int]:
    """`wandb leet inspect --json` lines -> {key: its last step} of the history records (pure;
    W&B's own keys, "_step" and the like, left out)."""
    steps: dict[str, int] = {}
    for line in lines:
        try:
            record = parse_json(line)
            history = record["history"] if record.get("type") == "history" else None
            if history is None:
                continue
            step = int(history["step"]["num"])
            for key in history.get("item", {}):
                if not key.startswith("_"):
                    steps[key] = max(step, steps.get(key, step))
        except (ValueError, KeyError, TypeError, AttributeError):
            continue
    return steps


def offline_steps(wandb_dir: Path, run_id: str) -> dict[str, int] | None:
    """The last step of each split that this run's offline segments hold in their files; None
    when a file cannot be read (then trackers.json is trusted)."""
    steps: dict[str, int] = {}
    for path in sorted(wandb_dir.glob(f"offline-run-*-{run_id}/run-{run_id}.wandb")):
        try:
            out = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
                                 capture_output=True, text=True, timeout=READ_SECONDS,
                                 stdin=subprocess.DEVNULL)
        except (OSError, subprocess.TimeoutExpired) as exc:
            log.warning("log.trackers wandb: %s not read back (%s); trusting trackers.json", path, exc)
            return None
        found = history_steps(out.stdout.splitlines())
        if out.returncode != 0:
            # A torn tail (killed mid-flush): what came before it is still the file's.
            log.warning("log.trackers wandb: %s read back %s (%s)", path,
                        "in part" if found else "not at all; trusting trackers.json",
                        out.stderr.strip()[-300:])
            if not found:
                return None
        for key, step in found.items():
            steps[key] = max(step, steps.get(key, step))
    return last_steps(steps)

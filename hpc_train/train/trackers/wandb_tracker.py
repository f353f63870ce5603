"""The metrics as a Weights & Biases run, offline by default, under the run directory's wandb/.

Compute nodes often have no internet: with log.wandb.mode offline (the default) each segment
writes wandb/offline-run-<time>-<id>/, all with the run directory's one run id
(runtime/tracker_state.py: wandb_run_id), and `wandb sync --id <id> RUN/wandb/offline-run-*`
from the login node uploads them in order as one run (`status` prints the command). Online,
`resume="allow"` continues the same run. Steps already logged are not logged again (W&B drops
a step lower than its run's current one).
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from hpc_train.runtime.tracker_state import TrackerRun, wandb_run_id
from hpc_train.train.trackers.protocol import Opened, Param, TrackerContext

log = logging.getLogger("hpc_train.trackers")


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
    paths.wandb.mkdir(exist_ok=True)
    # console off: the rank's own log already has its output; wandb's capture would wrap it.
    run = wandb.init(id=run_id, resume="allow", mode=settings.mode, dir=str(paths.root),
                     project=settings.project or spec.run.name, entity=settings.entity,
                     name=settings.name or paths.root.name,
                     settings=wandb.Settings(console="off", silent=True))
    stored = context.stored or TrackerRun(run_id)
    return Opened(WandbTracker(run), stored, is_new=context.stored is None)

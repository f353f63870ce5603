"""The metrics as TensorBoard event files under the run directory's tensorboard/ (rank 0).

One run directory is one TensorBoard run, continued across requeues: a resumed segment opens its
writer with `purge_step` = the first step it will train, so TensorBoard drops the points that the
previous segment logged after its last checkpoint (that work was lost and is done again), and
each step keeps exactly one point.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

from hpc_train.train.trackers.protocol import Opened, Param, TrackerContext

log = logging.getLogger("hpc_train.trackers")


class TensorBoardTracker:
    rewrites_steps = True

    def __init__(self, writer, spec_text: str):
        self.writer, self.spec_text = writer, spec_text

    def log_params(self, params: Mapping[str, Param]) -> None:
        from torch.utils.tensorboard.summary import hparams

        self.writer.add_text("spec", "```\n" + self.spec_text + "\n```", 0)
        for summary in hparams(dict(params), {"val/accuracy": 0.0, "val/loss": 0.0}):
            self.writer.file_writer.add_summary(summary)

    def log_metrics(self, step: int, metrics: Mapping[str, float], walltime: float | None) -> None:
        for tag, value in metrics.items():
            self.writer.add_scalar(tag, value, step, walltime=walltime)

    def log_final_checkpoint(self, path: Path) -> None:
        self.writer.add_text("final_checkpoint", str(path))

    def close(self) -> None:
        self.writer.close()


def open_tensorboard(context: TrackerContext) -> Opened | None:
    """The writer of this segment, or None (said) without the tensorboard package."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:  # tensorboard not installed where the ranks run
        log.warning("log.trackers tensorboard: %s; no event files for this run", exc)
        return None
    first = context.first_step
    writer = SummaryWriter(str(context.paths.tensorboard), purge_step=first or None, flush_secs=10)
    return Opened(TensorBoardTracker(writer, context.spec_text), None, is_new=not first)

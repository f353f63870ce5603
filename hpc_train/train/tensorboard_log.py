"""The metrics log as TensorBoard event files (rank 0; `log.tensorboard`).

One run directory is one TensorBoard run, continued across requeues: a resumed run opens its
writer with `purge_step` = the first step it will train, so TensorBoard drops the points that the
previous run logged after its last checkpoint (that run's work was lost and is done again), and
each step keeps exactly one point. Writing is best effort: a missing tensorboard package or a
full disk costs the curves, never the training.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from pathlib import Path

log = logging.getLogger("hpc_train.tensorboard")

# metrics.jsonl fields that are not curves.
_NOT_SCALARS = ("time", "step", "epoch", "split")


def scalar_tags(record: Mapping) -> dict[str, float]:
    """A metrics.jsonl record -> {"train/loss": ..., "val/accuracy": ...} (pure)."""
    prefix = record.get("split") or "train"
    return {f"{prefix}/{name}": float(value) for name, value in record.items()
            if name not in _NOT_SCALARS and isinstance(value, (int, float))
            and not isinstance(value, bool)}


def flat_hparams(spec: Mapping, prefix: str = "") -> dict[str, float | str | bool]:
    """The spec's scalar settings as TensorBoard hparams: {"optim.base_lr": 0.4, ...} (pure)."""
    flat: dict[str, float | str | bool] = {}
    for key, value in spec.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            flat.update(flat_hparams(value, f"{name}."))
        elif isinstance(value, (bool, int, float, str)):
            flat[name] = value
    return flat


class TensorBoardLog:
    def __init__(self, directory: Path, first_step: int, spec: Mapping, spec_text: str):
        self.writer = None
        try:
            from torch.utils.tensorboard import SummaryWriter
            from torch.utils.tensorboard.summary import hparams
        except ImportError as exc:  # tensorboard not installed where the ranks run
            log.warning("log.tensorboard: %s; no event files for this run", exc)
            return
        # purge_step: points at or after the first step of this run, left by a run that was
        # stopped after its last checkpoint, are dropped by TensorBoard's readers.
        self.writer = SummaryWriter(str(directory), purge_step=first_step if first_step else None,
                                    flush_secs=10)
        if not first_step:
            self.writer.add_text("spec", "```\n" + spec_text + "\n```", 0)
            experiment, start, end = hparams(flat_hparams(spec), {"val/accuracy": 0.0, "val/loss": 0.0})
            for summary in (experiment, start, end):
                self.writer.file_writer.add_summary(summary)

    def write(self, record: Mapping) -> None:
        if self.writer is None:
            return
        try:
            for tag, value in scalar_tags(record).items():
                self.writer.add_scalar(tag, value, record["step"], walltime=record.get("time"))
        except OSError as exc:
            log.warning("log.tensorboard: %s; no more event files for this run", exc)
            self.writer = None

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            self.writer = None

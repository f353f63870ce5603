"""Test-only: the sample ledger, each rank's record of the samples it trained and at what LR.

Set HPC_TRAIN_SAMPLE_LEDGER=PATH for the ranks (as HPC_TRAIN_FAULT switches on
runtime/faults.py): every rank appends one JSON line per sample of each step it trains, with
the sample's epoch and index, the step's LR, the position the step reached (`train/schedule.py`)
its samples per step, and which start of the ranks trained it (the driver's launch id: steps
trained after the last checkpoint of a start that failed are trained again by the next). Tests
read it to check that a run resumed on other world sizes
trained every sample of every epoch once, at the uninterrupted run's LR. The keys are the
sampler's own iteration, in the order the loader hands them to the steps.
"""

from __future__ import annotations

import json
import os

from hpc_train.launch.identity import LAUNCH_ID_ENV

ENV = "HPC_TRAIN_SAMPLE_LEDGER"


class SampleLedger:
    """Does nothing unless HPC_TRAIN_SAMPLE_LEDGER is set, nor on ranks that are not `first` of
    the ranks reading the same samples (a pipeline's later stages)."""

    def __init__(self, rank: int, first: bool = True, environ=os.environ):
        self.path, self.rank = (environ.get(ENV) or None) if first else None, rank
        self.launch = environ.get(LAUNCH_ID_ENV, "")
        self.keys: list = []
        self.per_step = 0

    def start(self, sampler) -> None:
        """The keys this rank is about to train, from the sampler as set for this epoch."""
        if self.path:
            self.keys, self.per_step = list(sampler), sampler.passes_per_step * sampler.batch_per_rank

    def record(self, lr: float, position: int, samples_per_step: int) -> None:
        """The next step's keys, appended in one write (O_APPEND: ranks' lines never mix)."""
        if not self.path:
            return
        taken, self.keys = self.keys[:self.per_step], self.keys[self.per_step:]
        lines = "".join(json.dumps({"rank": self.rank, "epoch": key.epoch, "index": key.index,
                                    "lr": lr, "position": position,
                                    "samples_per_step": samples_per_step, "launch": self.launch}) + "\n"
                        for key in taken)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, lines.encode())
        finally:
            os.close(fd)

"""Windowed throughput and loss meters for the metrics log (no collectives here)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field


@dataclass
class Window:
    """What happened since the last logged step."""

    started: float = field(default_factory=time.perf_counter)
    steps: int = 0
    loss_sum: float = 0.0
    loss_steps: int = 0           # steps with a loss on this rank (a pipeline's last stage has)
    data_seconds: float = 0.0
    skipped: int = 0

    def add(self, loss: float | None, data_seconds: float, applied: bool) -> None:
        self.steps += 1
        if loss is not None:
            self.loss_sum += loss
            self.loss_steps += 1
        self.data_seconds += data_seconds
        self.skipped += not applied

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

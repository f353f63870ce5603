"""Progress for one shard writer: a rich bar on a terminal, plain periodic lines otherwise.

Several MPI ranks or array tasks share one log, where bars would garble each other, so only a
lone writer on a tty gets the bar.
"""

from __future__ import annotations

import sys
import time


class Progress:
    def __init__(self, label: str, total_images: int, total_shards: int, use_bar: bool | None = None,
                 interval: float = 30.0, stream=None):
        self.label, self.total_images, self.total_shards = label, total_images, total_shards
        self.stream = stream or sys.stderr
        self.interval = interval
        self.images = self.shards = self.skipped = 0
        self.start = self._last = time.monotonic()
        self._bar = None
        if (self.stream.isatty() if use_bar is None else use_bar) and total_images:
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeRemainingColumn
            from rich.progress import Progress as RichProgress

            self._bar = RichProgress(TextColumn("{task.description}"), BarColumn(),
                                     MofNCompleteColumn(), TextColumn("{task.fields[rate]}"),
                                     TimeRemainingColumn(), console=Console(file=self.stream))
            self._task = self._bar.add_task(label, total=total_images, rate="")
            self._bar.start()

    @property
    def rate(self) -> float:
        return self.images / max(time.monotonic() - self.start, 1e-9)

    def advance(self, images: int, skipped: int = 0, shard_done: bool = False) -> None:
        self.images += images
        self.skipped += skipped
        self.shards += int(shard_done)
        if self._bar is not None:
            self._bar.update(self._task, advance=images, rate=f"{self.rate:.0f} img/s")
            return
        now = time.monotonic()
        if now - self._last >= self.interval:
            self._last = now
            self.line()

    def line(self) -> None:
        print(f"{self.label}: shards {self.shards}/{self.total_shards}, images "
              f"{self.images}/{self.total_images}, {self.rate:.0f} img/s, "
              f"{self.skipped} unreadable", file=self.stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.stop()
            self._bar = None

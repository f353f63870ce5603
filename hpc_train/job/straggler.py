"""Which rank do the others wait for, and how long? A pure comparison of the ranks' step times
in their heartbeats (runtime/heartbeat.py: RankTimes); the driver warns, `status` and `report`
show it.

In a synchronous data-parallel step every rank's step takes as long as the slowest rank's work:
the others spend the difference blocked in the gradient reduction. So the ranks are compared by
their own time per step, `busy` = the step less the time blocked in the reduction
(train/timing.py: blocked_seconds says what each backend lets us measure), as medians over
their last steps. The slowest rank is the one with the most; the others wait for it its excess
over their median, every step; it waits on data when its loader wait makes up most of that.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from statistics import median

from hpc_train.runtime.heartbeat import Beat

MIN_SHARE = 0.05            # an excess under 5% of the step is noise: never a warning
MIN_STEPS = 8               # medians of fewer steps: the first one (workers starting) weighs too much
WARN_EVERY_SECONDS = 600.0  # at most one `straggler` event per rank in this long


@dataclass(frozen=True)
class Straggler:
    """The slowest rank against the others (seconds per step, medians over their last steps)."""
    rank: int
    host: str | None
    busy: float             # its own time per step
    others_busy: float      # the other ranks' median own time
    step: float             # the step time (the ranks' median)
    data: float             # its loader wait per step
    others_data: float

    @property
    def ratio(self) -> float:
        return self.busy / self.others_busy if self.others_busy > 0 else float("inf")

    @property
    def wait(self) -> float:
        """How long the others wait for it each step."""
        return max(0.0, self.busy - self.others_busy)

    @property
    def share(self) -> float:
        """The part of every step the others wait for it."""
        return self.wait / self.step if self.step > 0 else 0.0

    @property
    def on_data(self) -> bool:
        return self.wait > 0 and self.data - self.others_data >= self.wait / 2

    def over(self, threshold: float | None) -> bool:
        """Slow enough to warn about: `threshold` times the others' own time, and no noise."""
        return threshold is not None and self.ratio >= threshold and self.share >= MIN_SHARE

    def words(self) -> str:
        """"rank 1 on node2: 3.0x the others' own time per step; they wait 0.20 s of every
        0.31 s step (65%) for it; not waiting on data"."""
        where = f" on {self.host}" if self.host else ""
        data = (f"waiting on data ({self.data:.3g} s a step for its loader)" if self.on_data
                else "not waiting on data")
        return (f"rank {self.rank}{where}: {self.ratio:.1f}x the others' own time per step; they "
                f"wait {self.wait:.3g} s of every {self.step:.3g} s step ({self.share:.0%}) for "
                f"it; {data}")

    def to_json(self) -> dict:
        return {**asdict(self), "ratio": round(self.ratio, 3), "wait": round(self.wait, 6),
                "share": round(self.share, 4), "on_data": self.on_data}


def slowest_rank(beats: dict[int, Beat]) -> Straggler | None:
    """The rank with the most own time per step against the others; None with fewer than two
    ranks whose beats carry the times of MIN_STEPS steps."""
    timed = {r: b for r, b in beats.items() if b.times and b.times.steps >= MIN_STEPS
             and b.times.busy is not None and b.times.step is not None}
    if len(timed) < 2:
        return None
    rank = max(sorted(timed), key=lambda r: timed[r].times.busy)
    others = [b.times for r, b in timed.items() if r != rank]
    me = timed[rank].times
    return Straggler(rank, timed[rank].host, me.busy, median(t.busy for t in others),
                     median(b.times.step for b in timed.values()), me.data or 0.0,
                     median(t.data or 0.0 for t in others))


class StragglerWarnings:
    """When the driver records a `straggler` event: over the threshold, and at most once per
    WARN_EVERY_SECONDS for the same rank."""

    def __init__(self, threshold: float | None):
        self.threshold = threshold
        self.warned: dict[int, float] = {}

    def due(self, beats: dict[int, Beat], now: float) -> Straggler | None:
        found = slowest_rank(beats)
        if found is None or not found.over(self.threshold):
            return None
        if now - self.warned.get(found.rank, float("-inf")) < WARN_EVERY_SECONDS:
            return None
        self.warned[found.rank] = now
        return found

"""Learning-rate schedule: linear warmup to the peak LR, then cosine / step / constant, as a
pure function of the run's position in samples.

Why samples, not steps: a step holds another number of samples at another world size, so a
schedule counted in steps is stretched or squeezed by a resume on more or fewer ranks. Counted
in samples, the LR at a position is the same whatever global batches led there. The math has
no torch, so it is tested with plain numbers. The peak LR is the spec's `scaled_lr` for the
global batch of the step (the linear scaling rule, `spec.schema.scale_lr`).

`position` is `epoch * epoch_samples + consumed`: the epochs done, each counted as the whole
data set, plus the samples of the current epoch's order trained (see `train/state.Progress`).
An epoch's tail that does not fill a step is not trained, so the position jumps over it at the
epoch's end, and milestones given in epochs stay at the start of their epoch. The LR of a step
is the schedule at the position that step reaches (its samples included): the first step of
warmup trains at `peak * samples_per_step / warmup_samples`, small but never 0, which is the
old step-counted `1 / warmup_steps`.

Warmup (Goyal et al. 2017, "Accurate, Large Minibatch SGD", sec. 2.2): linear in the position
up to exactly `peak_lr` at `warmup_epochs`; the decay starts there with `peak_lr`, so the curve
is continuous.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

__all__ = ["SCHEDULES", "lr_at", "LrSchedule"]

SCHEDULES = ("cosine", "step", "constant")


def _check(peak_lr: float, epoch_samples: int, warmup_epochs: float, total_epochs: float,
           schedule: str, milestones: Sequence[float], gamma: float) -> None:
    """Every rule with the values that broke it; called once per LrSchedule, and by lr_at."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if not peak_lr > 0:
        raise ValueError(f"peak_lr must be > 0, got {peak_lr!r}")
    if isinstance(epoch_samples, bool) or not isinstance(epoch_samples, int) or epoch_samples < 1:
        raise ValueError(f"epoch_samples must be a positive integer (the training set's "
                         f"samples), got {epoch_samples!r}")
    if not 0 <= warmup_epochs <= total_epochs:
        raise ValueError(f"need 0 <= warmup_epochs <= total_epochs, got warmup_epochs="
                         f"{warmup_epochs!r}, total_epochs={total_epochs!r}")
    if not total_epochs > 0:
        raise ValueError(f"total_epochs must be > 0, got {total_epochs!r}")
    if schedule == "step":
        if not milestones:
            raise ValueError("schedule 'step' needs milestones (epochs), e.g. [30, 60, 80]")
        ms = list(milestones)
        if ms != sorted(ms) or len(set(ms)) != len(ms):
            raise ValueError(f"milestones must be strictly increasing, got {ms}")
        # A milestone inside warmup would make the LR jump at the warmup boundary.
        if ms[0] <= warmup_epochs:
            raise ValueError(f"milestones must be after warmup_epochs={warmup_epochs}, got {ms}; "
                             f"move the first milestone later or shorten warmup")
        if not 0 < gamma <= 1:
            raise ValueError(f"gamma must be in (0, 1], got {gamma!r}")


def lr_at(position: int, *, peak_lr: float, epoch_samples: int, warmup_epochs: float,
          total_epochs: float, schedule: str, milestones: Sequence[float] = (),
          gamma: float = 0.1, _checked: bool = False) -> float:
    """LR of the step that brings the run to sample `position` (see the module docstring).

    cosine: `peak * 0.5 * (1 + cos(pi * p))`, p going 0 -> 1 from warmup end to total end;
      0 at and after `total_epochs`.
    step: `peak * gamma ** (number of milestones passed)`; milestones are epochs, and a step
      ending exactly at one still trains at the earlier LR.
    constant: `peak` after warmup.
    """
    if not _checked:
        _check(peak_lr, epoch_samples, warmup_epochs, total_epochs, schedule, milestones, gamma)
    if isinstance(position, bool) or not isinstance(position, int) or position < 1:
        raise ValueError(f"position must be an integer >= 1 (a step trains at least one "
                         f"sample), got {position!r}")
    warmup = warmup_epochs * epoch_samples
    if position < warmup:
        return peak_lr * position / warmup
    if schedule == "constant":
        return peak_lr
    if schedule == "step":
        return peak_lr * gamma ** sum(position > m * epoch_samples for m in milestones)
    decay = total_epochs * epoch_samples - warmup
    if decay <= 0:  # all warmup (warmup_epochs == total_epochs): nothing to decay over
        return 0.0
    progress = min(1.0, (position - warmup) / decay)
    return peak_lr * 0.5 * (1.0 + math.cos(math.pi * progress))


class LrSchedule:
    """`lr_at` with its settings bound (checked once), and setting it on an optimizer.

    No state of its own: the LR follows from the position (`Progress`), which checkpoints hold.
    """

    def __init__(self, *, peak_lr: float, epoch_samples: int, warmup_epochs: float,
                 total_epochs: float, schedule: str = "cosine", milestones: Sequence[float] = (),
                 gamma: float = 0.1) -> None:
        self.config: dict[str, Any] = dict(
            peak_lr=peak_lr, epoch_samples=epoch_samples, warmup_epochs=warmup_epochs,
            total_epochs=total_epochs, schedule=schedule, milestones=tuple(milestones),
            gamma=gamma)
        _check(**self.config)  # fail at construction, not at step 10,000

    def lr(self, position: int) -> float:
        return lr_at(position, _checked=True, **self.config)

    def apply(self, optimizer: Any, position: int) -> float:
        """Set `lr` in every param group for the step that reaches `position`; return the LR.

        A group may carry `lr_scale` (e.g. a head trained at 10x); it multiplies the LR.
        Call before `optimizer.step()` for that step.
        """
        lr = self.lr(position)
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        return lr

"""Learning-rate schedule: linear warmup to the peak LR, then cosine / step / constant.

The math is pure functions of the optimizer step (no torch), so it is tested with plain
numbers and a resumed run gets the same LR from the step counter alone. The peak LR is the
spec's `scaled_lr` (the linear scaling rule, `spec.schema.scale_lr`).

`step` is always the OPTIMIZER step index (one per `optimizer.step()`, i.e. after gradient
accumulation), counted from 0. Epoch quantities are turned into steps with
`epochs * steps_per_epoch` rounded half up, so fractional epochs (warmup_epochs=0.5) work.

Warmup (Goyal et al. 2017, "Accurate, Large Minibatch SGD", sec. 2.2): the LR ramps linearly
from `peak_lr * warmup_start_factor` at step 0 to exactly `peak_lr` at step `warmup_steps`.
The default start factor is `1 / warmup_steps` (W): step 0 trains at `peak / W`, small but
not zero (an LR of 0 would waste the first step), and each step adds `peak * (1 - 1/W) / W`.
Goyal's own choice -- start from the single-worker LR -- is `warmup_start_factor = 1 / k` for
k workers (or `base_lr / peak_lr`); pass it explicitly if you want that. The decay phase starts at
`warmup_steps` with value `peak_lr`, so the curve is continuous at the boundary.
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Sequence

__all__ = ["SCHEDULES", "lr_at", "LrSchedule"]

SCHEDULES = ("cosine", "step", "constant")


def _steps(epochs: float, steps_per_epoch: int) -> int:
    # Half up, not round()'s half-to-even: 1.25 epochs x 10 steps is step 13, predictably.
    return math.floor(epochs * steps_per_epoch + 0.5)


def _check(peak_lr: float, steps_per_epoch: int, warmup_epochs: float, total_epochs: float,
           schedule: str, milestones: Sequence[float], gamma: float,
           warmup_start_factor: float | None) -> None:
    """Every rule with the values that broke it; called once per LrSchedule, and by lr_at."""
    if schedule not in SCHEDULES:
        raise ValueError(f"schedule must be one of {SCHEDULES}, got {schedule!r}")
    if not peak_lr > 0:
        raise ValueError(f"peak_lr must be > 0, got {peak_lr!r}")
    if isinstance(steps_per_epoch, bool) or not isinstance(steps_per_epoch, int) \
            or steps_per_epoch < 1:
        raise ValueError(f"steps_per_epoch must be a positive integer (optimizer steps, after "
                         f"accumulation), got {steps_per_epoch!r}")
    if not 0 <= warmup_epochs <= total_epochs:
        raise ValueError(f"need 0 <= warmup_epochs <= total_epochs, got warmup_epochs="
                         f"{warmup_epochs!r}, total_epochs={total_epochs!r}")
    if not total_epochs > 0:
        raise ValueError(f"total_epochs must be > 0, got {total_epochs!r}")
    if warmup_start_factor is not None and not 0 < warmup_start_factor <= 1:
        raise ValueError(f"warmup_start_factor must be in (0, 1], got {warmup_start_factor!r}")
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


def lr_at(step: int, *, peak_lr: float, steps_per_epoch: int, warmup_epochs: float,
          total_epochs: float, schedule: str, milestones: Sequence[float] = (),
          gamma: float = 0.1, warmup_start_factor: float | None = None,
          _checked: bool = False) -> float:
    """LR for optimizer step `step` (0-based). See the module docstring for the shape.

    cosine: `peak * 0.5 * (1 + cos(pi * p))`, p going 0 -> 1 from warmup end to total end;
      0 at and after the last step of `total_epochs`.
    step: `peak * gamma ** (number of milestones reached)`; milestones are epochs.
    constant: `peak` after warmup.
    """
    if not _checked:
        _check(peak_lr, steps_per_epoch, warmup_epochs, total_epochs, schedule, milestones,
               gamma, warmup_start_factor)
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step must be an integer >= 0, got {step!r}")
    warmup_steps = _steps(warmup_epochs, steps_per_epoch)
    if step < warmup_steps:
        start = 1.0 / warmup_steps if warmup_start_factor is None else warmup_start_factor
        return peak_lr * (start + (1.0 - start) * step / warmup_steps)
    if schedule == "constant":
        return peak_lr
    if schedule == "step":
        reached = sum(step >= _steps(m, steps_per_epoch) for m in milestones)
        return peak_lr * gamma ** reached
    decay_steps = _steps(total_epochs, steps_per_epoch) - warmup_steps
    if decay_steps <= 0:  # all warmup (warmup_epochs == total_epochs): nothing to decay over
        return 0.0
    progress = min(1.0, (step - warmup_steps) / decay_steps)
    return peak_lr * 0.5 * (1.0 + math.cos(math.pi * progress))


class LrSchedule:
    """`lr_at` with its settings bound, plus the hooks the trainer and checkpoints use.

    The LR is a function of the step, so the only state is the last applied step; it is
    saved anyway so a checkpoint records it and a resume can check it against the trainer's.
    """

    def __init__(self, *, peak_lr: float, steps_per_epoch: int, warmup_epochs: float,
                 total_epochs: float, schedule: str = "cosine",
                 milestones: Iterable[float] = (), gamma: float = 0.1,
                 warmup_start_factor: float | None = None) -> None:
        self.config: dict[str, Any] = dict(
            peak_lr=peak_lr, steps_per_epoch=steps_per_epoch, warmup_epochs=warmup_epochs,
            total_epochs=total_epochs, schedule=schedule, milestones=tuple(milestones),
            gamma=gamma, warmup_start_factor=warmup_start_factor)
        _check(**self.config)  # fail at construction, not at step 10,000
        self.last_step = -1

    @property
    def warmup_steps(self) -> int:
        return _steps(self.config["warmup_epochs"], self.config["steps_per_epoch"])

    @property
    def total_steps(self) -> int:
        return _steps(self.config["total_epochs"], self.config["steps_per_epoch"])

    def lr(self, step: int) -> float:
        return lr_at(step, _checked=True, **self.config)

    def apply(self, optimizer: Any, step: int) -> float:
        """Set `lr` in every param group for optimizer step `step`; return the LR.

        A group may carry `lr_scale` (e.g. a head trained at 10x); it multiplies the LR.
        Call before `optimizer.step()` for that step.
        """
        lr = self.lr(step)
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_scale", 1.0)
        self.last_step = step
        return lr

    def state_dict(self) -> dict[str, Any]:
        return {"last_step": self.last_step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_step = int(state["last_step"])

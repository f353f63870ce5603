"""An fp16 loss scale that every rank agrees on.

GradScaler decides per process whether a step overflowed; in a pipeline one stage can overflow
while the others do not, and a step must be skipped everywhere or nowhere. Here each rank
reports (sum of squared gradients, non-finite flag) in one all-reduce that also yields the
global gradient norm for clipping; the step is skipped on every rank if any had an inf/nan.
"""

from __future__ import annotations

import math

import torch

from hpc_train.spec.schema import DEFAULT_INIT_SCALE


class AgreedLossScaler:
    def __init__(self, mode: str = "fp32", loss_scale: str | float = "dynamic",
                 init_scale: float = DEFAULT_INIT_SCALE, growth_interval: int = 2000):
        self.enabled = mode == "fp16"
        self.dynamic = loss_scale == "dynamic"
        start = init_scale if self.dynamic else float(loss_scale)
        self.scale = start if self.enabled else 1.0
        self.growth_interval = growth_interval
        self.good_steps = 0

    @property
    def loss_scale(self) -> float | None:
        return self.scale if self.enabled else None

    def unscale_and_measure(self, params: list[torch.nn.Parameter]) -> torch.Tensor:
        """Divide gradients by the scale; return [sum of squares, non-finite count] (float64)."""
        grads = [p.grad for p in params if p.grad is not None]
        device = grads[0].device if grads else torch.device("cpu")
        squares = torch.zeros((), dtype=torch.float64, device=device)
        for grad in grads:   # summed on the device: one host sync per step, not one per tensor
            if self.enabled:
                grad.mul_(1.0 / self.scale)
            squares += grad.detach().double().pow(2).sum()
        value = squares.item()
        bad = 0.0 if math.isfinite(value) else 1.0
        return torch.tensor([0.0 if bad else value, bad], dtype=torch.float64)

    def update(self, overflow: bool) -> None:
        """Halve on overflow; double after `growth_interval` good steps (dynamic scale only)."""
        if not (self.enabled and self.dynamic):
            return
        if overflow:
            self.scale, self.good_steps = max(self.scale / 2, 1.0), 0
            return
        self.good_steps += 1
        if self.good_steps == self.growth_interval:
            self.scale, self.good_steps = self.scale * 2, 0

    def state_dict(self) -> dict:
        return {"scale": self.scale, "good_steps": self.good_steps}

    def load_state_dict(self, state: dict) -> None:
        self.scale, self.good_steps = float(state["scale"]), int(state["good_steps"])

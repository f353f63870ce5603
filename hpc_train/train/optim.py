"""The optimizer named in the spec, at the linearly scaled learning rate."""

from __future__ import annotations

import torch


def build_optimizer(optim_spec, params, lr: float) -> torch.optim.Optimizer:
    if optim_spec.name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=optim_spec.momentum,
                               weight_decay=optim_spec.weight_decay, nesterov=optim_spec.nesterov)
    if optim_spec.name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=(optim_spec.momentum, 0.999),
                                 weight_decay=optim_spec.weight_decay)
    raise ValueError(f"unknown optimizer {optim_spec.name!r}")

"""The optimizer named in the spec (ours, or one named by reference), at the linearly scaled
learning rate."""

from __future__ import annotations

import torch


def build_optimizer(optim_spec, params, lr: float) -> torch.optim.Optimizer:
    if optim_spec.name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=optim_spec.momentum,
                               weight_decay=optim_spec.weight_decay, nesterov=optim_spec.nesterov)
    if optim_spec.name == "adamw":
        return torch.optim.AdamW(params, lr=lr, betas=(optim_spec.momentum, 0.999),
                                 weight_decay=optim_spec.weight_decay)
    return _own_optimizer(optim_spec, params, lr)


def _own_optimizer(optim_spec, params, lr: float) -> torch.optim.Optimizer:
    """An optimizer named by reference (torch.optim:RAdam, the user's own): called with the
    parameters, the scaled LR and optim.options. Its LR is set by our schedule every step, as
    for ours; momentum, weight_decay and nesterov of the spec are sgd's and adamw's (pass the
    reference's own in optim.options)."""
    from hpc_train.usercode import UserCodeError, call

    optimizer = call(optim_spec.name, "an optimizer", params, lr=lr, **optim_spec.options)
    if not isinstance(optimizer, torch.optim.Optimizer):
        raise UserCodeError(f"optim.name {optim_spec.name} returned {type(optimizer).__name__}, "
                            "not a torch.optim.Optimizer")
    return optimizer

"""The lab's own loss and metrics: plain torch, nothing of hpc_train.

Named in a spec as `task.name: lab_cnn.steps:train_step` (and `task.eval:
lab_cnn.steps:eval_step`), they replace the cross-entropy of `task: classification`; mixed
precision, accumulation, clipping, the loss scaler and the LR schedule stay the trainer's.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def train_step(model, batch):
    """The loss of one batch, with the figures to log beside it: (loss, {name: number})."""
    images, labels = batch
    logits = model(images)
    loss = F.cross_entropy(logits, labels)
    return loss, {"top1": (logits.argmax(1) == labels).float().mean().item()}


def eval_step(model, batch):
    """A validation batch's loss, accuracy and mean confidence; called without gradients."""
    images, labels = batch
    logits = model(images)
    correct = (logits.argmax(1) == labels).float()
    return F.cross_entropy(logits, labels), {"top1": correct.mean().item(),
                                             "confidence": torch.softmax(logits, 1).amax(1).mean().item()}

"""What a checkpoint holds for the data-parallel trainer, and putting it back.

Replicated (rank 0 writes it once): model weights, optimizer, loss scaler, LR schedule, step,
the resolved spec and its hash. Per rank: RNG streams and the model's buffers (BatchNorm running
statistics differ per rank under Horovod). Everything is tensors and plain Python data, so
`torch.load(weights_only=True)` reads it.
"""

from __future__ import annotations

import torch

from hpc_train.checkpoint.rng import capture_rng, restore_rng
from hpc_train.errors import CheckpointMismatch
from hpc_train.spec.diff import changed_keys


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)  # DDP keeps the real model in .module


def capture_progress(trainer) -> dict:
    """Where training stands, the same on every rank: every trainer saves this."""
    return {
        "precision": trainer.precision.state_dict(),
        "schedule": trainer.schedule.state_dict(),
        "step": trainer.step,
        # Derived from the step, saved to refuse a resume whose data or data settings changed.
        "sampler": trainer.sampler.state_dict(
            trainer.consumed_in_epoch(trainer.step % trainer.steps_per_epoch)),
        "spec": trainer.spec_dict,
    }


def capture(trainer) -> tuple[dict, dict]:
    model = unwrap(trainer.model)
    replicated = {"model": model.state_dict(), "optimizer": trainer.optimizer.state_dict(),
                  **capture_progress(trainer)}
    per_rank = {"rng": capture_rng(), "buffers": dict(model.named_buffers()), "rank": trainer.identity.rank}
    return replicated, per_rank


def check_spec(saved_spec: dict, current_spec: dict, allowed: bool) -> list[str]:
    changed = changed_keys(saved_spec, current_spec)
    if changed and not allowed:
        raise CheckpointMismatch(
            "the run's spec changed since its checkpoint: " + ", ".join(changed) + ". Resume with "
            "`python -m hpc_train resume RUN_DIR --allow-spec-change` to accept, or restore spec.yaml")
    return changed


def restore_progress(trainer, replicated: dict) -> None:
    trainer.precision.load_state_dict(replicated["precision"])
    trainer.schedule.load_state_dict(replicated["schedule"])
    trainer.step = int(replicated["step"])
    trainer.sampler.load_state_dict(replicated["sampler"])


def restore_streams(trainer, per_rank: dict | None) -> None:
    """This rank's RNG streams; with a different world size it has none saved: derive fresh ones."""
    if per_rank is None:
        torch.manual_seed(trainer.spec.run.seed + 7919 * trainer.identity.rank + trainer.step)
    else:
        restore_rng(per_rank["rng"])


def restore(trainer, replicated: dict, per_rank: dict | None) -> None:
    model = unwrap(trainer.model)
    model.load_state_dict(replicated["model"])
    trainer.optimizer.load_state_dict(replicated["optimizer"])
    restore_progress(trainer, replicated)
    restore_streams(trainer, per_rank)
    if per_rank is None:
        return
    buffers = dict(model.named_buffers())
    for name, value in per_rank["buffers"].items():
        buffers[name].copy_(value)

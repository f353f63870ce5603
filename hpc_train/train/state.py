"""What a checkpoint holds: a named mapping of stateful components, and putting it back.

Each component has `state_dict()` / `load_state_dict()` (torchtitan's `Stateful`); the trainer's
parts name theirs, and `CheckpointedState` says where each one lives on disk:

- replicated (rank 0 writes `replicated.pt`): the same on every rank (weights, optimizer, loss
  scaler, LR schedule, progress, sampler position); the checkpointing adds the resolved spec.
- per rank (`rank-NNNNN.pt`): RNG streams, BatchNorm buffers (they differ per rank under Horovod);
  absent after a world-size change, when components that can derive a fresh state do so.
- named files (`stage-NNNNN.pt`): a pipeline stage's weights and optimizer, written by replica 0
  of that stage and read by every rank of it.

Everything is tensors and plain Python data, so `torch.load(weights_only=True)` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import torch

from hpc_train.checkpoint.rng import capture_rng, restore_rng
from hpc_train.errors import CheckpointMismatch
from hpc_train.spec.diff import changed_keys


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)  # DDP keeps the real model in .module


@dataclass
class Progress:
    """Where training stands: optimizer steps done, the same on every rank."""

    step: int = 0

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])


class SamplerPosition:
    """The training sampler's place, derived from the progress; saved so that a resume with other
    data or data settings is refused (the sampler checks), restored to go on mid-epoch."""

    def __init__(self, sampler, progress: Progress, consumed_after: Callable[[int], int]):
        self.sampler, self.progress, self.consumed_after = sampler, progress, consumed_after

    def state_dict(self) -> dict[str, Any]:
        return self.sampler.state_dict(self.consumed_after(self.progress.step))

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.sampler.load_state_dict(state)


class ModelWeights:
    """A whole model's state (DDP's wrapper taken off)."""

    def __init__(self, model: torch.nn.Module):
        self.model = unwrap(model)

    def state_dict(self) -> dict[str, Any]:
        return self.model.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.model.load_state_dict(state)


class ModelBuffers:
    """This rank's model buffers (BatchNorm running statistics differ per rank under Horovod)."""

    def __init__(self, model: torch.nn.Module):
        self.model = unwrap(model)

    def state_dict(self) -> dict[str, Any]:
        return dict(self.model.named_buffers())

    def load_state_dict(self, state: dict[str, Any]) -> None:
        buffers = dict(self.model.named_buffers())
        for name, value in state.items():
            buffers[name].copy_(value)


class RngStreams:
    """Every random stream of this rank; with a different world size none is saved for it, and a
    fresh one is derived from (seed, rank, step)."""

    def __init__(self, seed: int, rank: int, progress: Progress):
        self.seed, self.rank, self.progress = seed, rank, progress

    def state_dict(self) -> dict[str, Any]:
        return capture_rng()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        restore_rng(state)

    def fresh(self) -> None:
        torch.manual_seed(self.seed + 7919 * self.rank + self.progress.step)


@dataclass
class CheckpointedState:
    """The named components of a checkpoint and the file each belongs to."""

    replicated: dict[str, Stateful]
    per_rank: dict[str, Stateful] = field(default_factory=dict)
    files: dict[str, dict[str, Stateful]] = field(default_factory=dict)
    writes_files: bool = True      # whether this rank writes `files` (one writer per file)

    def capture(self) -> tuple[dict, dict, dict]:
        """(replicated, this rank's own, named extra files this rank writes) as plain data."""
        files = {name: _captured(parts) for name, parts in self.files.items()} if self.writes_files else {}
        return _captured(self.replicated), _captured(self.per_rank), files

    def load(self, replicated: dict, per_rank: dict | None, load_file: Callable[[str], dict]) -> None:
        """Replicated components first (in mapping order), then the named files, then this
        rank's own (or fresh ones where the checkpoint has none for this rank)."""
        for name, component in self.replicated.items():
            component.load_state_dict(replicated[name])
        for file_name, parts in self.files.items():
            saved = load_file(file_name)
            for name, component in parts.items():
                component.load_state_dict(saved[name])
        for name, component in self.per_rank.items():
            if per_rank is not None:
                component.load_state_dict(per_rank[name])
            elif hasattr(component, "fresh"):
                component.fresh()


def _captured(components: dict[str, Stateful]) -> dict[str, Any]:
    return {name: component.state_dict() for name, component in components.items()}


def check_spec(saved_spec: dict, current_spec: dict, allowed: bool) -> list[str]:
    changed = changed_keys(saved_spec, current_spec)
    if changed and not allowed:
        raise CheckpointMismatch(
            "the run's spec changed since its checkpoint: " + ", ".join(changed) + ". Resume with "
            "`python -m hpc_train resume RUN_DIR --allow-spec-change` to accept, or restore spec.yaml")
    return changed

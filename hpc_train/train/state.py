"""What a checkpoint holds: a named mapping of stateful components, and putting it back.

Each component has `state_dict()` / `load_state_dict()` (torchtitan's `Stateful`); the trainer's
parts name theirs, and `CheckpointedState` says where each one lives on disk:

- replicated (rank 0 writes `replicated.pt`): the same on every rank (weights, optimizer, loss
  scaler, the position in samples, the data the sampler orders); the checkpointing adds the
  run's resolved spec (as spec.yaml holds it, at any node count of a range). The LR follows
  from the position and the spec.
- per rank (`rank-NNNNN.pt`): RNG streams, BatchNorm buffers (they differ per rank under Horovod);
  absent after a world-size change, when components that can derive a fresh state do so.
- named files (`stage-NNNNN.pt`): a pipeline stage's weights and optimizer, written by replica 0
  of that stage and read by every rank of it.
- sharded (`sharded/`): state that every rank writes itself, in a collective, in its library's
  own format: fsdp's model and optimizer by torch.distributed.checkpoint, read at any world size
  (checkpoint/sharded.py; a replicated job reads such a checkpoint into its whole model, and
  fsdp a replicated one); DeepSpeed's engine, each rank its shard (parallel/deepspeed_engine.py).

Everything is tensors and plain Python data, so `torch.load(weights_only=True)` reads it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Protocol

import torch

from hpc_train.checkpoint.rng import capture_rng, restore_rng
from hpc_train.errors import CheckpointMismatch, SpecError
from hpc_train.spec import spec_from_dict, spec_to_dict
from hpc_train.spec.diff import changed_keys


class Stateful(Protocol):
    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


class ShardedState(Protocol):
    """Components every rank saves and loads together, as one directory (a collective)."""

    names: tuple[str, ...]   # what a replicated checkpoint calls the components it holds
    writes: bool             # saved this way by this job (else only read, from a sharded save)
    format: str              # the library's format ("dcp", "deepspeed"): the only one it reads

    def save(self, directory: Path, midway: Callable[[], None] = lambda: None) -> None:
        """This rank's part into `directory`; `midway` is called each time some of its files
        are written and the part is not yet complete (fault injection's hook)."""

    def load(self, directory: Path) -> None: ...

    def load_replicated(self, replicated: dict[str, Any]) -> None: ...


def unwrap(model: torch.nn.Module) -> torch.nn.Module:
    return getattr(model, "module", model)  # DDP keeps the real model in .module


@dataclass
class Progress:
    """Where training stands, the same on every rank: the position in samples, and the steps.

    `epoch` and `consumed` (samples of that epoch's order trained) place the run in the data
    at any world size; `samples` counts every sample trained; `step` counts optimizer steps,
    whatever their size, and names the checkpoints. `samples_per_step` and `world_size` are this
    segment's global batch and ranks, saved with the position; `loaded` is what the checkpoint
    resumed from said of them. `from_step` derives (epoch, consumed, samples) for a checkpoint
    from before samples were counted (it held the step alone), at its own world size.
    """

    samples_per_step: int
    world_size: int
    from_step: Callable[[int], tuple[int, int, int]] = field(repr=False, compare=False)
    step: int = 0
    epoch: int = 0
    consumed: int = 0
    samples: int = 0
    loaded: dict[str, Any] = field(default_factory=dict)

    def advance(self) -> None:
        """One optimizer step of this segment's global batch trained."""
        self.step += 1
        self.consumed += self.samples_per_step
        self.samples += self.samples_per_step

    def next_epoch(self) -> None:
        self.epoch, self.consumed = self.epoch + 1, 0

    def position(self, epoch_samples: int) -> int:
        """The schedule's coordinate: whole epochs as the data set's size, plus this epoch's."""
        return self.epoch * epoch_samples + self.consumed

    def state_dict(self) -> dict[str, Any]:
        return {"step": self.step, "epoch": self.epoch, "consumed": self.consumed,
                "samples": self.samples, "samples_per_step": self.samples_per_step,
                "world_size": self.world_size}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.step = int(state["step"])
        if "samples" in state:
            self.epoch, self.consumed, self.samples = (int(state[k]) for k in
                                                       ("epoch", "consumed", "samples"))
        else:
            self.epoch, self.consumed, self.samples = self.from_step(self.step)
        self.loaded = dict(state)


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
    sharded: ShardedState | None = None   # saved by every rank into `sharded/` when it writes

    @property
    def writes_sharded(self) -> str | None:
        """The format of the sharded part this job saves; None when it saves none."""
        return self.sharded.format if self.sharded is not None and self.sharded.writes else None

    def save_sharded(self, directory: Path, midway: Callable[[], None] = lambda: None) -> None:
        """Every rank, in the training thread (a collective): the sharded part into `directory`
        (`midway`: as ShardedState.save's)."""
        if self.writes_sharded:
            self.sharded.save(directory, midway)

    def capture(self) -> tuple[dict, dict, dict]:
        """(replicated, this rank's own, named extra files this rank writes) as plain data."""
        files = {name: _captured(parts) for name, parts in self.files.items()} if self.writes_files else {}
        return _captured(self.replicated), _captured(self.per_rank), files

    def load(self, replicated: dict, per_rank: dict | None, load_file: Callable[[str], dict],
             sharded: Path | None = None, sharded_format: str | None = None) -> None:
        """The replicated components (in mapping order; those the checkpoint's sharded part
        holds are skipped), then the sharded part (the checkpoint's `sharded` directory, or a
        sharded job's components from a replicated checkpoint), then the named files, then this
        rank's own (or fresh ones where the checkpoint has none for this rank). Replicated
        first: a component there may refuse the checkpoint before a library reads its shards.
        sharded_format: what the checkpoint says its sharded part is in (its meta)."""
        skipped = self.sharded.names if sharded is not None and self.sharded is not None else ()
        for name, component in self.replicated.items():
            if name not in skipped:
                component.load_state_dict(replicated[name])
        self._load_sharded(replicated, sharded, sharded_format)
        for file_name, parts in self.files.items():
            saved = load_file(file_name)
            for name, component in parts.items():
                component.load_state_dict(saved[name])
        for name, component in self.per_rank.items():
            if per_rank is not None and (name in per_rank or not hasattr(component, "fresh")):
                component.load_state_dict(per_rank[name])
            elif hasattr(component, "fresh"):   # none saved for this rank, or by that run
                component.fresh()

    def _load_sharded(self, replicated: dict, directory: Path | None, saved: str | None) -> None:
        """Load the sharded part, if either side has one. A part in another library's format
        (fsdp's and DeepSpeed's) is a refusal, not a damaged checkpoint to set aside."""
        if directory is None:
            if self.sharded is not None and self.sharded.writes:
                self.sharded.load_replicated(replicated)
            return
        reads = self.sharded.format if self.sharded is not None else None
        if saved != reads:
            raise CheckpointMismatch(
                f"the checkpoint's model is sharded in {saved or 'an unknown'} format ({directory}) "
                f"and this job reads {reads or 'no sharded part (a pipeline)'}: resume with the "
                "parallel.backend it was saved with (fsdp: dcp, deepspeed: deepspeed), or ddp "
                "without stages for an fsdp one")
        self.sharded.load(directory)


def _captured(components: dict[str, Stateful]) -> dict[str, Any]:
    return {name: component.state_dict() for name, component in components.items()}


def check_spec(saved_spec: dict, current_spec: dict, allowed: bool) -> list[str]:
    """The keys changed since the checkpoint; raises unless `allowed`. A key added to the
    schema since the checkpoint counts as its default (a newer version reads old runs)."""
    changed = changed_keys(_with_defaults(saved_spec), _with_defaults(current_spec))
    if changed and not allowed:
        raise CheckpointMismatch(
            "the run's spec changed since its checkpoint: " + ", ".join(changed) + ". Resume with "
            "`python -m hpc_train resume RUN_DIR --allow-spec-change` to accept, or restore spec.yaml")
    return changed


def _with_defaults(spec: dict) -> dict:
    try:
        return spec_to_dict(spec_from_dict(spec))
    except SpecError:       # a spec this version no longer accepts: compared as it was saved
        return spec

"""A model and its optimizer saved by every rank in parallel through torch.distributed.checkpoint.

DCP writes each rank's shards to its own files plus one `.metadata` (by rank 0, after every rank
has written), and reads them back at any world size: a load plans which saved pieces make each
of this rank's tensors, so a checkpoint saved at 2 ranks loads at 1 or 4. It runs inside our
save protocol (checkpoint/manager.py): the files go to the `sharded/` subdirectory of the step's
temporary directory before this rank's own file (which says "this rank is done"), and the
COMPLETE marker comes after every rank's. DCP's FileSystemWriter fsyncs what it writes.

The same class reads both ways across the replicated format (DDP, Horovod: the whole model and
optimizer in `replicated.pt`): a replicated checkpoint loads into a sharded model (the full state
is sharded on load), and a replicated job reads a sharded checkpoint whole into its model. DCP
names the optimizer's parameters by their model names, `optimizer.state_dict()` numbers them:
`_renamed` turns one into the other.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

import torch

from hpc_train.errors import CheckpointMismatch


class ShardedModelState:
    """`model` and `optimizer` as one DCP checkpoint. `writes`: whether this job saves them so
    (a sharded job); a replicated job keeps its replicated save and only reads sharded ones."""

    names = ("model", "optimizer")   # what a replicated checkpoint calls them
    format = "dcp"

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, writes: bool = True):
        self.model, self.optimizer, self.writes = model, optimizer, writes

    def _state(self) -> dict[str, Any]:
        from torch.distributed.checkpoint.state_dict import get_state_dict

        model, optimizer = get_state_dict(self.model, self.optimizer)
        return {"model": model, "optimizer": optimizer}

    def _put(self, state: dict[str, Any], full: bool = False) -> None:
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_state_dict

        set_state_dict(self.model, self.optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optimizer"],
                       options=StateDictOptions(full_state_dict=full))

    def save(self, directory: Path, midway: Callable[[], None] = lambda: None) -> None:
        """Every rank, at the same step (a collective): its shards, then rank 0 the metadata;
        `midway` runs once this rank's shards are written, before the metadata."""
        import torch.distributed.checkpoint as dcp

        dcp.save(self._state(), storage_writer=_writer(directory, midway))

    def load(self, directory: Path) -> None:
        """Every rank: a sharded job (a collective) the pieces of its own tensors, at any saved
        world size; a replicated job the whole state, read in this process alone (DCP's
        state-dict helpers would step a fresh optimizer, Horovod's wrapper included)."""
        import torch.distributed.checkpoint as dcp

        if not self.writes:
            whole = whole_state(directory)
            self.model.load_state_dict(whole["model"])
            self.optimizer.load_state_dict(
                _renamed(whole["optimizer"], {n: i for i, n in enumerate(self._order())}))
            return
        state = self._state()
        dcp.load(state, checkpoint_id=str(directory))
        self._put(state)

    def load_replicated(self, replicated: dict[str, Any]) -> None:
        """A replicated checkpoint's whole model and optimizer (every rank read them), sharded
        as this model is; the optimizer's parameter numbers become names first."""
        if not all(name in replicated for name in self.names):
            raise CheckpointMismatch(
                "the checkpoint holds neither a sharded part nor a whole model and optimizer (a "
                "pipeline checkpoint?): resume it with the parallel settings it was saved with")
        optimizer = _renamed(replicated["optimizer"], dict(enumerate(self._order())))
        self._put({"model": replicated["model"], "optimizer": optimizer}, full=True)

    def _order(self) -> list[str]:
        """The parameters' names in the order of the optimizer's groups: a replicated job's
        `optimizer.state_dict()` numbers them so, DCP's names them. The saving job built the
        same groups of the same model, so its number i is this optimizer's i-th parameter."""
        name_of = {id(param): name for name, param in self.model.named_parameters()}
        return [name_of[id(p)] for group in self.optimizer.param_groups for p in group["params"]]


def _writer(directory: Path, midway: Callable[[], None]):
    """DCP's file-system writer, calling `midway` after this rank's data files."""
    from torch.distributed.checkpoint import FileSystemWriter

    class Writer(FileSystemWriter):
        def write_data(self, plan, planner):
            written = super().write_data(plan, planner)
            written.wait()
            midway()
            return written

    return Writer(str(directory))


def whole_state(directory: Path) -> dict[str, Any]:
    """A sharded checkpoint's whole state ({"model": ..., "optimizer": ...}) in one process,
    without a process group: for a replicated job, `evaluate` and `export`. DCP's own converter
    writes a torch.save file; it goes to a temporary directory and is read back."""
    import tempfile

    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    with tempfile.TemporaryDirectory(prefix="hpc-train-dcp-") as scratch:
        whole = Path(scratch) / "whole.pt"
        dcp_to_torch_save(str(directory), str(whole))
        return torch.load(whole, map_location="cpu", weights_only=True)


def _renamed(saved: dict[str, Any], rename: dict) -> dict[str, Any]:
    """An optimizer state dict with its parameter keys renamed (numbers <-> names)."""
    groups = [{**group, "params": [rename[key] for key in group["params"]]}
              for group in saved["param_groups"]]
    return {"state": {rename[key]: state for key, state in saved["state"].items()},
            "param_groups": groups}

"""DeepSpeed's ZeRO engine on the ranks our launcher started, and its own sharded checkpoint.

Every `deepspeed` call of the package lives here (train/deepspeed_parts.py drives the engine
through this module), imported inside functions: importing this module costs nothing, and the
login node never imports DeepSpeed.

Rank identity comes from our one function (launch/identity.py): DeepSpeed reads RANK,
WORLD_SIZE and LOCAL_RANK from the environment, so they are set from it; the torch.distributed
world is ours (`init_torch_distributed`: Gloo on CPUs, NCCL on GPUs, MASTER_ADDR:MASTER_PORT
set by the driver), which DeepSpeed then joins instead of making its own.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from hpc_train.errors import CheckpointError, CheckpointMismatch
from hpc_train.launch.identity import RankInfo
from hpc_train.parallel.data_parallel import init_torch_distributed

ENGINE_TAG = "zero"     # DeepSpeed's tag (its subdirectory) inside our step directory


def identity_env(identity: RankInfo, device: torch.device) -> dict[str, str]:
    """The variables DeepSpeed reads for who this rank is, and which accelerator it drives."""
    return {"RANK": str(identity.rank), "WORLD_SIZE": str(identity.size),
            "LOCAL_RANK": str(identity.local_rank), "LOCAL_WORLD_SIZE": str(identity.local_size),
            "DS_ACCELERATOR": "cpu" if device.type == "cpu" else "cuda"}


def start_engine(model: torch.nn.Module, optimizer: torch.optim.Optimizer, config: dict[str, Any],
                 identity: RankInfo, device: torch.device):
    """`deepspeed.initialize` of `model` with our `optimizer` and `config` (deepspeed_config.
    engine_config), in our torch.distributed world: the engine, whose `optimizer` is the ZeRO
    optimizer wrapping ours (its param_groups are ours: the loop's LR reaches them)."""
    os.environ.update(identity_env(identity, device))
    # DeepSpeed builds its CPU communication op (ninja) at the first init in an environment, into
    # torch's one cache per user unless told otherwise: two Python environments (two checkouts,
    # two venvs) then rebuild it in turn, and one build interrupted the other's (seen here). One
    # folder per environment; a user's own TORCH_EXTENSIONS_DIR wins.
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(sys.prefix) / "torch-extensions"))
    init_torch_distributed(identity.rank, identity.size, device)
    import deepspeed

    deepspeed.init_distributed(dist_backend="gloo" if device.type == "cpu" else "nccl",
                               auto_mpi_discovery=False)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=config)
    return engine


def whole_parameter(param: torch.nn.Parameter) -> torch.Tensor:
    """A copy of the whole of a parameter that ZeRO-3 partitions, gathered from every rank (a
    collective); the parameter is partitioned again after."""
    import deepspeed

    with deepspeed.zero.GatheredParameters([param]):
        return param.detach().clone()


class EngineShards:
    """The engine's state in DeepSpeed's own format (a checkpoint's sharded part, `ShardedState`
    of train/state.py): every rank writes its shard of the optimizer state (and of the
    parameters with ZeRO-3) in parallel, a collective; rank 0 the module. It stands for no
    replicated component, and loads from DeepSpeed's shards only."""

    names: tuple[str, ...] = ()
    writes = True
    format = "deepspeed"

    def __init__(self, engine):
        self.engine = engine

    def save(self, directory: Path, midway: Callable[[], None] = lambda: None) -> None:
        """Every rank (a collective) its files; `midway` runs after each of this rank's."""
        files = self.engine.checkpoint_engine
        write = files.save

        def save_then_midway(*args, **kwargs):
            write(*args, **kwargs)
            midway()

        files.save = save_then_midway      # this instance only, for this save
        try:
            self.engine.save_checkpoint(str(directory), tag=ENGINE_TAG, save_latest=False)
        finally:
            del files.save

    def load(self, directory: Path) -> None:
        # Our schedule sets the LR each step; the engine has no scheduler of its own.
        loaded, _ = self.engine.load_checkpoint(str(directory), tag=ENGINE_TAG,
                                                load_lr_scheduler_states=False)
        if loaded is None:
            raise CheckpointError(f"{directory} holds no DeepSpeed checkpoint tagged {ENGINE_TAG!r}")

    def load_replicated(self, replicated: dict) -> None:
        raise CheckpointMismatch(
            "this checkpoint holds a whole model (a ddp, horovod or pipeline run), and a DeepSpeed "
            "run loads DeepSpeed's own shards only. Fix: resume with the backend it was saved "
            "with, or start the DeepSpeed run afresh")

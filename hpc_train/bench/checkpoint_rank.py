"""One rank of `bench checkpoint --sharded`: `python -m hpc_train.bench.checkpoint_rank RUN_DIR`.

Every rank builds the fsdp parts of the GPT spec it is given (FsdpParts, as training does: the
model sharded block by block, AdamW) and trains one step, so the optimizer state exists. Then,
in alternating rounds, with a barrier before each clock starts:
  sharded  every rank writes its own part through CheckpointManager.write_sharded (DCP, then
           fsync), then the protocol's rank files and marker; `part` is this rank's own write,
           `complete` the whole save until the marker (every rank's part included)
  whole    the full state gathered to rank 0 once, beforehand (a replicated job has it there);
           rank 0 alone writes it: one torch.save + fsync (`bare_fsync`), and the checkpoint
           manager's save of one rank (`sync`); the others wait at the barrier
Each rank writes RUN_DIR/rank-N.json with its rounds' seconds.
"""

from __future__ import annotations

from pathlib import Path

import torch

from hpc_train.bench.checkpoint import bare_save
from hpc_train.bench.ranks import serve
from hpc_train.bench.state_memory import tensors_in
from hpc_train.checkpoint.manager import CheckpointManager
from hpc_train.launch.identity import RankInfo
from hpc_train.rundir import RunPaths
from hpc_train.spec import spec_from_dict
from hpc_train.train.fsdp_parts import FsdpParts
from hpc_train.train.timing import Stopwatch, time_it


def trained_parts(spec: dict, identity: RankInfo) -> FsdpParts:
    """The fsdp parts of `spec` (a spec's dict), after one step on random tokens."""
    job = spec_from_dict(spec)
    parts = FsdpParts(job, None, identity, torch.device("cpu"))
    torch.manual_seed(identity.rank)
    data = job.data
    tokens = torch.randint(0, data.vocab_size, (data.batch_size, data.seq_len + 1))
    parts.train_step([(tokens[:, :-1], tokens[:, 1:])])
    return parts


def whole_state(parts: FsdpParts) -> dict:
    """Model and optimizer gathered whole on rank 0, in host memory (a collective)."""
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model, optimizer = get_state_dict(parts.model, parts.optimizer, options=StateDictOptions(
        full_state_dict=True, cpu_offload=True))
    return {"model": model, "optimizer": optimizer}


def measure(settings: dict, identity: RankInfo, heartbeat) -> dict:
    parts = trained_parts(settings["spec"], identity)
    barrier, rank = parts.backend.barrier, identity.rank
    root = Path(settings["dir"])
    sharded = CheckpointManager(root / "sharded", rank, identity.size, barrier, keep_last=1)
    alone = CheckpointManager(root / "whole", 0, 1, lambda: None, keep_last=1)
    whole = whole_state(parts)
    bare_dir = root / "bare"
    bare_dir.mkdir(parents=True, exist_ok=True)
    save_part = parts.states().save_sharded
    times: dict[str, list[float]] = {"part": [], "complete": [], "bare_fsync": [], "sync": []}

    def sharded_round(step: int) -> None:
        sharded.prepare(step)
        barrier()
        watch = Stopwatch()
        sharded.write_sharded(step, save_part)
        times["part"].append(watch.seconds())
        sharded.write(step, {"step": step}, {"rank": rank}, {"spec_hash": "bench"})
        barrier()
        times["complete"].append(watch.seconds())

    def whole_round(step: int) -> None:
        barrier()
        if rank == 0:
            times["bare_fsync"].append(time_it(lambda: bare_save(whole, {}, bare_dir, fsync=True)))
            times["sync"].append(time_it(lambda: alone.save(step, whole, {}, {"spec_hash": "bench"})))
        barrier()

    for i in range(settings["rounds"]):
        order = (sharded_round, whole_round) if i % 2 == 0 else (whole_round, sharded_round)
        for run in order:
            run(i + 1)
            heartbeat.progress(step=i + 1)
    size = sum(t.numel() * t.element_size() for t in tensors_in(whole)) if rank == 0 else None
    parts.backend.shutdown()
    return {"rank": rank, "times": times, "state_bytes": size}


if __name__ == "__main__":
    serve(measure)

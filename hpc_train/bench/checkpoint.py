"""`bench checkpoint`: the cost of our atomic, multi-file save vs. a bare `torch.save`.

Both save the same state (a model, its SGD momentum, a scaler, RNG streams) to the same disk.
Ours adds what makes a kill harmless: a temporary directory, fsync of every file and of the
directory, a rename and a completion marker, and retention. Rounds alternate between the two
and the medians count, so load from other processes hits both alike.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import torch

from hpc_train.checkpoint.manager import CheckpointManager
from hpc_train.checkpoint.rng import capture_rng
from hpc_train.models import build_model


def training_state(model_name: str) -> tuple[dict, dict]:
    model = build_model(model_name, 1000)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # creates the momentum buffers: the optimizer state is as big as the model
    replicated = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                  "precision": torch.amp.GradScaler("cpu").state_dict(), "step": 1}
    return replicated, {"rng": capture_rng(), "buffers": dict(model.named_buffers())}


def bare_save(replicated: dict, per_rank: dict, directory: Path, fsync: bool = False) -> None:
    with open(directory / "bare.pt", "wb") as f:
        torch.save({"replicated": replicated, "per_rank": per_rank}, f)
        if fsync:  # what durability alone costs: the data really on disk, as ours ensures
            f.flush()
            os.fsync(f.fileno())


def measure(model_name: str, rounds: int, directory: Path) -> dict:
    replicated, per_rank = training_state(model_name)
    size = sum(t.numel() * t.element_size() for t in replicated["model"].values())
    manager = CheckpointManager(directory / "ours", 0, 1, barrier=lambda: None, keep_last=2)
    bare_dir = directory / "bare"
    bare_dir.mkdir(parents=True, exist_ok=True)
    times = {"ours": [], "bare": [], "bare_fsync": []}
    savers = {
        "ours": lambda i: manager.save(i + 1, replicated, per_rank, {"spec_hash": "bench"}),
        "bare": lambda i: bare_save(replicated, per_rank, bare_dir),
        "bare_fsync": lambda i: bare_save(replicated, per_rank, bare_dir, fsync=True),
    }
    for i in range(rounds):
        order = list(savers) if i % 2 == 0 else list(reversed(savers))
        for name in order:
            start = time.perf_counter()
            savers[name](i)
            times[name].append(time.perf_counter() - start)
    median = {name: statistics.median(values) for name, values in times.items()}
    return {"model": model_name, "model_mb": round(size / 2**20, 1), "rounds": rounds,
            "ours_s": round(median["ours"], 4), "bare_torch_save_s": round(median["bare"], 4),
            "bare_torch_save_fsync_s": round(median["bare_fsync"], 4),
            "ratio": round(median["ours"] / median["bare"], 3),
            "ratio_vs_fsync": round(median["ours"] / median["bare_fsync"], 3), "directory": str(directory)}


def main(args) -> int:
    base = Path(args.dir) if args.dir else None
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        result = measure(args.model, args.rounds, Path(tmp))
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print(f"checkpoint save, {result['model']} ({result['model_mb']} MB of weights, plus momentum), "
              f"median of {result['rounds']} alternating rounds on {os.path.dirname(result['directory'])}:")
        print(f"  ours (atomic, fsynced, marker): {result['ours_s']:.3f} s")
        print(f"  bare torch.save:                {result['bare_torch_save_s']:.3f} s")
        print(f"  bare torch.save + fsync:        {result['bare_torch_save_fsync_s']:.3f} s")
        print(f"  ratio ours / bare:              {result['ratio']:.2f}")
        print(f"  ratio ours / bare + fsync:      {result['ratio_vs_fsync']:.2f}")
    return 0

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


def bare_save(replicated: dict, per_rank: dict, directory: Path) -> None:
    torch.save({"replicated": replicated, "per_rank": per_rank}, directory / "bare.pt")


def measure(model_name: str, rounds: int, directory: Path) -> dict:
    replicated, per_rank = training_state(model_name)
    size = sum(t.numel() * t.element_size() for t in replicated["model"].values())
    manager = CheckpointManager(directory / "ours", 0, 1, barrier=lambda: None, keep_last=2)
    bare_dir = directory / "bare"
    bare_dir.mkdir(parents=True, exist_ok=True)
    ours, bare = [], []
    for i in range(rounds):
        for name in (("ours", "bare") if i % 2 == 0 else ("bare", "ours")):
            start = time.perf_counter()
            if name == "ours":
                manager.save(i + 1, replicated, per_rank, {"spec_hash": "bench"})
                ours.append(time.perf_counter() - start)
            else:
                bare_save(replicated, per_rank, bare_dir)
                bare.append(time.perf_counter() - start)
    ours_s, bare_s = statistics.median(ours), statistics.median(bare)
    return {"model": model_name, "model_mb": round(size / 2**20, 1), "rounds": rounds,
            "ours_s": round(ours_s, 4), "bare_torch_save_s": round(bare_s, 4),
            "ratio": round(ours_s / bare_s, 3), "directory": str(directory)}


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
        print(f"  ratio ours / bare:              {result['ratio']:.2f}")
    return 0

"""`bench checkpoint`: what a save costs the training loop, ours vs. a bare `torch.save`.

All save the same state (a model, its SGD momentum, a scaler, RNG streams) to the same disk.
Ours adds what makes a kill harmless: a temporary directory, fsync of every file and of the
directory, a rename and a completion marker, and retention. Measured, in alternating rounds
(medians count, so load from other processes hits all alike):
  sync     CheckpointManager.save: the loop waits for all of it (checkpoint.write: sync)
  async    what the loop waits for with checkpoint.write: async (the host snapshot, the
           temporary directory, starting the writer), and the total until the marker is written
  bare     one torch.save (page cache only), and one followed by fsync
  loop     a torch compute loop's rate while an async write runs, vs. without (the writer
           thread's share of the CPU and of the GIL)
--sharded: an fsdp GPT's model and AdamW state on --ranks ranks (bench/checkpoint_rank.py),
every rank writing its own part through CheckpointManager.write_sharded against rank 0 writing
the whole state alone (torch.save + fsync, and our sync save of one rank), alternating rounds.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import torch

from hpc_train.checkpoint.manager import CheckpointManager
from hpc_train.checkpoint.rng import capture_rng
from hpc_train.checkpoint.snapshot import HostSnapshot
from hpc_train.checkpoint.writer import BackgroundWriter
from hpc_train.models import build_model
from hpc_train.train.timing import Stopwatch, medians, time_it


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


class AsyncSaver:
    """The training thread's side of an async save, as train/checkpointing.py does it."""

    def __init__(self, directory: Path):
        self.manager = CheckpointManager(directory, 0, 1, barrier=lambda: None, keep_last=2)
        self.writer, self.snapshot = BackgroundWriter(timeout=600), HostSnapshot()

    def start(self, step: int, replicated: dict, per_rank: dict) -> None:
        """What the loop waits for: the host snapshot, the temporary directory, the writer started."""
        replicated, per_rank = self.snapshot.take((replicated, per_rank))
        self.manager.prepare(step)
        self.writer.submit(lambda: self.manager.write(step, replicated, per_rank, {"spec_hash": "bench"},
                                                      peers_done=lambda: None))

    def save(self, step: int, replicated: dict, per_rank: dict) -> tuple[float, float]:
        """(seconds the loop was blocked, seconds until the checkpoint was complete)."""
        watch = Stopwatch()
        self.start(step, replicated, per_rank)
        blocked = watch.seconds()
        self.writer.wait()
        return blocked, watch.seconds()


def loop_rate(seconds: float, during=None) -> float:
    """Iterations/s of a small single-threaded torch compute loop (a stand-in for training
    steps), for `seconds`, or for as long as `during` (a BackgroundWriter) is busy."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)          # one thread: less noise from other load on the machine
    a = torch.randn(192, 192)
    count, watch = 0, Stopwatch()
    try:
        while True:   # at least one iteration, so a write that ends at once still gives a rate
            a = torch.tanh(a @ a)
            count += 1
            if not (during.busy if during is not None else watch.seconds() < seconds):
                break
    finally:
        torch.set_num_threads(threads)
    return count / max(watch.seconds(), 1e-9)


def measure(model_name: str, rounds: int, directory: Path) -> dict:
    replicated, per_rank = training_state(model_name)
    size = sum(t.numel() * t.element_size() for t in replicated["model"].values())
    manager = CheckpointManager(directory / "ours", 0, 1, barrier=lambda: None, keep_last=2)
    saver = AsyncSaver(directory / "async")
    bare_dir = directory / "bare"
    bare_dir.mkdir(parents=True, exist_ok=True)
    times = {"sync": [], "async_blocked": [], "async_total": [], "bare": [], "bare_fsync": [],
             "loop_idle": [], "loop_writing": []}

    def async_round(i):
        blocked, total = saver.save(i + 1, replicated, per_rank)
        times["async_blocked"].append(blocked)
        times["async_total"].append(total)
        # The loop's rate while a write runs (started without waiting), and just before it
        # for as long (the same moment's load on the machine).
        times["loop_idle"].append(loop_rate(times["async_total"][-1]))
        saver.start(10_000 + i, replicated, per_rank)
        times["loop_writing"].append(loop_rate(0, during=saver.writer))
        saver.writer.wait()

    savers = {
        "sync": lambda i: times["sync"].append(time_it(lambda: manager.save(
            i + 1, replicated, per_rank, {"spec_hash": "bench"}))),
        "async": async_round,
        "bare": lambda i: times["bare"].append(time_it(lambda: bare_save(replicated, per_rank, bare_dir))),
        "bare_fsync": lambda i: times["bare_fsync"].append(time_it(
            lambda: bare_save(replicated, per_rank, bare_dir, fsync=True))),
    }
    for i in range(rounds):
        order = list(savers) if i % 2 == 0 else list(reversed(savers))
        for name in order:
            savers[name](i)
    median = medians(times)
    return {"model": model_name, "model_mb": round(size / 2**20, 1), "rounds": rounds,
            "sync_s": round(median["sync"], 4), "async_blocked_s": round(median["async_blocked"], 4),
            "async_total_s": round(median["async_total"], 4),
            "bare_torch_save_s": round(median["bare"], 4),
            "bare_torch_save_fsync_s": round(median["bare_fsync"], 4),
            "sync_vs_bare": round(median["sync"] / median["bare"], 3),
            "async_blocked_vs_bare": round(median["async_blocked"] / median["bare"], 3),
            "async_total_vs_bare": round(median["async_total"] / median["bare"], 3),
            "loop_rate_while_writing": round(median["loop_writing"] / median["loop_idle"], 3),
            "directory": str(directory)}


# The larger GPT of --gpt large: about 25 M parameters, so fixed costs do not make the figure.
LARGE_GPT = {"layers": 8, "dim": 512, "heads": 8}


def measure_sharded(spec_file: str, gpt: str, ranks: int, rounds: int, directory: Path) -> dict:
    """Rounds of the sharded save at `ranks` ranks against rank 0 saving the whole state."""
    from hpc_train.bench.ranks import run_here
    from hpc_train.spec import load_spec, spec_to_dict

    overrides = ["parallel.backend=fsdp", f"slurm.tasks_per_node={ranks}"]
    if gpt == "large":
        overrides.append("model.options={" + ", ".join(f"{k}: {v}" for k, v in LARGE_GPT.items()) + "}")
    spec = load_spec(spec_file, overrides)
    results = run_here("bench-checkpoint", "hpc_train.bench.checkpoint_rank",
                       {"spec": spec_to_dict(spec), "dir": str(directory), "rounds": rounds}, ranks,
                       spec={"launch": {"env": {"OMP_NUM_THREADS": "1"}, "stall_seconds": 900}})
    return sharded_report(results, spec_file, spec.model.options, rounds)


def sharded_report(results: list[dict], spec_file: str, options: dict, rounds: int) -> dict:
    """Medians of the ranks' rounds and the ratios (pure)."""
    parts = [medians({"part": r["times"]["part"]})["part"] for r in results]
    rank0 = medians(results[0]["times"])
    slowest = max(parts)
    return {"spec": spec_file, "model_options": options, "ranks": len(results), "rounds": rounds,
            "state_mb": round(results[0]["state_bytes"] / 2**20, 1),
            "part_s_per_rank": [round(p, 4) for p in parts], "part_slowest_s": round(slowest, 4),
            "sharded_complete_s": round(rank0["complete"], 4),
            "whole_bare_fsync_s": round(rank0["bare_fsync"], 4), "whole_sync_s": round(rank0["sync"], 4),
            "part_slowest_vs_whole_bare_fsync": round(slowest / rank0["bare_fsync"], 3),
            "sharded_complete_vs_whole_sync": round(rank0["complete"] / rank0["sync"], 3)}


def print_sharded(r: dict) -> None:
    print(f"sharded checkpoint save, gpt {r['model_options']} ({r['state_mb']} MB of model + AdamW "
          f"state), {r['ranks']} ranks, median of {r['rounds']} alternating rounds:")
    print(f"  each rank its part (write_sharded):       {', '.join(f'{p:.3f}' for p in r['part_s_per_rank'])} s")
    print(f"  sharded save until the marker:            {r['sharded_complete_s']:.3f} s")
    print(f"  rank 0 alone, torch.save + fsync:         {r['whole_bare_fsync_s']:.3f} s")
    print(f"  rank 0 alone, ours (sync):                {r['whole_sync_s']:.3f} s")
    print(f"  slowest part vs. whole torch.save + fsync: {r['part_slowest_vs_whole_bare_fsync']:.2f}x; "
          f"sharded save vs. whole sync save: {r['sharded_complete_vs_whole_sync']:.2f}x")


def main(args) -> int:
    base = Path(args.dir) if args.dir else None
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        if args.sharded:
            result = measure_sharded(args.spec, args.gpt, args.ranks, args.rounds, Path(tmp))
        else:
            result = measure(args.model, args.rounds, Path(tmp))
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.sharded:
        print_sharded(result)
    else:
        r = result
        print(f"checkpoint save, {r['model']} ({r['model_mb']} MB of weights, plus momentum), "
              f"median of {r['rounds']} alternating rounds on {os.path.dirname(r['directory'])}:")
        print(f"  bare torch.save:                          {r['bare_torch_save_s']:.3f} s")
        print(f"  bare torch.save + fsync:                  {r['bare_torch_save_fsync_s']:.3f} s")
        print(f"  ours, sync (loop blocked throughout):     {r['sync_s']:.3f} s   "
              f"{r['sync_vs_bare']:.2f}x bare")
        print(f"  ours, async: loop blocked                 {r['async_blocked_s']:.3f} s   "
              f"{r['async_blocked_vs_bare']:.2f}x bare")
        print(f"  ours, async: until complete (background)  {r['async_total_s']:.3f} s   "
              f"{r['async_total_vs_bare']:.2f}x bare")
        print(f"  a compute loop's rate during an async write: {r['loop_rate_while_writing']:.2f}x "
              "its rate without")
    return 0

"""`bench data`: images/s of the input pipeline, ours vs. a folder of JPEG files, in one run.

Every configuration goes through the same torch DataLoader settings (workers, batch, start
method, persistent workers) and the same decode + transform, so the ratios isolate the storage:
  folder        one JPEG file per sample, read with open() like torchvision's ImageFolder
  shards-jpeg   our HDF5 shards, block-ordered sampler, batched reads (__getitems__)
  shards-jpeg-1 the same, item by item (no __getitems__): does the batched read help?
  shards-raw    raw-pixel shards, if --raw-shards is given (no JPEG decode at all)
  memory        decode + transform of JPEG bytes already in memory: the ceiling
Noise on a shared machine: configurations run in alternating short rounds and the median round
counts. Each round is exactly one loader epoch (a sampler of the round's size), so no worker is
still busy with one configuration while the next is measured. The OS page cache is not dropped
(that needs root): every figure is for warm files.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from hpc_train.data.decode import decode_image
from hpc_train.data.sampler import block_order
from hpc_train.data.shard_dataset import ShardedImages
from hpc_train.data.transforms import TrainTransform, ValTransform, sample_rng
from hpc_train.errors import DataError

IMAGE_SUFFIXES = {".jpg", ".jpeg", ".png", ".bmp", ".webp"}
MEMORY_CAP = 2048  # images held in memory for the ceiling (all workers get a copy)


def list_folder(src: Path) -> tuple[list[Path], list[int]]:
    """ImageFolder's listing: sorted class folders, every image file below each, sorted."""
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    files, labels = [], []
    for k, name in enumerate(classes):
        found = sorted(p for p in (src / name).rglob("*") if p.suffix.lower() in IMAGE_SUFFIXES)
        files += found
        labels += [k] * len(found)
    if not files:
        raise DataError(f"{src}: no images in class folders (expected SRC/<class>/<image>)")
    return files, labels


class _Decoded(Dataset):
    """Shared part of the baselines: bytes -> decode (same draft) -> transform, with the same
    per-sample generator as ShardedImages (epoch 0), so every configuration pays for making it."""

    def __init__(self, labels: list[int], transform):
        self.labels, self.transform = labels, transform

    def __len__(self) -> int:
        return len(self.labels)

    def _bytes(self, index: int) -> bytes:
        raise NotImplementedError

    def __getitem__(self, index: int):
        image, _ = decode_image(self._bytes(index), self.transform.draft_size)
        return self.transform(image, sample_rng(0, 0, index)), self.labels[index]


class FolderImages(_Decoded):
    def __init__(self, files: list[Path], labels: list[int], transform):
        super().__init__(labels, transform)
        self.files = files

    def _bytes(self, index: int) -> bytes:
        return self.files[index].read_bytes()


class MemoryImages(_Decoded):
    def __init__(self, blobs: list[bytes], labels: list[int], transform):
        super().__init__(labels, transform)
        self.blobs = blobs

    def _bytes(self, index: int) -> bytes:
        return self.blobs[index]


class ItemByItem(Dataset):
    """Hides `__getitems__`, so the DataLoader fetches a batch one `__getitem__` at a time."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, index):
        return self.dataset[index]


class RoundSampler:
    """Each loader epoch is one round: the next `count` indices of `order`, cycling."""

    def __init__(self, order: np.ndarray):
        self.order, self.position, self.count = order, 0, 0

    def __len__(self) -> int:
        return self.count

    def __iter__(self):
        picks = np.take(self.order, np.arange(self.position, self.position + self.count),
                        mode="wrap")
        self.position = (self.position + self.count) % len(self.order)
        return iter(picks.tolist())


class Config:
    def __init__(self, name: str, what: str, dataset, order: np.ndarray, args):
        self.name, self.what, self.sampler = name, what, RoundSampler(order)
        workers = args.workers
        self.loader = DataLoader(dataset, batch_size=args.batch, sampler=self.sampler,
                                 drop_last=True, num_workers=workers,
                                 persistent_workers=workers > 0,
                                 multiprocessing_context=args.start_method if workers else None)
        self.rates: list[float] = []

    def run(self, batches: int) -> float:
        """Images/s of one round of `batches` batches, timed from iter() to the last batch."""
        self.sampler.count = batches * self.loader.batch_size
        start = time.perf_counter()
        images = sum(len(labels) for _, labels in self.loader)
        return images / (time.perf_counter() - start)


def build_configs(args) -> list[Config]:
    make = TrainTransform if args.split == "train" else ValTransform
    transform = make(args.image_size, draft=not args.no_draft, normalize=not args.uint8)
    files, labels = list_folder(Path(args.src))
    rng = np.random.default_rng(0)
    configs = [Config("folder", "ImageFolder: one JPEG file per sample",
                      FolderImages(files, labels, transform), rng.permutation(len(files)), args)]
    shards = ShardedImages(args.shards, args.split, transform)
    block = block_order(len(shards), 0, 0, args.block_size)
    configs.append(Config("shards-jpeg", "HDF5 shards, batched block reads", shards, block, args))
    configs.append(Config("shards-jpeg-1", "HDF5 shards, item by item", ItemByItem(shards),
                          block, args))
    if args.raw_shards:
        raw = ShardedImages(args.raw_shards, args.split, transform)
        if raw.encoding != "raw":
            raise DataError(f"--raw-shards {args.raw_shards}: encoding is {raw.encoding}, not raw")
        configs.append(Config("shards-raw", "HDF5 raw pixels, batched block reads", raw,
                              block_order(len(raw), 0, 0, args.block_size), args))
    picked = sorted(rng.permutation(len(files))[:MEMORY_CAP].tolist())
    memory = MemoryImages([files[i].read_bytes() for i in picked], [labels[i] for i in picked],
                          transform)
    configs.append(Config("memory", "decode + transform of bytes in memory (ceiling)", memory,
                          rng.permutation(len(picked)), args))
    return configs


def measure(configs: list[Config], args, say) -> None:
    workers = max(1, args.workers)
    for config in configs:  # start workers, fill the page cache, then a rough rate
        config.run(2 * workers)
        config.calibrated = config.run(3 * workers)
        say(f"warm-up {config.name}: ~{config.calibrated:.0f} images/s")
    for config in configs:
        if args.images:
            per_round = args.images / args.rounds
        else:
            per_round = config.calibrated * args.seconds / args.rounds
        config.batches = max(2, math.ceil(per_round / args.batch))
    for round_index in range(args.rounds):
        # Alternate the order too, so no configuration always follows the same neighbour.
        ordered = configs if round_index % 2 == 0 else configs[::-1]
        for config in ordered:
            config.rates.append(config.run(config.batches))
        say(f"round {round_index + 1}/{args.rounds}: " + ", ".join(
            f"{c.name} {c.rates[-1]:.0f}" for c in configs))


def results(configs: list[Config], args) -> dict:
    medians = {c.name: statistics.median(c.rates) for c in configs}
    rows = [{"config": c.name, "what": c.what, "images_per_s": round(medians[c.name], 1),
             "min": round(min(c.rates), 1), "max": round(max(c.rates), 1),
             "rounds": [round(r, 1) for r in c.rates], "images_per_round": c.batches * args.batch,
             "vs_folder": round(medians[c.name] / medians["folder"], 3),
             "vs_ceiling": round(medians[c.name] / medians["memory"], 3)} for c in configs]
    return {"rows": rows, "settings": {
        "command": "python -m hpc_train " + " ".join(sys.argv[1:]) if sys.argv else "",
        "split": args.split, "image_size": args.image_size, "batch": args.batch,
        "workers": args.workers, "start_method": args.start_method, "rounds": args.rounds,
        "block_size": args.block_size, "draft": not args.no_draft,
        "output": "uint8" if args.uint8 else "float32", "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "page_cache": "warm (not dropped: needs root); every file was read during warm-up"}}


def render(report: dict, tty: bool) -> None:
    s = report["settings"]
    header = (f"split {s['split']}, {s['image_size']} px, batch {s['batch']}, {s['workers']} "
              f"workers ({s['start_method']}), draft {'on' if s['draft'] else 'off'}, {s['output']}, median of {s['rounds']} rounds, page cache warm")
    columns = ("config", "images/s", "min-max", "vs folder", "vs ceiling", "what")
    lines = [(r["config"], f"{r['images_per_s']:.0f}", f"{r['min']:.0f}-{r['max']:.0f}",
              f"{r['vs_folder']:.2f}x", f"{r['vs_ceiling']:.2f}", r["what"]) for r in report["rows"]]
    if tty:
        from rich.console import Console
        from rich.table import Table

        table = Table(*columns, title=header)
        for line in lines:
            table.add_row(*line)
        Console().print(table)
        return
    print(header)
    print("\t".join(columns))
    for line in lines:
        print("\t".join(line))


def main(args) -> int:
    if args.workers and args.start_method is None:
        args.start_method = "fork"
    say = (lambda text: print(text, file=sys.stderr)) if not args.quiet else (lambda text: None)
    configs = build_configs(args)
    measure(configs, args, say)
    report = results(configs, args)
    if args.json:
        print(json.dumps(report, indent=1))
    else:
        render(report, sys.stdout.isatty())
    return 0

"""`bench data`: images/s of our input pipeline vs. the torchvision recipe, in one run.

  torchvision   the baseline: one JPEG file per sample, Pillow full decode, RandomResizedCrop
                (crop, then resize bilinear), flip, ToTensor, Normalize: float32 out.
                Reimplemented faithfully (torchvision does not import beside our CPU torch);
                the crop and flip come from the same per-sample generator as ours.
  folder        our decode + transform on the same files: the storage alone differs from shards
  shards-jpeg   ours: HDF5 shards, block-ordered sampler, batched reads (__getitems__), header
                first, the fastest installed decoder (cropjpeg: only the crop's rows and columns;
                scaled when the crop allows), torch SIMD resize, uint8
  shards-jpeg-1 the same, item by item (no __getitems__): does the batched read help?
  shards-jpeg-DECODER  the same with each slower installed decoder (simplejpeg, pillow): what
                the faster one gains, and what a node without it gets
  shards-raw    raw-pixel shards, if --raw-shards is given (no JPEG decode at all)
  memory        our decode + transform of the shards' JPEG bytes already in memory: our ceiling
                (the same bytes as shards-jpeg, restart markers included: storage alone differs)
Every configuration runs through the same DataLoader settings (workers, batch, start method,
persistent workers). Noise on a shared machine: configurations run in alternating short rounds
and the median round counts. Each round is exactly one loader epoch (a sampler of the round's
size), so no worker is still busy with one configuration while the next is measured. The OS page
cache is not dropped (that needs root): every figure is for warm files.
"""

from __future__ import annotations

import io
import json
import math
import os
import sys
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from PIL import Image

from hpc_train.data import decode
from hpc_train.data.sampler import block_order
from hpc_train.data.shard_dataset import ShardedImages
from hpc_train.data.sources import IMAGE_EXTENSIONS
from hpc_train.data.transforms import (IMAGENET_MEAN, IMAGENET_STD, SampleStream, TrainTransform,
                                       ValTransform, rrc_params, val_geometry)
from hpc_train.errors import DataError
from hpc_train.inspection.text import print_table
from hpc_train.train.timing import Stopwatch, medians

MEMORY_CAP = 2048  # images held in memory for the ceiling (all workers get a copy)
GPU_IMAGES_PER_S = 3000  # what one H100-class GPU trains ResNet-50 at in FP16 (the target)


def list_folder(src: Path) -> tuple[list[Path], list[int]]:
    """ImageFolder's listing: sorted class folders, every image file below each, sorted."""
    classes = sorted(p.name for p in src.iterdir() if p.is_dir())
    files, labels = [], []
    for k, name in enumerate(classes):
        found = sorted(p for p in (src / name).rglob("*") if p.suffix.lower() in IMAGE_EXTENSIONS)
        files += found
        labels += [k] * len(found)
    if not files:
        raise DataError(f"{src}: no images in class folders (expected SRC/<class>/<image>)")
    return files, labels


class TorchvisionRecipe:
    """torchvision's ImageNet transforms on a PIL image, as its v1 API runs them: RandomResizedCrop
    (crop, then resize BILINEAR) + RandomHorizontalFlip, or Resize + CenterCrop; then ToTensor
    (float / 255) and Normalize ((x - mean) / std)."""

    def __init__(self, size: int, train: bool):
        self.size, self.train = size, train
        self.mean = torch.tensor(IMAGENET_MEAN).view(3, 1, 1)
        self.std = torch.tensor(IMAGENET_STD).view(3, 1, 1)

    def __call__(self, img: Image.Image, rng: np.random.Generator) -> torch.Tensor:
        if self.train:
            top, left, h, w = rrc_params(img.height, img.width, rng)
            img = img.crop((left, top, left + w, top + h)).resize((self.size, self.size),
                                                                  Image.BILINEAR)
            if rng.random() < 0.5:
                img = img.transpose(Image.FLIP_LEFT_RIGHT)
        else:
            new_h, new_w, top, left = val_geometry(img.height, img.width, self.size)
            img = img.resize((new_w, new_h), Image.BILINEAR).crop(
                (left, top, left + self.size, top + self.size))
        pixels = torch.from_numpy(np.array(img, dtype=np.uint8))
        tensor = pixels.permute(2, 0, 1).contiguous().float().div(255)     # ToTensor
        return (tensor - self.mean) / self.std                            # Normalize


class _Decoded(Dataset):
    """A sample from its bytes, with the same per-sample generator as ShardedImages (epoch 0).
    `recipe`: the torchvision baseline (Pillow full decode, then the recipe), else our path."""

    def __init__(self, labels: list[int], transform, recipe: TorchvisionRecipe | None = None):
        self.labels, self.transform, self.recipe = labels, transform, recipe

    def __len__(self) -> int:
        return len(self.labels)

    def _bytes(self, index: int) -> bytes:
        raise NotImplementedError

    def __getitem__(self, index: int):
        data, stream = self._bytes(index), SampleStream(0, 0, index)
        if self.recipe is not None:
            image = Image.open(io.BytesIO(data)).convert("RGB")    # ImageFolder's pil_loader
            return self.recipe(image, stream.generator()), self.labels[index]
        # The stream as ShardedImages passes it: the same draws, made the same way.
        return self.transform(decode.open_encoded(data), stream), self.labels[index]


class FolderImages(_Decoded):
    def __init__(self, files: list[Path], labels: list[int], transform, recipe=None):
        super().__init__(labels, transform, recipe)
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
        watch = Stopwatch()
        images = sum(len(labels) for _, labels in self.loader)
        return images / watch.seconds()


def shard_records(shards: ShardedImages, indices: list[int]) -> tuple[list[bytes], list[int]]:
    """The stored JPEG bytes and labels of these samples (JPEG shards only)."""
    if shards.encoding != "jpeg":
        raise DataError(f"--shards {shards.split_dir.parent}: encoding is {shards.encoding}, not jpeg")
    records = [shards.record(index) for index in indices]
    shards.close()            # the workers open their own
    return [data.tobytes() for data, _ in records], [label for _, label in records]


def build_configs(args) -> list[Config]:
    train = args.split == "train"
    make = TrainTransform if train else ValTransform
    transform = make(args.image_size, draft=not args.no_draft, normalize=args.output == "float32")
    files, labels = list_folder(Path(args.src))
    rng = np.random.default_rng(0)
    folder_order = rng.permutation(len(files))
    configs = [Config("torchvision", "torchvision recipe: files, Pillow, float32 (baseline)",
                      FolderImages(files, labels, None, TorchvisionRecipe(args.image_size, train)),
                      folder_order, args),
               Config("folder", "files, our decode + transform", FolderImages(files, labels, transform),
                      folder_order, args)]
    shards = ShardedImages(args.shards, args.split, transform)
    block = block_order(len(shards), 0, 0, args.block_size)
    configs.append(Config("shards-jpeg", f"HDF5 shards, batched reads, {decode.jpeg_decoder()}",
                          shards, block, args))
    configs.append(Config("shards-jpeg-1", "HDF5 shards, item by item", ItemByItem(shards),
                          block, args))
    for decoder in decode.installed_decoders():
        if decoder != decode.jpeg_decoder():
            configs.append(Config(f"shards-jpeg-{decoder}", f"HDF5 shards, batched reads, {decoder}",
                                  ShardedImages(args.shards, args.split, transform,
                                                decoder=decoder), block, args))
    if args.raw_shards:
        raw = ShardedImages(args.raw_shards, args.split, transform)
        if raw.encoding != "raw":
            raise DataError(f"--raw-shards {args.raw_shards}: encoding is {raw.encoding}, not raw")
        configs.append(Config("shards-raw", "HDF5 raw pixels, batched block reads", raw,
                              block_order(len(raw), 0, 0, args.block_size), args))
    picked = sorted(rng.permutation(len(shards))[:MEMORY_CAP].tolist())
    memory = MemoryImages(*shard_records(shards, picked), transform)
    configs.append(Config("memory", "our decode + transform of the shards' bytes in memory "
                          "(ceiling)", memory, rng.permutation(len(picked)), args))
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


def fallbacks(files: list[Path]) -> dict[str, int]:
    """How many of the images the chosen decoder passes to a slower one, by reason (headers
    only, in this process: the workers' own counts stay in the workers)."""
    before = decode.FALLBACKS.copy()
    for path in files:
        decode.open_encoded(path.read_bytes())
    return {reason.value: count for reason, count in (decode.FALLBACKS - before).items()}


def results(configs: list[Config], args) -> dict:
    median = medians({c.name: c.rates for c in configs})
    cores = max(1, args.workers)    # the worker processes do the decoding; 0 = the main process
    rows = []
    for c in configs:
        per_core = median[c.name] / cores
        rows.append({
            "config": c.name, "what": c.what, "images_per_s": round(median[c.name], 1),
            "min": round(min(c.rates), 1), "max": round(max(c.rates), 1),
            "rounds": [round(r, 1) for r in c.rates], "images_per_round": c.batches * args.batch,
            "vs_torchvision": round(median[c.name] / median["torchvision"], 3),
            "vs_ceiling": round(median[c.name] / median["memory"], 3),
            "images_per_s_per_core": round(per_core, 1),
            "cores_per_gpu": round(GPU_IMAGES_PER_S / per_core, 2)})
    return {"rows": rows, "settings": {
        "command": "python -m hpc_train " + " ".join(sys.argv[1:]) if sys.argv else "",
        "split": args.split, "image_size": args.image_size, "batch": args.batch,
        "workers": args.workers, "start_method": args.start_method, "rounds": args.rounds,
        "block_size": args.block_size, "draft": not args.no_draft, "output": args.output,
        "jpeg_decoder": decode.jpeg_decoder(), "gpu_images_per_s": GPU_IMAGES_PER_S,
        "jpeg_fallbacks": fallbacks(list_folder(Path(args.src))[0]),
        "cpu_count": os.cpu_count(), "torch": torch.__version__,
        "page_cache": "warm (not dropped: needs root); every file was read during warm-up"}}


def render(report: dict) -> None:
    s = report["settings"]
    header = (f"split {s['split']}, {s['image_size']} px, batch {s['batch']}, {s['workers']} "
              f"workers ({s['start_method']}), ours: {s['jpeg_decoder']}, {s['output']} out, draft "
              f"{'on' if s['draft'] else 'off'}; median of {s['rounds']} rounds, page cache warm; "
              f"to a slower decoder: {s['jpeg_fallbacks'] or 'none'}")
    columns = ("config", "images/s", "min-max", "vs torchvision", "vs ceiling", "per core",
               f"cores/GPU @{s['gpu_images_per_s']}", "what")
    lines = [(r["config"], f"{r['images_per_s']:.0f}", f"{r['min']:.0f}-{r['max']:.0f}",
              f"{r['vs_torchvision']:.2f}x", f"{r['vs_ceiling']:.2f}",
              f"{r['images_per_s_per_core']:.0f}", f"{r['cores_per_gpu']:.1f}", r["what"])
             for r in report["rows"]]
    print_table(columns, lines, title=header)


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
        render(report)
    return 0

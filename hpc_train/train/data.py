"""Data loaders of one rank, from the spec: synthetic images or HDF5 shards.

Training order comes from `ResumableBlockSampler` (same global order for every world size, exact
mid-epoch resume from one number); validation covers every sample once (`ValidationSampler`).
Augmentation is drawn per sample from (run seed, epoch, index) inside the datasets, and each
loader seeds its workers from a generator of its own: neither depends on, nor draws from, the
global torch RNG, which the checkpoint restores for the model (dropout) alone.
"""

from __future__ import annotations

import dataclasses

import signal
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from hpc_train.data.sampler import ResumableBlockSampler, ValidationSampler
from hpc_train.errors import DataError

VAL_FIRST_INDEX = 1 << 40


def ignore_stop_signals(_worker_id: int) -> None:
    """DataLoader worker init: the rank decides when to stop. Slurm signals every process of a
    job (preemption, scancel), and a worker killed by that SIGTERM would crash its rank before
    it saves; the rank shuts its workers down itself, and Slurm's final SIGKILL still applies."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)


def loader_generator(seed: int, rank: int) -> torch.Generator:
    """The generator a DataLoader draws its workers' base seed from at each iter().

    Without one it draws from the global torch RNG: a resumed run, whose RNG state is restored
    before its first iter(), would then see that stream shifted by one draw. The rank is mixed
    in so that anything drawing from a worker's own RNGs (torch, numpy, random: all seeded from
    that base seed) draws differently on each rank, as it would on each worker.
    """
    mixed = np.random.SeedSequence([seed, rank]).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(mixed))


def _loader(dataset, sampler, spec, rank: int, pin: bool, drop_last: bool) -> DataLoader:
    data = spec.data
    workers = data.workers
    return DataLoader(dataset, batch_size=data.batch_size, sampler=sampler, drop_last=drop_last,
                      num_workers=workers, pin_memory=pin, worker_init_fn=ignore_stop_signals,
                      multiprocessing_context=data.start_method if workers else None,
                      persistent_workers=workers > 0, generator=loader_generator(spec.run.seed, rank))


def _token_datasets(spec):
    from hpc_train.data.tokens import TokenShards, TokenWindows, generate_corpus

    data = spec.data
    if data.kind == "tokens":
        root = Path(data.path)
        val = TokenShards(root, "val", data.seq_len) if (root / "val" / "manifest.json").is_file() else None
        return TokenShards(root, "train", data.seq_len), val
    def corpus(sequences: int, seed: int) -> TokenWindows:
        text = generate_corpus(sequences * data.seq_len + 1, seed)
        return TokenWindows(np.frombuffer(text, dtype=np.uint8), data.seq_len)

    train = corpus(data.train_samples or spec.samples_per_step * 100, spec.run.seed)
    # Validation: another seed, so other sentences of the same language.
    val = corpus(data.val_samples, spec.run.seed + 1) if data.val_samples else None
    return train, val


def _datasets(spec, uint8: bool):
    data = spec.data
    if data.kind in ("text", "tokens"):
        return _token_datasets(spec)
    if data.kind == "synthetic":
        from hpc_train.data.synthetic import SyntheticImages

        train_samples = data.train_samples or spec.samples_per_step * 100
        train = SyntheticImages(train_samples, data.num_classes, data.image_size, seed=spec.run.seed)
        val = None
        if data.val_samples:
            # Same class patterns, other samples: validation never sees a training image.
            val = SyntheticImages(data.val_samples, data.num_classes, data.image_size,
                                  seed=spec.run.seed, first_index=VAL_FIRST_INDEX)
        return train, val
    from hpc_train.data.shard_dataset import ShardedImages
    from hpc_train.data.transforms import TrainTransform, ValTransform

    root = Path(data.path)
    normalize = not uint8
    train = ShardedImages(root, "train", TrainTransform(data.image_size, normalize=normalize),
                          seed=spec.run.seed)
    if len(train.class_names) != data.num_classes:
        raise DataError(f"{root}/train has {len(train.class_names)} classes but data.num_classes is "
                        f"{data.num_classes}: set data.num_classes: {len(train.class_names)}")
    val = (ShardedImages(root, "val", ValTransform(data.image_size, normalize=normalize))
           if (root / "val").is_dir() else None)
    return train, val


def normalizes_on_device(spec, device: torch.device) -> bool:
    """Whether hdf5 image workers return uint8 and the rank normalises on `device`
    (data.normalize_on; auto: on a GPU). Other data kinds have nothing to normalise."""
    setting = spec.data.normalize_on
    return spec.data.kind == "hdf5" and (setting == "device" or
                                         (setting == "auto" and device.type == "cuda"))


class DeviceInputs:
    """A batch to the rank's device: a non_blocking copy (from pinned memory when the loader
    pins, so it overlaps with compute on a GPU), then uint8 images normalised there with the
    workers' own x * a + b (bit-identical to normalising in the workers, on CPU)."""

    def __init__(self, device: torch.device, normalize: bool):
        from hpc_train.data.transforms import scale_shift

        self.device, self.normalize = device, normalize
        self.scale, self.shift = (t.to(device) for t in scale_shift())

    def __call__(self, images: torch.Tensor, labels: torch.Tensor):
        images = images.to(self.device, non_blocking=True)
        if self.normalize and images.dtype == torch.uint8:
            images = images.float().mul_(self.scale).add_(self.shift)
        return images, labels.to(self.device, non_blocking=True)

    def batches(self, loader):
        for images, labels in loader:
            yield self(images, labels)


def build_loaders(spec, rank: int, size: int, pin: bool, uint8: bool = False,
                  root: Path | None = None) -> tuple[DataLoader, DataLoader | None]:
    """`uint8`: image transforms return uint8 CHW (see `normalizes_on_device`). root: read the
    shards there instead of data.path (a node-local copy, data/stage.py)."""
    if root is not None:
        spec = dataclasses.replace(spec, data=dataclasses.replace(spec.data, path=str(root)))
    train, val = _datasets(spec, uint8)
    try:
        sampler = ResumableBlockSampler(len(train), rank, size, spec.data.batch_size, seed=spec.run.seed)
    except ValueError as exc:
        raise DataError(f"training data too small: {exc}") from None
    if sampler.batches_per_epoch < spec.parallel.accumulation:
        raise DataError(f"{len(train)} training samples make {sampler.batches_per_epoch} batches per "
                        f"epoch, fewer than one step of {spec.parallel.accumulation} accumulated batches")
    val_loader = None
    if val is not None and len(val):
        val_loader = _loader(val, ValidationSampler(len(val), rank, size), spec, rank, pin,
                             drop_last=False)
    return _loader(train, sampler, spec, rank, pin, drop_last=True), val_loader

"""Data loaders for a rank, from the spec (synthetic now; HDF5 shards plug in here)."""

from __future__ import annotations

from torch.utils.data import DataLoader

from hpc_train.data.sampler import EvenShardSampler
from hpc_train.data.synthetic import SyntheticImages
from hpc_train.errors import DataError

VAL_FIRST_INDEX = 1 << 40


def _loader(dataset, sampler, data_spec, pin: bool) -> DataLoader:
    workers = data_spec.workers
    return DataLoader(dataset, batch_size=data_spec.batch_size, sampler=sampler, drop_last=True,
                      num_workers=workers, pin_memory=pin,
                      multiprocessing_context=data_spec.start_method if workers else None,
                      persistent_workers=workers > 0)


def build_loaders(spec, rank: int, size: int, pin: bool) -> tuple[DataLoader, DataLoader | None]:
    data = spec.data
    if data.kind != "synthetic":
        raise DataError(f"data.kind {data.kind!r} is not readable yet: use data.kind: synthetic")
    per_step = data.batch_size * size * spec.parallel.accumulation
    train_samples = data.train_samples or per_step * 100
    train = SyntheticImages(train_samples, data.num_classes, data.image_size, seed=spec.run.seed)
    train_sampler = EvenShardSampler(train_samples, rank, size, seed=spec.run.seed)
    if len(train_sampler) < data.batch_size * spec.parallel.accumulation:
        raise DataError(f"{train_samples} training samples give each of {size} ranks "
                        f"{len(train_sampler)}, fewer than one step of "
                        f"{data.batch_size} x {spec.parallel.accumulation}")
    val_loader = None
    if data.val_samples:
        # Same class patterns, other samples: validation never sees a training image.
        val = SyntheticImages(data.val_samples, data.num_classes, data.image_size,
                              seed=spec.run.seed, first_index=VAL_FIRST_INDEX)
        val_sampler = EvenShardSampler(data.val_samples, rank, size, shuffle=False)
        val_loader = _loader(val, val_sampler, data, pin)
    return _loader(train, train_sampler, data, pin), val_loader

"""Data loaders of one rank, from the spec: synthetic images, HDF5 shards, or the user's own
map-style dataset (data.kind dataset).

Training order comes from `ResumableBlockSampler` (same global order for every world size, exact
mid-epoch resume from one number); validation covers every sample once (`ValidationSampler`).
Augmentation is drawn per sample from (run seed, epoch, index) inside the datasets, and each
loader seeds its workers from a generator of its own: neither depends on, nor draws from, the
global torch RNG, which the checkpoint restores for the model (dropout) alone.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import os
import signal
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import DataLoader

from hpc_train.data.sampler import (ResumableBlockSampler, ValidationSampler, as_key,
                                    block_size_for)
from hpc_train.errors import DataError
from hpc_train.runtime.parent_death import PARENT_ENV, die_with_parent, served_pid
from hpc_train.runtime.stop import STOP_SIGNALS, ignore_stop_signals

VAL_FIRST_INDEX = 1 << 40


# Sent by the rank's heartbeat when it has waited too long (dump_worker_stacks): each worker then
# writes its Python stacks to its stderr, the rank's log.
DUMP_SIGNAL = signal.SIGUSR1
# What the forkserver imports once: first the binding of its life to the rank's, then what lets
# workers fork from it with torch and the datasets loaded.
_SERVER_PRELOAD = ["hpc_train.runtime.forkserver_preload", "hpc_train.train.data",
                   "hpc_train.data.shard_dataset", "hpc_train.data.transforms",
                   "hpc_train.data.synthetic", "hpc_train.data.tokens"]


def init_worker(_worker_id: int) -> None:
    """DataLoader worker init: the job's stop signals are the rank's to act on (ignore_stop_signals).
    DUMP_SIGNAL writes the worker's stacks: a hang in a worker is then seen where it is.
    A forkserver's worker dies with the server, which dies with the rank (parent_death.py)."""
    ignore_stop_signals()
    faulthandler.register(DUMP_SIGNAL, all_threads=True)
    rank = served_pid()
    if rank is not None and os.getppid() != rank:      # forked by the server, not by the rank
        die_with_parent(rank)


def start_worker_server(spec) -> None:
    """Start the forkserver that data.start_method forkserver forks the workers from, now.

    Why forkserver: a rank is an MPI process with threads (Horovod's, MPI's and PMIx's progress
    threads, the heartbeat); a worker forked from it inherits whatever lock one of them held at
    that instant, held forever, and the memory hooks MPI installs (Horovod's own examples use
    forkserver for this). The server is a fresh interpreter: started by the Trainer first, its
    import of torch overlaps with the rank's own start-up. Once started, a no-op. Call it from
    the main thread: the server dies with the thread that started it (parent_death.py)."""
    if spec.data.workers and spec.data.start_method == "forkserver":
        import multiprocessing.forkserver as forkserver
        import multiprocessing.resource_tracker as resource_tracker

        os.environ[PARENT_ENV] = str(os.getpid())
        forkserver.set_forkserver_preload(_SERVER_PRELOAD)
        # Blocked while the resource tracker and the server are spawned: they inherit the mask,
        # so a stop signal cannot kill them before they ignore it (the tracker ignores SIGTERM
        # only, and unblocks it here when it has started: hence the second block). Here a
        # signal waits for the unblocking, then reaches the StopFlag.
        blocked = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
        try:
            resource_tracker.ensure_running()
            signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)
            forkserver.ensure_running()
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, blocked)


def worker_pids(*loaders) -> list[int]:
    """The pids of the loaders' started workers. Read from the heartbeat's thread: no waiting."""
    return [worker.pid for loader in loaders
            for worker in getattr(getattr(loader, "_iterator", None), "_workers", ())
            if worker.pid is not None]


def dump_worker_stacks(pids: list[int]) -> None:
    """Ask these workers to write their stacks to their stderr (DUMP_SIGNAL, see init_worker)."""
    for pid in pids:
        try:
            os.kill(pid, DUMP_SIGNAL)
        except ProcessLookupError:
            pass


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
    start_worker_server(spec)     # started already by a rank (Trainer); a no-op then
    return DataLoader(dataset, batch_size=data.batch_size, sampler=sampler, drop_last=drop_last,
                      num_workers=workers, pin_memory=pin, worker_init_fn=init_worker,
                      multiprocessing_context=data.start_method if workers else None,
                      persistent_workers=workers > 0, generator=loader_generator(spec.run.seed, rank))


def validation_loader(dataset, spec, rank: int, size: int, pin: bool) -> DataLoader:
    """Rank `rank` of `size`'s part of `dataset`, every sample once, in the spec's batches: the
    trainer's validation and `evaluate` (which must see the same batches to give the same sums)."""
    return _loader(dataset, ValidationSampler(len(dataset), rank, size), spec, rank, pin,
                   drop_last=False)


def shutdown_workers(loader: DataLoader | None) -> None:
    """Stop a loader's persistent workers now. They ignore SIGTERM (init_worker), so
    Python's exit-time `terminate()` cannot end them: the loader must send its shutdown sentinel
    while the process still runs."""
    iterator = getattr(loader, "_iterator", None)   # persistent workers live here
    if iterator is not None and hasattr(iterator, "_shutdown_workers"):
        iterator._shutdown_workers()
        loader._iterator = None


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


def _synthetic(spec, split: str):
    from hpc_train.data.synthetic import SyntheticImages

    data = spec.data
    if split == "train":
        samples, first = data.train_samples or spec.samples_per_step * 100, 0
    else:
        # Same class patterns, other samples: validation never sees a training image.
        samples, first = data.val_samples, VAL_FIRST_INDEX
    return SyntheticImages(samples, data.num_classes, data.image_size, seed=spec.run.seed,
                           first_index=first)


def own_dataset(spec, split: str):
    """The user's dataset of `split` (data.kind dataset): data.dataset called with the split and
    data.options. None for a split it does not have; a DataError naming the reference when what
    it returns has no length (the sampler orders indices 0..len-1, which exact resume needs)."""
    from hpc_train.usercode import call

    data = spec.data
    dataset = call(data.dataset, f"the {split} dataset", split, **data.options)
    if dataset is None:
        return None
    if not hasattr(dataset, "__getitem__") or not hasattr(dataset, "__len__"):
        raise DataError(f"data.dataset {data.dataset} returned {type(dataset).__name__} for split "
                        f"{split!r}, which has no __len__ and __getitem__: exact resume needs a "
                        "map-style torch Dataset (an IterableDataset cannot resume mid-epoch)")
    return ByIndex(dataset)


class ByIndex(torch.utils.data.Dataset):
    """The user's dataset indexed as a map-style dataset expects: by a plain index. Our training
    sampler names samples as SampleKey(epoch, index) (our datasets draw augmentation from it)."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, key):
        return self.dataset[as_key(key).index]


def evaluation_dataset(spec, split: str = "val", root: str | Path | None = None,
                       uint8: bool = False):
    """`split` of the run's image data (of the shards under `root` if given) with the validation
    transform: what the trainer validates on, and what `evaluate` reads. uint8: left for the
    rank to normalise on its device (DeviceInputs)."""
    data = spec.data
    if data.kind == "dataset":
        dataset = own_dataset(spec, split)
        if dataset is None:
            raise DataError(f"data.dataset {data.dataset} has no {split!r} split (it returned None)")
        return dataset
    if data.kind == "synthetic":
        if split not in ("train", "val"):
            raise DataError(f"split {split!r}: synthetic data has the splits train and val only")
        return _synthetic(spec, split)
    from hpc_train.data.shard_dataset import ShardedImages
    from hpc_train.data.transforms import ValTransform

    return ShardedImages(Path(root or data.path), split,
                         ValTransform(data.image_size, normalize=not uint8))


def train_dataset(spec):
    """The training split of the spec's data as the trainer reads it (bench train's bare loop
    on the spec's own data)."""
    return _datasets(spec, uint8=False)[0]


def _datasets(spec, uint8: bool):
    data = spec.data
    if data.kind in ("text", "tokens"):
        return _token_datasets(spec)
    if data.kind == "synthetic":
        return _synthetic(spec, "train"), (_synthetic(spec, "val") if data.val_samples else None)
    if data.kind == "dataset":
        return evaluation_dataset(spec, "train"), own_dataset(spec, "val")
    from hpc_train.data.shard_dataset import ShardedImages
    from hpc_train.data.transforms import TrainTransform

    root = Path(data.path)
    normalize = not uint8
    train = ShardedImages(root, "train", TrainTransform(data.image_size, normalize=normalize),
                          seed=spec.run.seed)
    if len(train.class_names) != data.num_classes:
        raise DataError(f"{root}/train has {len(train.class_names)} classes but data.num_classes is "
                        f"{data.num_classes}: set data.num_classes: {len(train.class_names)}")
    val = evaluation_dataset(spec, "val", uint8=uint8) if (root / "val").is_dir() else None
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


def _order_settings(spec, train) -> dict:
    """The sampler's settings for the data (block_size_for), and a user's dataset's
    `fingerprint` attribute if it declares one (a str), checked at resume with its length."""
    settings = {"block_size": block_size_for(spec.data.kind)}
    fingerprint = getattr(getattr(train, "dataset", None), "fingerprint", None)
    if spec.data.kind == "dataset" and fingerprint is not None:
        settings["fingerprint"] = str(fingerprint)
    return settings


def build_loaders(spec, rank: int, size: int, pin: bool, uint8: bool = False,
                  root: Path | None = None) -> tuple[DataLoader, DataLoader | None]:
    """`uint8`: image transforms return uint8 CHW (see `normalizes_on_device`). root: read the
    shards there instead of data.path (a node-local copy, data/local_copy.py)."""
    if root is not None:
        spec = dataclasses.replace(spec, data=dataclasses.replace(spec.data, path=str(root)))
    train, val = _datasets(spec, uint8)
    try:
        sampler = ResumableBlockSampler(len(train), rank, size, spec.data.batch_size,
                                        passes_per_step=spec.parallel.accumulation, seed=spec.run.seed,
                                        **_order_settings(spec, train))
    except ValueError as exc:
        raise DataError(f"training data too small: {exc}") from None
    val_loader = None
    if val is not None and len(val):
        val_loader = validation_loader(val, spec, rank, size, pin)
    return _loader(train, sampler, spec, rank, pin, drop_last=True), val_loader

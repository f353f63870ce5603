"""`ShardedImages`: a map-style dataset over one split of HDF5 shards (docs/shard-format.md).

Handles: HDF5 file ids must never cross a fork (two processes sharing one libhdf5 file state
read garbage or crash), so files open lazily in the process that reads, the opening pid is
recorded, a changed pid drops (never closes: the parent still owns them) the inherited handles,
and pickling (forkserver/spawn workers) carries no handle at all. At most `max_open` files stay
open per process: ImageNet is ~1250 shards, times workers times ranks would exceed the usual
1024-descriptor limit.

Locality: `__getitems__` (used by torch's DataLoader for a whole batch when defined) sorts the
batch by (shard, offset), reads each shard's records of it at once (`shard_records`: a view of the
mapped file per JPEG record of a format-2 shard, one h5py selection of exactly the wanted rows otherwise),
then restores the requested order.

Augmentation: a sample's random stream is `SampleStream(seed, epoch, index)`, the epoch coming with
the index as a `SampleKey` from the training sampler. Nothing per process (worker seeds, which
no checkpoint holds) goes in, so a resumed run draws the same crops for the same samples.
"""

from __future__ import annotations

import bisect
import contextlib
import os
from collections import OrderedDict
from pathlib import Path

import h5py
import numpy as np
from torch.utils.data import Dataset

from hpc_train.data import manifest as mf
from hpc_train.data.decode import DECODE_ERRORS, open_encoded
from hpc_train.data.sampler import SampleKey, as_key
from hpc_train.data.shard_records import open_records
from hpc_train.data.transforms import SampleStream
from hpc_train.errors import DataError


def readable_manifest(split_dir: Path) -> dict:
    """The split's manifest.json as `mf.load_manifest` checks it, with a known encoding and
    shard counts that add up: what reading samples relies on."""
    path = split_dir / mf.MANIFEST
    manifest = mf.load_manifest(split_dir)
    if manifest.get("encoding") not in ("jpeg", "raw"):
        raise DataError(f"{path}: encoding {manifest.get('encoding')!r} is neither jpeg nor raw")
    counts = [int(s["num_samples"]) for s in manifest["shards"]]
    if sum(counts) != manifest["num_samples"]:
        raise DataError(f"{path}: shard counts add up to {sum(counts)}, "
                        f"not num_samples {manifest['num_samples']}")
    return manifest


class _Shard:
    """One open file, its records' reader and the small per-record arrays read once (labels,
    shapes)."""

    def __init__(self, path: Path):
        self.path = path
        self.file = h5py.File(path, "r")
        self.labels = self.file["labels"][()]
        self.shapes = self.file["shapes"][()]
        self.records = open_records(self.file, path, len(self.labels))

    def close(self) -> None:
        self.records.close()
        self.file.close()


class ShardedImages(Dataset):
    """(image tensor, label) of global index g, from DIR/<split>/shard-*.h5.

    Indexed by a global index or a `SampleKey(epoch, index)` (a plain index is epoch 0).
    transform(image, rng) -> tensor, with image a `decode.Encoded` (jpeg: the transform decodes
    it, at the scale its geometry allows) or a uint8 HxWx3 array (raw), e.g. TrainTransform /
    ValTransform; None returns the uint8 HxWx3 array itself.
    `decoder`: 'simplejpeg' or 'pillow'; None = the fastest installed (decode.jpeg_decoder).
    rng is `SampleStream(seed, epoch, index)` (its `generator()` is `sample_rng(seed, epoch,
    index)`): `seed` is the run's, so runs with other seeds crop differently.
    """

    def __init__(self, root: str | os.PathLike, split: str = "train", transform=None, *,
                 seed: int = 0, max_open: int = 64, decoder: str | None = None):
        self.split_dir = Path(root) / split
        self.manifest = readable_manifest(self.split_dir)
        self.encoding = self.manifest["encoding"]
        self.class_names = list(self.manifest["class_names"])
        self.files = [self.split_dir / s["file"] for s in self.manifest["shards"]]
        counts = [int(s["num_samples"]) for s in self.manifest["shards"]]
        self.starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        self._starts_list = self.starts.tolist()
        self.transform, self.seed, self.max_open = transform, seed, max_open
        self.decoder = decoder
        self._reset_process_state()

    def _reset_process_state(self) -> None:
        self._pid = None
        self._open: OrderedDict[int, _Shard] = OrderedDict()

    def __len__(self) -> int:
        return int(self.starts[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """Global index -> (shard number, offset in that shard)."""
        if not 0 <= index < len(self):
            raise IndexError(f"sample {index} outside 0..{len(self) - 1} of {self.split_dir}")
        # bisect_right skips shards that lost all their samples (equal starts).
        shard = bisect.bisect_right(self._starts_list, index) - 1
        return shard, index - self._starts_list[shard]

    # -- per-process state -------------------------------------------------------------------
    def _check_process(self) -> None:
        pid = os.getpid()
        if self._pid != pid:
            # Inherited through fork: forget the parent's handles without closing them.
            self._open = OrderedDict()
            self._pid = pid

    def _shard(self, k: int) -> _Shard:
        self._check_process()
        shard = self._open.get(k)
        if shard is not None:
            self._open.move_to_end(k)
            return shard
        try:
            shard = _Shard(self.files[k])
        except (OSError, KeyError, ValueError) as exc:
            raise DataError(f"{self.files[k]}: cannot open as a shard: {exc}") from None
        self._open[k] = shard
        if len(self._open) > self.max_open:
            self._open.popitem(last=False)[1].close()
        return shard

    def close(self) -> None:
        """Close the files this process opened (inherited handles are left to their owner)."""
        if self._pid == os.getpid():
            for shard in self._open.values():
                shard.close()
        self._open = OrderedDict()

    def __del__(self):
        with contextlib.suppress(Exception):   # interpreter shutdown: h5py may already be gone
            self.close()

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state.update(_pid=None, _open=OrderedDict())
        return state

    # -- reading ------------------------------------------------------------------------------
    def __getitem__(self, key: int | SampleKey):
        key = as_key(key)
        k, offset = self.locate(key.index)
        shard = self._shard(k)
        [record] = shard.records.read(np.array([offset]))
        return self._sample(shard, k, offset, record, key)

    def record(self, index: int) -> tuple[np.ndarray, int]:
        """The stored record of global `index` as it is (JPEG bytes, or raw pixels) and its label."""
        k, offset = self.locate(index)
        shard = self._shard(k)
        [record] = shard.records.read(np.array([offset]))
        return np.asarray(record), int(shard.labels[offset])

    def __getitems__(self, keys) -> list:
        """A batch in the requested order, each shard's records of it read in one pass in
        increasing order: exactly those records, never the gaps between them. A batch of the
        block-shuffled order holds about a quarter of a block's records: slices over runs with
        small gaps read 1.7x the records needed (docs/benchmarks.md)."""
        keys = [as_key(key) for key in keys]
        located = [self.locate(key.index) for key in keys]
        order = sorted(range(len(located)), key=located.__getitem__)
        out: list = [None] * len(located)
        pos = 0
        while pos < len(order):
            k = located[order[pos]][0]
            end = pos
            while end < len(order) and located[order[end]][0] == k:
                end += 1
            group = order[pos:end]
            offsets = np.array([located[i][1] for i in group])
            shard = self._shard(k)
            wanted = np.unique(offsets)               # h5py selects increasing offsets only
            records = dict(zip(wanted.tolist(), shard.records.read(wanted)))
            for i, offset in zip(group, offsets.tolist()):
                out[i] = self._sample(shard, k, offset, records[offset], keys[i])
            pos = end
        return out

    def _sample(self, shard: _Shard, k: int, offset: int, record, key: SampleKey):
        label = int(shard.labels[offset])
        if self.encoding == "raw":
            image = np.asarray(record)
            if image.shape != tuple(shard.shapes[offset]):
                self._corrupt(k, offset, f"pixels of shape {image.shape}, shapes says "
                              f"{tuple(shard.shapes[offset])}")
            if self.transform is None:
                return image, label
            return self.transform(image, SampleStream(self.seed, *key)), label
        try:
            image = open_encoded(record, self.decoder)
        except DECODE_ERRORS as exc:
            self._corrupt(k, offset, f"cannot decode: {type(exc).__name__}: {exc}")
        expected = tuple(int(v) for v in shard.shapes[offset][:2])
        if image.size != expected:
            self._corrupt(k, offset, f"decodes to {image.height}x{image.width}, shapes says "
                          f"{expected[0]}x{expected[1]}")
        try:
            # The transform decodes (a truncated record fails here), at the scale it needs.
            if self.transform is None:
                return image.pixels(), label
            return self.transform(image, SampleStream(self.seed, *key)), label
        except DECODE_ERRORS as exc:
            self._corrupt(k, offset, f"cannot decode: {type(exc).__name__}: {exc}")

    def _corrupt(self, k: int, offset: int, why: str):
        try:
            key = self._shard(k).file["keys"][offset]
            key = key.decode() if isinstance(key, bytes) else str(key)
        except Exception:  # the key is a courtesy; the shard and index are what matter
            key = "?"
        raise DataError(f"{self.files[k]} record {offset} (global index "
                        f"{self._starts_list[k] + offset}, key {key}): {why}")

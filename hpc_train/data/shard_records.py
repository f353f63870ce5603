"""The stored records of one open shard file (docs/shard-format.md), read as its layout allows.

Two layouts hold the records:
- `FlatRecords` (format 2, JPEG): every record's bytes one after another in the 1-D uint8
  dataset `encoded`, record i at `offsets[i]:offsets[i + 1]`. HDF5 stores an unchunked,
  uncompressed dataset as one contiguous extent of the file, so the file is mapped read-only and
  a record is a view of its bytes at `encoded`'s file offset plus `offsets[i]`: no copy and no
  system call, where HDF5 reads a variable-length element through its global heap (about 90 us
  for a 110 KB photo; a pread of it, about 20 us; measured: docs/benchmarks.md). A dataset
  stored otherwise is read by slicing.
- `RowRecords` (raw pixels, and format 1 JPEG): one row of `images` per record, read with one
  h5py selection of exactly the wanted rows.

Both check what they can when the file opens (offsets that do not tile `encoded` raise
DataError naming the file) and raise DataError for a record the file is too short to hold.
"""

from __future__ import annotations

import mmap
from pathlib import Path
from typing import Protocol

import numpy as np

from hpc_train.errors import DataError


class Records(Protocol):
    """Record i of a shard as a numpy array (JPEG bytes as uint8, or HxWx3 pixels)."""

    def read(self, offsets: np.ndarray) -> list[np.ndarray]:
        """The records at `offsets` (increasing, distinct), in that order."""

    def close(self) -> None:
        """Release what `read` holds open (the h5py file is its owner's to close)."""


class RowRecords:
    def __init__(self, images):
        self.images = images

    def read(self, offsets: np.ndarray) -> list[np.ndarray]:
        return list(self.images[offsets])

    def close(self) -> None:
        pass


def checked_offsets(offsets: np.ndarray, rows: int, size: int, path: Path) -> np.ndarray:
    """`offsets` as int64 if it tiles `size` bytes into `rows` records, else DataError."""
    offsets = np.asarray(offsets)
    if offsets.shape != (rows + 1,) or not np.issubdtype(offsets.dtype, np.integer):
        raise DataError(f"{path}: offsets has shape {offsets.shape} {offsets.dtype}, expected "
                        f"({rows + 1},) integers for {rows} records")
    offsets = offsets.astype(np.int64)
    if offsets[0] != 0 or offsets[-1] != size or np.any(np.diff(offsets) < 0):
        raise DataError(f"{path}: offsets do not tile the {size} bytes of encoded (first "
                        f"{offsets[0]}, last {offsets[-1]}, decreasing: {bool(np.any(np.diff(offsets) < 0))})")
    return offsets


class FlatRecords:
    def __init__(self, file, path: Path, rows: int):
        self.path = path
        self.encoded = file["encoded"]
        if self.encoded.ndim != 1 or self.encoded.dtype != np.uint8:
            raise DataError(f"{path}: encoded is {self.encoded.shape} {self.encoded.dtype}, "
                            "expected 1-D uint8")
        self.offsets = checked_offsets(file["offsets"][()], rows, self.encoded.shape[0], path)
        # None where HDF5 did not store the bytes as one extent (chunked, compressed, empty).
        self.start = self.encoded.id.get_offset()
        self.mapped = None
        if self.start is not None:
            with open(path, "rb") as f:
                self.mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)

    def read(self, offsets: np.ndarray) -> list[np.ndarray]:
        return [self._record(int(i)) for i in offsets]

    def _record(self, i: int) -> np.ndarray:
        begin, end = int(self.offsets[i]), int(self.offsets[i + 1])
        if self.mapped is None:
            return self.encoded[begin:end]
        first, last = self.start + begin, self.start + end
        if last > len(self.mapped):
            raise DataError(f"{self.path} record {i}: the file ends {last - len(self.mapped)} "
                            "bytes before the record does (truncated copy?)")
        # A view of the page cache: no copy, no system call (the decoder reads it in place).
        return np.frombuffer(self.mapped, np.uint8, end - begin, first)

    def close(self) -> None:
        if self.mapped is not None:
            try:
                self.mapped.close()
            except BufferError:     # a record still viewed: the map closes with its last view
                pass
            self.mapped = None


def open_records(file, path: Path, rows: int) -> Records:
    """The reader for this file's layout: `encoded` + `offsets` (format 2 JPEG) or `images`."""
    if "encoded" in file:
        return FlatRecords(file, path, rows)
    return RowRecords(file["images"])

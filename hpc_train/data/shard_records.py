"""The stored records of one open shard file (docs/shard-format.md), read as its layout allows.

Two layouts hold the records:
- `FlatRecords` (format 2, JPEG): every record's bytes one after another in the 1-D uint8
  dataset `encoded`, record i at `offsets[i]:offsets[i + 1]`. HDF5 stores an unchunked,
  uncompressed dataset as one contiguous extent of the file, so a record is one `pread` of its
  bytes at `encoded`'s file offset plus `offsets[i]`: about 20 us for a 110 KB photo, against
  about 90 us for the same record as a variable-length element, which HDF5 reads through its
  global heap (measured: docs/benchmarks.md). A dataset stored otherwise is read by slicing.
- `RowRecords` (raw pixels, and format 1 JPEG): one row of `images` per record, read with one
  h5py selection of exactly the wanted rows.

Both check what they can when the file opens (offsets that do not tile `encoded` raise
DataError naming the file) and raise DataError for a record the file is too short to hold.
"""

from __future__ import annotations

import os
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
        self.fd = None if self.start is None else os.open(path, os.O_RDONLY | os.O_CLOEXEC)

    def read(self, offsets: np.ndarray) -> list[np.ndarray]:
        return [self._record(int(i)) for i in offsets]

    def _record(self, i: int) -> np.ndarray:
        begin, end = int(self.offsets[i]), int(self.offsets[i + 1])
        if self.fd is None:
            return self.encoded[begin:end]
        record = np.empty(end - begin, np.uint8)
        got = os.preadv(self.fd, [record], self.start + begin)
        if got != end - begin:
            raise DataError(f"{self.path} record {i}: the file ends {end - begin - got} bytes "
                            "into it (truncated copy?)")
        return record

    def close(self) -> None:
        if self.fd is not None:
            os.close(self.fd)
            self.fd = None


def open_records(file, path: Path, rows: int) -> Records:
    """The reader for this file's layout: `encoded` + `offsets` (format 2 JPEG) or `images`."""
    if "encoded" in file:
        return FlatRecords(file, path, rows)
    return RowRecords(file["images"])

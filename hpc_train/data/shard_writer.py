"""Encode images and write one shard file plus its sidecar (docs/shard-format.md).

Output is a pure function of the inputs and settings: same sources, same bytes (HDF5 keeps no
timestamps with track_times=False, Pillow's JPEG encoder is deterministic), so any writer, rerun
or array task produces the same sha256 and the manifest is identical whoever writes it.
"""

from __future__ import annotations

import io
import json
import os
import re
import socket
from dataclasses import dataclass
from pathlib import Path

import h5py
import numpy as np
from PIL import Image

from hpc_train.data.decode import DECODE_ERRORS, with_restarts
from hpc_train.data.manifest import FORMAT_VERSION, sha256_file
from hpc_train.rundir import fsync_path
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


@dataclass(frozen=True)
class EncodeSettings:
    encoding: str = "jpeg"          # "jpeg" or "raw"
    max_side: int | None = None     # jpeg: re-encode when the longer side is larger
    quality: int = 90               # jpeg re-encode quality
    raw_size: int = 256             # raw: H = W
    restart_interval: int = 0       # jpeg: MCUs between restart markers, 0: the bytes as they are

    def describe(self) -> dict:
        """What shapes the stored bytes (goes into the per-shard fingerprint)."""
        if self.encoding == "raw":
            return {"encoding": "raw", "raw_size": self.raw_size}
        return {"encoding": "jpeg", "max_side": self.max_side, "quality": self.quality,
                "restart_interval": self.restart_interval}


class BadImage(Exception):
    """An unreadable or truncated source image; `reason` is one line."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.reason = reason


def _decode(data: bytes) -> Image.Image:
    try:
        img = Image.open(io.BytesIO(data))
        img.load()  # decodes every pixel: catches truncation, which Image.verify() misses
        return img
    except Image.UnidentifiedImageError as exc:
        # Its message names a BytesIO address, which would make report.json differ run to run.
        raise BadImage("not a recognised image format") from exc
    except DECODE_ERRORS as exc:   # a broken image, as open() or load() report one
        raise BadImage(f"{type(exc).__name__}: {_ADDRESS.sub('', str(exc))}") from exc


def _to_rgb(img: Image.Image) -> Image.Image:
    if img.mode == "RGB":
        return img
    if img.mode in ("RGBA", "LA", "PA") or (img.mode == "P" and "transparency" in img.info):
        # Composite on white: dropping alpha would expose arbitrary colours under it.
        rgba = img.convert("RGBA")
        background = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, rgba).convert("RGB")
    return img.convert("RGB")


def encode_jpeg(data: bytes, max_side: int | None, quality: int,
                restart_interval: int = 0) -> tuple[bytes, tuple[int, int, int]]:
    """Original bytes when already a small-enough RGB JPEG, else an RGB JPEG re-encode; with
    `restart_interval`, either one given restart markers (decode.with_restarts: lossless)."""
    img = _decode(data)
    too_big = max_side is not None and max(img.size) > max_side
    if img.format == "JPEG" and img.mode == "RGB" and not too_big:
        return with_restarts(data, restart_interval), (img.height, img.width, 3)
    rgb = _to_rgb(img)
    if too_big:
        scale = max_side / max(rgb.size)
        size = (max(1, round(rgb.width * scale)), max(1, round(rgb.height * scale)))
        rgb = rgb.resize(size, Image.Resampling.BICUBIC)
    out = io.BytesIO()
    rgb.save(out, format="JPEG", quality=quality)
    return with_restarts(out.getvalue(), restart_interval), (rgb.height, rgb.width, 3)


def encode_raw(data: bytes, size: int) -> np.ndarray:
    """RGB uint8 (size, size, 3): shorter side resized to `size`, centre crop."""
    rgb = _to_rgb(_decode(data))
    scale = size / min(rgb.size)
    w, h = max(size, round(rgb.width * scale)), max(size, round(rgb.height * scale))
    rgb = rgb.resize((w, h), Image.Resampling.BILINEAR)
    left, top = (w - size) // 2, (h - size) // 2
    return np.asarray(rgb.crop((left, top, left + size, top + size)), dtype=np.uint8)


@dataclass
class ShardResult:
    entry: dict                     # the manifest entry (file, num_samples, bytes, sha256, skipped)
    skipped_items: list[dict]       # [{"key", "reason"}]


def shard_name(index: int) -> str:
    return f"shard-{index:05d}.h5"


def tmp_suffix() -> str:
    return f".tmp-{socket.gethostname()}-{os.getpid()}"


def _fsync_replace(tmp: Path, final: Path) -> None:
    fsync_path(tmp)
    os.replace(tmp, final)
    fsync_path(final.parent)  # make the rename itself durable


def write_text_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + tmp_suffix())
    tmp.write_text(text)
    _fsync_replace(tmp, path)


def write_shard(out_dir: Path, index: int, split: str, class_names: list[str],
                samples: list[tuple[str, int, bytes]], settings: EncodeSettings,
                strict_error=None, fingerprint: str = "") -> ShardResult:
    """Encode `samples` (key, label, file bytes or BadImage) into shard `index`, then its sidecar.

    A bad image is dropped and recorded; `strict_error(key, reason)`, when given, is called
    first so --strict can raise instead.
    """
    images, labels, keys, shapes, skipped = [], [], [], [], []
    for key, label, data in samples:
        try:
            if isinstance(data, BadImage):  # the file could not even be read
                raise data
            if settings.encoding == "raw":
                pixels = encode_raw(data, settings.raw_size)
                images.append(pixels)
                shapes.append(pixels.shape)
            else:
                encoded, shape = encode_jpeg(data, settings.max_side, settings.quality,
                                             settings.restart_interval)
                images.append(np.frombuffer(encoded, dtype=np.uint8))
                shapes.append(shape)
        except BadImage as exc:
            if strict_error is not None:
                strict_error(key, exc.reason)
            skipped.append({"key": key, "reason": exc.reason})
            continue
        labels.append(label)
        keys.append(key)

    n = len(keys)
    final = out_dir / shard_name(index)
    tmp = final.with_name(final.name + tmp_suffix())
    with h5py.File(tmp, "w") as f:
        if settings.encoding == "raw":
            s = settings.raw_size
            data = np.stack(images) if images else np.zeros((0, s, s, 3), np.uint8)
            # One image per chunk: a random read touches one image. HDF5 cannot chunk an empty
            # dataset without a maxshape, so a shard whose images were all skipped stays contiguous.
            f.create_dataset("images", data=data, chunks=(1, s, s, 3) if n else None,
                             track_times=False)
        else:
            # The records one after another, unchunked (HDF5 then stores them as one extent, so
            # a reader maps the file and views a record: shard_records.FlatRecords), and where each one starts.
            lengths = np.array([len(buf) for buf in images], dtype=np.int64)
            f.create_dataset("encoded", data=np.concatenate(images) if n else np.zeros(0, np.uint8),
                             track_times=False)
            f.create_dataset("offsets", data=np.concatenate([[0], np.cumsum(lengths)]).astype(np.int64),
                             track_times=False)
        f.create_dataset("labels", data=np.asarray(labels, dtype=np.int64).reshape(n),
                         track_times=False)
        f.create_dataset("keys", data=keys, shape=(n,), dtype=h5py.string_dtype("utf-8"),
                         track_times=False)
        f.create_dataset("shapes", data=np.asarray(shapes, dtype=np.int32).reshape(n, 3),
                         track_times=False)
        f.attrs["format_version"] = FORMAT_VERSION
        f.attrs["encoding"] = settings.encoding
        f.attrs["split"] = split
        f.attrs["num_samples"] = n
        f.attrs["class_names"] = json.dumps(class_names)
        f.attrs["shard_index"] = index
        if settings.encoding == "raw":
            f.attrs["raw_size"] = settings.raw_size
    _fsync_replace(tmp, final)

    entry = {"file": final.name, "num_samples": n, "bytes": final.stat().st_size,
             "sha256": sha256_file(final), "skipped": len(skipped)}
    sidecar = dict(entry, skipped_items=skipped, fingerprint=fingerprint)
    write_text_atomic(final.with_name(final.name + ".json"), json.dumps(sidecar, indent=1) + "\n")
    return ShardResult(entry, skipped)

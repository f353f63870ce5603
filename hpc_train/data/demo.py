"""`data demo`: a small, learnable ImageNet look-alike of real image files.

Each class is oriented stripes (class-specific angle and period) over a tint from a palette of
three colours shared by several classes, with random phase, scale, a random blob and pixel noise.
No single pixel gives the class away (colour is shared, stripes move), yet a small CNN separates
them in a few epochs. Sizes vary (56-80 px, rarely square), a few files are PNG and one is
greyscale, so the converter's resize and re-encode paths all run. Same seed, same bytes.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image

from hpc_train.errors import DataError

_PALETTE = np.array([[220, 70, 60], [60, 160, 220], [90, 200, 80]], dtype=np.float32)
_PERIODS = (6.0, 9.0, 13.0)


@dataclass(frozen=True)
class DemoSummary:
    root: Path
    classes: list[str]
    train_files: int
    val_files: int


def class_name(k: int) -> str:
    return f"n{k:08d}"  # synset-like, sorts in index order like ImageNet's


def make_image(k: int, num_classes: int, rng: np.random.Generator, base: int = 64,
               photo: bool = False) -> np.ndarray:
    """One HxWx3 uint8 sample of class k. photo: shaped like an ImageNet photo (long side
    ~base, 4:3, one in four portrait) instead of nearly square."""
    h, w = (int(v) for v in rng.integers(base - 8, base + 17, size=2))
    if photo:
        h = int(round(w * 3 / 4))
        if rng.random() < 0.25:
            h, w = w, h
    angle = np.pi * k / num_classes + rng.normal(0, 0.04)
    period = _PERIODS[k % len(_PERIODS)] * rng.uniform(0.85, 1.15)
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float32)
    phase = rng.uniform(0, 2 * np.pi)
    stripes = 0.5 + 0.5 * np.sin(2 * np.pi * (xx * np.cos(angle) + yy * np.sin(angle)) / period + phase)
    # A soft blob at a random place: position jitter the network must ignore.
    cy, cx, r = rng.uniform(0, h), rng.uniform(0, w), rng.uniform(6, 14)
    blob = np.exp(-((yy - cy) ** 2 + (xx - cx) ** 2) / (2 * r * r))
    tint = _PALETTE[k % len(_PALETTE)] * rng.uniform(0.8, 1.1, size=3)
    pixels = (40 + stripes[..., None] * tint[None, None, :] * 0.8
              + blob[..., None] * 60 + rng.normal(0, 18, size=(h, w, 3)))
    return np.clip(pixels, 0, 255).astype(np.uint8)


def _encode(pixels: np.ndarray, fmt: str, grey: bool = False) -> bytes:
    img = Image.fromarray(pixels, "RGB")
    if grey:
        img = img.convert("L")
    out = io.BytesIO()
    img.save(out, format=fmt, **({"quality": 90} if fmt == "JPEG" else {}))
    return out.getvalue()


def write_demo(out: Path, classes: int = 10, per_class: int = 60, val_per_class: int = 10,
               size: int = 64, seed: int = 0, photo: bool = False) -> DemoSummary:
    if classes < 2 or per_class < 1 or val_per_class < 0 or size < 16:
        raise DataError("demo: need --classes >= 2, --per-class >= 1, --val-per-class >= 0, "
                        "--size >= 16")
    out = Path(out)
    if any(p.exists() and any(p.iterdir()) for p in (out / "train", out / "val")):
        raise DataError(f"{out}: already holds train/ or val/; choose an empty --out")
    rng = np.random.default_rng(seed)
    names = [class_name(k) for k in range(classes)]
    train_files = 0
    for k, name in enumerate(names):
        folder = out / "train" / name
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(per_class):
            pixels = make_image(k, classes, rng, size, photo)
            # Every 20th image is a PNG and the very first one is greyscale: the converter must
            # re-encode both as RGB JPEG.
            if i % 20 == 7 and not photo:   # photo: all JPEG, so bench baselines decode JPEG
                (folder / f"{name}_{i}.png").write_bytes(_encode(pixels, "PNG"))
            else:
                grey = k == 0 and i == 0 and not photo
                (folder / f"{name}_{i}.JPEG").write_bytes(_encode(pixels, "JPEG", grey))
            train_files += 1
    val = out / "val"
    val.mkdir(parents=True, exist_ok=True)
    # Interleave classes like ImageNet's validation numbering, labels only in val_labels.txt.
    val_labels = [int(v) for v in rng.permutation(np.repeat(np.arange(classes), val_per_class))]
    lines = []
    for j, k in enumerate(val_labels, start=1):
        fname = f"ILSVRC2012_val_{j:08d}.JPEG"
        (val / fname).write_bytes(_encode(make_image(k, classes, rng, size, photo), "JPEG"))
        lines.append(f"{fname} {names[k]}\n")
    (out / "val_labels.txt").write_text("".join(lines))
    return DemoSummary(out, names, train_files, len(lines))

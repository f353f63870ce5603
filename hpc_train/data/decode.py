"""Encoded image bytes -> uint8 RGB pixels, decoded no larger and no wider than the transform needs.

Two steps, so a transform can choose the region and scale *after* it knows the geometry:
`open_encoded` reads only the header (the size), `Encoded.pixels(reduce)` decodes the whole
image and `Encoded.region(top, left, height, width, reduce)` only a box of it. JPEG decoding is
the largest CPU cost of the input pipeline, so the fastest decoder available is used:

- cropjpeg (`_cropjpeg.c`, built by env/setup.sh against the system libjpeg-turbo): decodes only
  the rows and columns of the box (jpeg_crop_scanline, jpeg_skip_scanlines, stop after the last
  row). Its pixels equal a full decode then crop, bit for bit (tests/data/test_cropjpeg.py).
  Where the file has restart markers that tile its rows (shards get them: `with_restarts`), it
  entropy-decodes only the intervals that cover the box (`_jpeg_intervals.c`), not every MCU
  above and beside it.
  Progressive files too: libjpeg entropy-decodes all their scans of the whole image first, so a
  region takes about as long as a full decode there (0.9-1.1x, measured): kept, not passed on.
- simplejpeg (libjpeg-turbo linked into its wheel: nothing to build). Its output is bit-identical
  to Pillow's default decode (both libjpeg-turbo, accurate IDCT, fancy upsampling); it is faster
  because it writes RGB straight into a numpy array, where Pillow decodes into its own
  4-byte-per-pixel image and copies out (measured in docs/benchmarks.md).
- Pillow, when neither is there, for CMYK/YCCK JPEGs (Pillow knows Adobe's inverted CMYK) and
  for any other format. `HPC_TRAIN_JPEG_DECODER` names the fastest one to use (tests,
  comparisons): cropjpeg, simplejpeg or pillow; one not installed gives way to the next.

Images the chosen decoder passes to a slower one are counted in `FALLBACKS` (this process's
reasons -> images), so a dataset or the bench can say how many took the slow path.

`reduce` in 1, 2, 4, 8 asks libjpeg for a DCT-domain downscale (most IDCT work skipped): the
transforms pick the largest factor that still leaves the crop at least the output size, so no
pixel of the output is upsampled that a full decode would not have upsampled. Only powers of two:
libjpeg's k/8 factors cost more per pixel than a full decode (measured).

Errors: Pillow raises OSError, SyntaxError, ValueError, EOFError or DecompressionBombError;
simplejpeg and cropjpeg ValueError. `DECODE_ERRORS` lists them so the dataset turns any of them
into one DataError naming the shard and record.
"""

from __future__ import annotations

import enum
import os
from collections import Counter
from io import BytesIO

import numpy as np
from PIL import Image

try:  # optional: pip install 'hpc-train[fast-jpeg]'
    import simplejpeg
except ImportError:  # pragma: no cover - depends on the environment
    simplejpeg = None
try:  # optional: built by env/setup.sh (python -m hpc_train.data.cropjpeg_build)
    from hpc_train.data import _cropjpeg
except ImportError:  # pragma: no cover - depends on the environment
    _cropjpeg = None

DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)
DECODER_ENV = "HPC_TRAIN_JPEG_DECODER"
DECODERS = ("cropjpeg", "simplejpeg", "pillow")   # fastest first
REDUCTIONS = (8, 4, 2, 1)
_JPEG_SOI = b"\xff\xd8"
_TO_RGB = ("YCbCr", "Gray", "RGB")   # JPEG colour spaces libjpeg converts to RGB like Pillow


class Fallback(enum.Enum):
    """Why an image went from the chosen decoder to a slower one."""
    NOT_JPEG = "not a JPEG"
    CMYK = "CMYK or YCCK JPEG"           # libjpeg's RGB of Adobe's inverted CMYK would differ
    BAD_HEADER = "unreadable JPEG header"   # Pillow reads it and reports what is wrong


FALLBACKS: Counter = Counter()   # Fallback -> images, in this process


def installed_decoders() -> list[str]:
    """The JPEG decoders this process can use, fastest first (pillow always)."""
    present = {"cropjpeg": _cropjpeg is not None, "simplejpeg": simplejpeg is not None}
    return [name for name in DECODERS if present.get(name, True)]


def jpeg_decoder(environ=os.environ) -> str:
    """The fastest installed decoder, no faster than HPC_TRAIN_JPEG_DECODER names (if set)."""
    wanted = environ.get(DECODER_ENV, "").strip().lower()
    if wanted not in ("", *DECODERS):
        raise ValueError(f"{DECODER_ENV}={wanted!r}: expected one of {', '.join(DECODERS)}")
    allowed = DECODERS[DECODERS.index(wanted):] if wanted else DECODERS
    return next(name for name in installed_decoders() if name in allowed)


def with_restarts(data: bytes, interval: int) -> bytes:
    """The same JPEG with a restart marker every `interval` MCUs (fewer where that does not
    divide a row), so cropjpeg decodes a crop from its own intervals only. Lossless: libjpeg
    copies the DCT coefficients, and only the Huffman coding is new (optimal tables, so the file
    is usually no larger). The bytes as they are when that cannot help or cannot be done: no
    cropjpeg here, a colour space other than YCbCr and grey, or a file libjpeg refuses."""
    if _cropjpeg is None or interval < 1:
        return data
    try:
        marked = _cropjpeg.with_restarts(data, interval)
    except ValueError:
        return data
    return data if marked is None else marked


def largest_reduction(short_side: float, needed: float) -> int:
    """The largest of 8, 4, 2, 1 that keeps `short_side / factor >= needed` (1 if none does)."""
    return next((factor for factor in REDUCTIONS if short_side >= factor * needed), 1)


def _as_bytes(data) -> bytes | memoryview:
    return memoryview(np.ascontiguousarray(data)) if isinstance(data, np.ndarray) else data


def _jpeg_header(data, decoder: str) -> tuple[tuple[int, int] | None, Fallback | None]:
    """((height, width), None) where `decoder` can decode the image, else (None, why not)."""
    if bytes(data[:2]) != _JPEG_SOI:
        return None, Fallback.NOT_JPEG
    try:
        if decoder == "cropjpeg":
            height, width, colorspace, _ = _cropjpeg.header(data)
        else:
            height, width, colorspace, _ = simplejpeg.decode_jpeg_header(data)
    except ValueError:
        return None, Fallback.BAD_HEADER
    return ((height, width), None) if colorspace in _TO_RGB else (None, Fallback.CMYK)


class Encoded:
    """One encoded image: its size from the header, pixels decoded on request.

    `decoder` is the one that decodes this image: the one asked for, or pillow where that one
    cannot (then `fallback` says why, and FALLBACKS counts it)."""

    def __init__(self, data, decoder: str | None = None):
        self.data = _as_bytes(data)
        self.decoder = decoder or jpeg_decoder()
        self.fallback: Fallback | None = None
        self._pil: Image.Image | None = None
        header = None
        if self.decoder != "pillow":
            header, self.fallback = _jpeg_header(self.data, self.decoder)
        if self.fallback is not None:
            FALLBACKS[self.fallback] += 1
            self.decoder = "pillow"
        if header is None:
            self._pil = Image.open(BytesIO(self.data))
            width, height = self._pil.size
            header = (height, width)
        self.height, self.width = header

    @property
    def size(self) -> tuple[int, int]:
        """(height, width) in the file header, before any reduction."""
        return self.height, self.width

    @property
    def decodes_regions(self) -> bool:
        """Whether `region` decodes only its box (else it crops a whole decode)."""
        return self.decoder == "cropjpeg"

    def reduced_size(self, reduce: int) -> tuple[int, int]:
        """(height, width) of the 1/`reduce` decode: sides rounded up, as libjpeg does."""
        return -(-self.height // reduce), -(-self.width // reduce)

    def pixels(self, reduce: int = 1) -> np.ndarray:
        """uint8 RGB HxWx3, decoded at 1/`reduce` scale (sides rounded up, as libjpeg does)."""
        if self.decoder == "cropjpeg":
            return self.region(0, 0, *self.reduced_size(reduce), reduce)
        return self._pillow(reduce) if self.decoder == "pillow" else self._simplejpeg(reduce)

    def region(self, top: int, left: int, height: int, width: int, reduce: int = 1) -> np.ndarray:
        """uint8 RGB height x width x 3: the box at (top, left) of the 1/`reduce` decode.

        cropjpeg decodes only the box; the others decode the whole image and return a view."""
        if self.decoder != "cropjpeg":
            return self.pixels(reduce)[top:top + height, left:left + width]
        out = np.empty((height, width, 3), np.uint8)
        _cropjpeg.decode_into(self.data, out, top, left, reduce)
        return out

    def _simplejpeg(self, reduce: int) -> np.ndarray:
        if reduce == 1:
            return simplejpeg.decode_jpeg(self.data, colorspace="RGB")
        # The largest libjpeg factor >= min_factor whose output still has the minimum sides.
        min_height, min_width = self.reduced_size(reduce)
        return simplejpeg.decode_jpeg(self.data, colorspace="RGB", min_factor=reduce,
                                      min_height=min_height, min_width=min_width)

    def _pillow(self, reduce: int) -> np.ndarray:
        img, self._pil = self._pil, None   # draft acts only before load: a fresh one next time
        if img is None:
            img = Image.open(BytesIO(self.data))
        if reduce > 1 and img.format == "JPEG":
            # 'RGB' also lets libjpeg convert YCbCr itself; greyscale/CMYK convert below.
            # Pillow picks the largest scale keeping both sides >= the request: ask floor(side / r).
            img.draft("RGB", (self.width // reduce, self.height // reduce))
        img.load()   # inside the caller's try: a truncated file fails here
        if img.mode != "RGB":
            img = img.convert("RGB")
        return np.array(img, dtype=np.uint8)   # writable: torch.from_numpy takes it as is


def open_encoded(data, decoder: str | None = None) -> Encoded:
    """Read the header of encoded image bytes (bytes or a uint8 array); decode nothing yet."""
    return Encoded(data, decoder)

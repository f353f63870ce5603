"""Encoded image bytes -> uint8 RGB pixels, decoded no larger than the transform needs.

Two steps, so a transform can choose the scale *after* it knows the geometry: `open_encoded`
reads only the header (the size), `Encoded.pixels(reduce)` decodes. JPEG decoding is the largest
CPU cost of the input pipeline, so the fastest decoder available is used:

- simplejpeg (libjpeg-turbo linked into its wheel: nothing to install on a login node). Its
  output is bit-identical to Pillow's default decode (both libjpeg-turbo, accurate IDCT, fancy
  upsampling); it is faster because it writes RGB straight into a numpy array, where Pillow
  decodes into its own 4-byte-per-pixel image and copies out (measured in docs/benchmarks.md).
- Pillow, when simplejpeg is not installed, for CMYK JPEGs (Pillow knows Adobe's inverted
  CMYK) and for any other format. `HPC_TRAIN_JPEG_DECODER=pillow` forces it (tests, comparisons).

`reduce` in 1, 2, 4, 8 asks libjpeg for a DCT-domain downscale (most IDCT work skipped): the
transforms pick the largest factor that still leaves the crop at least the output size, so no
pixel of the output is upsampled that a full decode would not have upsampled. Only powers of two:
libjpeg's k/8 factors cost more per pixel than a full decode (measured).

Errors: Pillow raises OSError, SyntaxError, ValueError, EOFError or DecompressionBombError;
simplejpeg ValueError. `DECODE_ERRORS` lists them so the dataset turns any of them into one
DataError naming the shard and record.
"""

from __future__ import annotations

import os
from io import BytesIO

import numpy as np
from PIL import Image

try:  # optional: pip install 'hpc-train[fast-jpeg]'
    import simplejpeg
except ImportError:  # pragma: no cover - depends on the environment
    simplejpeg = None

DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)
DECODER_ENV = "HPC_TRAIN_JPEG_DECODER"
REDUCTIONS = (8, 4, 2, 1)
_JPEG_SOI = b"\xff\xd8"
_TO_RGB = ("YCbCr", "Gray", "RGB")   # JPEG colour spaces libjpeg converts to RGB like Pillow


def jpeg_decoder(environ=os.environ) -> str:
    """'simplejpeg' when installed and not overridden by HPC_TRAIN_JPEG_DECODER=pillow."""
    wanted = environ.get(DECODER_ENV, "").strip().lower()
    if wanted not in ("", "simplejpeg", "pillow"):
        raise ValueError(f"{DECODER_ENV}={wanted!r}: expected simplejpeg or pillow")
    return "simplejpeg" if simplejpeg is not None and wanted != "pillow" else "pillow"


def largest_reduction(short_side: float, needed: float) -> int:
    """The largest of 8, 4, 2, 1 that keeps `short_side / factor >= needed` (1 if none does)."""
    return next((factor for factor in REDUCTIONS if short_side >= factor * needed), 1)


def _as_bytes(data) -> bytes | memoryview:
    return memoryview(np.ascontiguousarray(data)) if isinstance(data, np.ndarray) else data


class Encoded:
    """One encoded image: its size from the header, pixels decoded on request."""

    def __init__(self, data, decoder: str | None = None):
        self.data = _as_bytes(data)
        self.decoder = decoder or jpeg_decoder()
        self._pil: Image.Image | None = None
        header = None
        if self.decoder == "simplejpeg" and bytes(self.data[:2]) == _JPEG_SOI:
            try:
                height, width, colorspace, _ = simplejpeg.decode_jpeg_header(self.data)
                # CMYK/YCCK: Pillow knows Adobe's inverted CMYK; libjpeg's RGB would differ.
                header = (height, width) if colorspace in _TO_RGB else None
            except ValueError:
                header = None   # let Pillow read it (and report what is wrong with it)
        self._pillow_only = header is None
        if header is None:
            self._pil = Image.open(BytesIO(self.data))
            width, height = self._pil.size
            header = (height, width)
        self.height, self.width = header

    @property
    def size(self) -> tuple[int, int]:
        """(height, width) in the file header, before any reduction."""
        return self.height, self.width

    def pixels(self, reduce: int = 1) -> np.ndarray:
        """uint8 RGB HxWx3, decoded at 1/`reduce` scale (sides rounded up, as libjpeg does)."""
        return self._pillow(reduce) if self._pillow_only else self._simplejpeg(reduce)

    def _simplejpeg(self, reduce: int) -> np.ndarray:
        if reduce == 1:
            return simplejpeg.decode_jpeg(self.data, colorspace="RGB")
        # The largest libjpeg factor >= min_factor whose output still has the minimum sides.
        return simplejpeg.decode_jpeg(self.data, colorspace="RGB", min_factor=reduce,
                                      min_height=-(-self.height // reduce),
                                      min_width=-(-self.width // reduce))

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

"""JPEG bytes -> RGB PIL image, decoded no larger than the transform needs.

`Image.draft` asks libjpeg to decode at 1/2, 1/4 or 1/8 scale (it skips most of the IDCT work),
which is the largest single saving in a CPU input pipeline when the stored image is at least twice
the size the transform produces. Pillow only picks a scale that keeps *both* sides >= the
requested size, so an image merely somewhat larger than the target is decoded at full size.

Errors: Pillow raises OSError (truncated data, bad marker), SyntaxError (not an image),
ValueError or DecompressionBombError depending on the damage. `DECODE_ERRORS` lists them so the
dataset can turn any of them into one DataError naming the shard and record.
"""

from __future__ import annotations

from io import BytesIO

from PIL import Image

DECODE_ERRORS = (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError)


def decode_image(data, draft_to: int | None = None) -> tuple[Image.Image, tuple[int, int]]:
    """Decode encoded image bytes (bytes or a uint8 array) to RGB.

    Returns (image, (height, width) stored in the file header, before any draft reduction), so
    a caller can check the record against the shard's `shapes` entry. `draft_to`: the smallest
    side length the caller needs; None decodes at full size.
    """
    img = Image.open(BytesIO(data))
    width, height = img.size
    if draft_to and img.format == "JPEG" and min(width, height) >= 2 * draft_to:
        # 'RGB' here also lets libjpeg convert YCbCr -> RGB itself. Greyscale/CMYK keep their
        # mode and are converted below.
        img.draft("RGB", (draft_to, draft_to))
    # load() inside the caller's try: a truncated file fails here, not later in a transform.
    img.load()
    if img.mode != "RGB":
        img = img.convert("RGB")
    return img, (height, width)

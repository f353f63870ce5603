"""The crop-region decoder (`_cropjpeg.c`) against a full decode then crop, and its fallbacks.

Pixels of a region equal a full decode (simplejpeg, else Pillow: both libjpeg-turbo with the
same accurate IDCT and fancy upsampling) cropped to the region, bit for bit, over random regions
of images whose sides are no multiple of the MCU, in 4:4:4, 4:2:2, 4:2:0, greyscale and
progressive files, at every DCT reduction. libjpeg's jpeg_crop_scanline upsamples chroma as if
the widened region's first and last columns were the image's edges: decoded so, a region's edge
columns differ from a full decode by up to ~40 levels on noisy chroma (measured on these
images). The decoder decodes one column more on each side, so those columns fall outside the
region; hence equality, not a tolerance, is asserted everywhere. Rows need no margin: libjpeg
decodes the rows before the first one read with their context.

Files with restart markers (what `data shard` writes: `decode.with_restarts`, lossless) are cut
to the intervals that cover a region, plus a margin; the same regions of them must equal a full
decode of the *original* file, bit for bit.
"""

from __future__ import annotations

import io
import threading

import numpy as np
import pytest
import torch
from PIL import Image, ImageFile

from hpc_train.data import cropjpeg_build, decode
from hpc_train.data.decode import Fallback, open_encoded
from hpc_train.data.transforms import TrainTransform, ValTransform

pytestmark = pytest.mark.skipif(decode._cropjpeg is None,
                                reason="cropjpeg not built (python -m hpc_train.data.cropjpeg_build)")

SUBSAMPLING = {"4:4:4": 0, "4:2:2": 1, "4:2:0": 2}


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _noisy(height: int, width: int, seed: int) -> np.ndarray:
    """Stripes plus noise in every channel: chroma that changes from pixel to pixel, where any
    upsampling difference shows."""
    rng = np.random.default_rng(seed)
    x = np.arange(width)[None, :, None]
    pixels = 60 + 60 * np.sin(x / (5 + 3 * np.arange(3))) + rng.integers(0, 128, (height, width, 3))
    return np.clip(pixels, 0, 255).astype(np.uint8)


def _jpeg(pixels: np.ndarray, subsampling: str = "4:2:0", mode: str = "RGB",
          progressive: bool = False) -> bytes:
    out = io.BytesIO()
    before, ImageFile.MAXBLOCK = ImageFile.MAXBLOCK, 1 << 24   # progressive needs one buffer
    try:
        Image.fromarray(pixels).convert(mode).save(out, format="JPEG", quality=90,
                                                   subsampling=SUBSAMPLING[subsampling],
                                                   progressive=progressive)
    finally:
        ImageFile.MAXBLOCK = before
    return out.getvalue()


def _full(data: bytes, reduce: int) -> np.ndarray:
    """The reference: a whole decode at 1/reduce by a decoder that is not the one under test."""
    reference = "simplejpeg" if decode.simplejpeg is not None else "pillow"
    if reference == "pillow" and reduce > 1:
        pytest.skip("reduced references need simplejpeg (Pillow's draft may pick another scale)")
    return open_encoded(data, reference).pixels(reduce)


def _random_regions(height: int, width: int, rng: np.random.Generator, count: int):
    for _ in range(count):
        h, w = int(rng.integers(1, height + 1)), int(rng.integers(1, width + 1))
        yield int(rng.integers(0, height - h + 1)), int(rng.integers(0, width - w + 1)), h, w


@pytest.mark.parametrize("subsampling, mode, progressive", [
    ("4:2:0", "RGB", False), ("4:2:2", "RGB", False), ("4:4:4", "RGB", False),
    ("4:2:0", "L", False), ("4:2:0", "RGB", True)])
@pytest.mark.parametrize("height, width", [(375, 500), (333, 497), (61, 83)])
def test_regions_equal_a_full_decode_then_crop(subsampling, mode, progressive, height, width):
    data = _jpeg(_noisy(height, width, height), subsampling, mode, progressive)
    rng = np.random.default_rng(width)
    for reduce in (1, 2, 4, 8):
        image = open_encoded(data, "cropjpeg")
        assert image.decodes_regions and image.fallback is None
        full = _full(data, reduce)
        assert full.shape[:2] == image.reduced_size(reduce)
        assert np.array_equal(image.pixels(reduce), full)
        regions = [(0, 0, *full.shape[:2]), (0, 0, 1, 1),                    # whole, a corner
                   (full.shape[0] - 1, full.shape[1] - 1, 1, 1),            # the other corner
                   (full.shape[0] - 1, 0, 1, 1), (1, 0, full.shape[0] - 1, 1),   # one column at x 0
                   *_random_regions(*full.shape[:2], rng, 30)]
        for top, left, h, w in regions:
            region = image.region(top, left, h, w, reduce)
            assert region.shape == (h, w, 3) and region.flags.writeable
            assert np.array_equal(region, full[top:top + h, left:left + w]), (reduce, top, left, h, w)


def test_greyscale_decodes_to_rgb_as_pillow_converts_it():
    data = _jpeg(_noisy(90, 70, 1), mode="L")
    reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert np.array_equal(open_encoded(data, "cropjpeg").pixels(), reference)


@pytest.mark.parametrize("size", [224, 96])
def test_transforms_give_the_whole_decode_paths_output(size, jpeg_decoders):
    """Bit for bit, cropped or DCT-reduced (the large images at 96 px are reduced 2-8x)."""
    whole = next(d for d in jpeg_decoders[::-1] if d != "cropjpeg")
    for side, seed in ((300, 0), (520, 1), (1100, 2)):
        data = _jpeg(_noisy(side * 3 // 4, side, seed))
        for k in range(12):
            ours = TrainTransform(size, normalize=False)(open_encoded(data, "cropjpeg"),
                                                         np.random.default_rng(k))
            theirs = TrainTransform(size, normalize=False)(open_encoded(data, whole),
                                                           np.random.default_rng(k))
            assert torch.equal(ours, theirs), (side, k)
        assert torch.equal(ValTransform(size)(open_encoded(data, "cropjpeg")),
                           ValTransform(size)(open_encoded(data, whole)))


def _cmyk_jpeg() -> bytes:
    out = io.BytesIO()
    Image.fromarray(_noisy(40, 50, 3)).convert("CMYK").save(out, format="JPEG")
    return out.getvalue()


def _png() -> bytes:
    out = io.BytesIO()
    Image.fromarray(_noisy(40, 50, 4)).save(out, format="PNG")
    return out.getvalue()


@pytest.mark.parametrize("make, reason", [(_cmyk_jpeg, Fallback.CMYK), (_png, Fallback.NOT_JPEG)])
def test_what_it_cannot_decode_goes_to_pillow_and_is_counted(make, reason):
    data = make()
    before = decode.FALLBACKS[reason]
    image = open_encoded(data, "cropjpeg")
    assert (image.decoder, image.fallback, image.decodes_regions) == ("pillow", reason, False)
    assert decode.FALLBACKS[reason] == before + 1
    reference = np.asarray(Image.open(io.BytesIO(data)).convert("RGB"))
    assert np.array_equal(image.pixels(), reference)
    assert np.array_equal(image.region(5, 7, 20, 30), reference[5:25, 7:37])
    out = TrainTransform(32, normalize=False)(image, np.random.default_rng(0))
    assert out.shape == (3, 32, 32)


def test_a_damaged_header_goes_to_pillow_which_says_what_is_wrong():
    data = b"\xff\xd8\xff\xe0" + b"\x00" * 40
    before = decode.FALLBACKS[Fallback.BAD_HEADER]
    with pytest.raises(decode.DECODE_ERRORS):
        open_encoded(data, "cropjpeg")
    assert decode.FALLBACKS[Fallback.BAD_HEADER] == before + 1


def test_progressive_jpegs_are_decoded_not_passed_on():
    """Progressive files decode in the region decoder (same pixels, tested above); libjpeg must
    entropy-decode all their scans first, so a region saves less there (measured 0.9-1.1x)."""
    image = open_encoded(_jpeg(_noisy(64, 80, 5), progressive=True), "cropjpeg")
    assert image.decodes_regions and image.fallback is None


def test_errors_are_value_errors_never_a_crash():
    from hpc_train.data import _cropjpeg

    data = _jpeg(_noisy(64, 80, 6))
    with pytest.raises(ValueError, match="outside the 64x80 decode at 1/1"):
        open_encoded(data, "cropjpeg").region(60, 0, 8, 8)
    with pytest.raises(ValueError, match="outside"):
        open_encoded(data, "cropjpeg").region(0, 0, 9, 11, 8)          # 1/8: 8x10
    with pytest.raises(ValueError, match="scale_denom 3"):
        _cropjpeg.decode_into(data, np.empty((4, 4, 3), np.uint8), 0, 0, 3)
    with pytest.raises(ValueError, match="HxWx3"):
        _cropjpeg.decode_into(data, np.empty((4, 4), np.uint8), 0, 0, 1)
    with pytest.raises(ValueError):
        _cropjpeg.decode_into(b"\xff\xd8garbage" * 10, np.empty((4, 4, 3), np.uint8), 0, 0, 1)
    with pytest.raises(ValueError):                                      # truncated: not grey
        open_encoded(data[: len(data) // 2], "cropjpeg").pixels()
    with pytest.raises(ValueError):
        _cropjpeg.header(b"\xff\xd8")


def test_threads_decode_at_once_with_the_same_result():
    """The decoder releases the GIL; concurrent decodes must not share state."""
    data = _jpeg(_noisy(240, 320, 7))
    expected = open_encoded(data, "cropjpeg").region(17, 33, 150, 200)
    results = []

    def work():
        for _ in range(20):
            results.append(open_encoded(data, "cropjpeg").region(17, 33, 150, 200))

    threads = [threading.Thread(target=work) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(results) == 80 and all(np.array_equal(r, expected) for r in results)


def test_build_is_skipped_when_up_to_date_and_fails_softly(monkeypatch, capsys):
    assert cropjpeg_build.up_to_date()                      # the import above found it built
    assert cropjpeg_build.main([]) == 0
    assert "up to date" in capsys.readouterr().out
    monkeypatch.setattr(cropjpeg_build, "compile_command",
                        lambda output: ["/nonexistent/cc", str(output)])
    ok, what = cropjpeg_build.build(force=True)
    assert not ok and "no C compiler" in what
    assert cropjpeg_build.up_to_date()                      # the built library is untouched


# ---- restart intervals: shards get markers, a crop decodes only the intervals covering it ----

@pytest.mark.parametrize("subsampling, mode, progressive", [
    ("4:2:0", "RGB", False), ("4:2:2", "RGB", False), ("4:4:4", "RGB", False),
    ("4:2:0", "L", False), ("4:2:0", "RGB", True)])
@pytest.mark.parametrize("height, width", [(375, 500), (333, 497), (61, 83)])
@pytest.mark.parametrize("interval", [1, 3, 65535])   # every MCU, pieces of a row, whole rows
def test_marked_regions_equal_the_original_s_full_decode(subsampling, mode, progressive, height,
                                                         width, interval):
    from hpc_train.data import _cropjpeg

    original = _jpeg(_noisy(height, width, height), subsampling, mode, progressive)
    data = decode.with_restarts(original, interval)
    layout = _cropjpeg.intervals(data)
    assert data != original and layout is not None
    assert layout["mcus_per_row"] % layout["interval"] == 0 or layout["per_row"] == 1
    rng = np.random.default_rng(width + interval)
    for reduce in (1, 2, 4, 8):
        full = _full(original, reduce)          # the file as it was: the transcode is lossless
        assert np.array_equal(open_encoded(data, "cropjpeg").pixels(reduce), full)
        height_r, width_r = full.shape[:2]
        regions = [(0, 0, 1, 1), (height_r - 1, width_r - 1, 1, 1), (0, 0, height_r, 1),
                   (0, width_r - 1, height_r, 1), *_random_regions(height_r, width_r, rng, 30)]
        cuts = []
        for top, left, h, w in regions:
            out = np.empty((h, w, 3), np.uint8)
            cuts.append(_cropjpeg.decode_into(data, out, top, left, reduce))
            assert np.array_equal(out, full[top:top + h, left:left + w]), (reduce, top, left, h, w)
        assert cuts[0] and cuts[1]          # the corners: decoded from their intervals alone


def test_intervals_are_rounded_down_to_tile_each_row():
    from hpc_train.data import _cropjpeg

    data = _jpeg(_noisy(64, 500, 8))                   # 4:2:0: 32 MCUs of 16 px per row
    assert _cropjpeg.intervals(decode.with_restarts(data, 3))["interval"] == 2
    assert _cropjpeg.intervals(decode.with_restarts(data, 8))["per_row"] == 4
    whole_rows = _cropjpeg.intervals(decode.with_restarts(data, 70))
    assert (whole_rows["interval"], whole_rows["per_row"]) == (32, 1)
    assert _cropjpeg.intervals(data) is None           # no markers: decoded as before


def test_markers_that_straddle_rows_are_decoded_whole_with_the_same_pixels():
    """Pillow's encoder can put a marker every 5 MCUs, which no cut of a box can use."""
    from hpc_train.data import _cropjpeg

    pixels = _noisy(120, 500, 9)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90, restart_marker_blocks=5)
    data = out.getvalue()
    assert _cropjpeg.intervals(data) is None
    box = np.empty((40, 60, 3), np.uint8)
    assert _cropjpeg.decode_into(data, box, 30, 200, 1) is False
    assert np.array_equal(box, _full(data, 1)[30:70, 200:260])


def test_the_transcode_keeps_the_file_s_markers_and_leaves_what_it_cannot_mark():
    from hpc_train.data import _cropjpeg

    out, exif = io.BytesIO(), Image.Exif()
    exif[0x010E] = "an image description"
    Image.fromarray(_noisy(48, 64, 10)).save(out, format="JPEG", quality=90, comment=b"kept",
                                             exif=exif.tobytes())
    marked = decode.with_restarts(out.getvalue(), 1)
    assert _cropjpeg.intervals(marked) is not None
    reopened = Image.open(io.BytesIO(marked))
    assert reopened.info.get("comment") == b"kept"
    assert reopened.getexif()[0x010E] == "an image description"
    cmyk = _cmyk_jpeg()
    assert _cropjpeg.with_restarts(cmyk, 1) is None and decode.with_restarts(cmyk, 1) == cmyk
    damaged = b"\xff\xd8\xff\xe0" + b"\x00" * 40
    assert decode.with_restarts(damaged, 1) == damaged
    with pytest.raises(ValueError, match="JPEG transcode"):
        _cropjpeg.with_restarts(damaged, 1)
    with pytest.raises(ValueError, match="restart interval 0"):
        _cropjpeg.with_restarts(cmyk, 0)


def test_damaged_marked_files_raise_value_errors_never_a_crash():
    from hpc_train.data import _cropjpeg

    data = decode.with_restarts(_jpeg(_noisy(200, 300, 11)), 1)
    body = bytearray(data)
    rst = bytes(body).index(b"\xff\xd3")
    body[rst + 1] = 0xD5                                 # a marker out of sequence: not cut
    for damaged in (data[: len(data) // 2], bytes(body), data[:-2]):
        out = np.empty((50, 60, 3), np.uint8)
        try:
            _cropjpeg.decode_into(damaged, out, 100, 100, 1)
        except ValueError:
            pass
    assert _cropjpeg.intervals(bytes(body)) is None and _cropjpeg.intervals(data[:-2]) is None
    with pytest.raises(ValueError):                       # truncated: not grey
        _cropjpeg.decode_into(data[: len(data) // 2], np.empty((50, 60, 3), np.uint8), 100, 100, 1)

"""The fast decode path against the references it replaces.

- Crop distribution: the boxes our TrainTransform really resizes (scaled back to source pixels
  when the decode was DCT-reduced) follow torchvision's RandomResizedCrop: scale, log-ratio and
  position distributions by a two-sample Kolmogorov-Smirnov test against an independent
  reimplementation of `RandomResizedCrop.get_params` drawing from torch's RNG, and the same
  centre-crop fallback for images too elongated for the ratio range.
- Pixels: against the torchvision recipe (Pillow full decode, crop, resize BILINEAR, flip).
  Stated tolerance, 0-255 scale: full-resolution decodes differ by at most 2 (mean under 0.1:
  rounding in the two bilinear kernels). DCT-reduced decodes (only crops at least twice the
  output on their shorter side): at most 4 (mean under 1) on smooth photographic content; on the
  demo images' fine stripes (6-13 px periods, near the reduced grid's Nyquist limit) a mean under
  16 (typically 2-7): libjpeg's scaled IDCT keeps such frequencies at a contrast that the
  triangle filter of a full-resolution resize damps. Pillow's draft did the same before.
- uint8 out + normalise on the device equals normalise in the worker, bit for bit on CPU.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
import torch
from PIL import Image

from hpc_train.data import decode, transforms
from hpc_train.data.decode import open_encoded
from hpc_train.data.demo import make_image
from hpc_train.data.transforms import (TrainTransform, ValTransform, normalize_batch, rrc_params,
                                       val_geometry)

DRAWS = 2000
# The box tests watch which pixels reach the resize, so they use a decoder that decodes the whole
# image; tests/data/test_cropjpeg.py shows the region decoder gives the same output.
WHOLE = "simplejpeg" if decode.simplejpeg is not None else "pillow"


@pytest.fixture(autouse=True)
def one_thread():
    """As in a DataLoader worker: torch's tiny per-image ops on several intra-op threads of a
    busy machine run 10-20x slower (measured), which only makes the test slow."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _jpeg(pixels: np.ndarray) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def torchvision_get_params(height: int, width: int, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3)):
    """torchvision.transforms.RandomResizedCrop.get_params, verbatim but for its tensor input,
    drawing from the global torch RNG: an independent reference for our numpy-driven one."""
    area = height * width
    log_ratio = torch.log(torch.tensor(ratio))
    for _ in range(10):
        target_area = area * torch.empty(1).uniform_(scale[0], scale[1]).item()
        aspect_ratio = math.exp(torch.empty(1).uniform_(log_ratio[0], log_ratio[1]).item())
        w = int(round(math.sqrt(target_area * aspect_ratio)))
        h = int(round(math.sqrt(target_area / aspect_ratio)))
        if 0 < w <= width and 0 < h <= height:
            i = torch.randint(0, height - h + 1, size=(1,)).item()
            j = torch.randint(0, width - w + 1, size=(1,)).item()
            return i, j, h, w
    in_ratio = float(width) / float(height)
    if in_ratio < min(ratio):
        w = width
        h = int(round(w / min(ratio)))
    elif in_ratio > max(ratio):
        h = height
        w = int(round(h * max(ratio)))
    else:
        w, h = width, height
    return (height - h) // 2, (width - w) // 2, h, w


def ks_statistic(a, b) -> float:
    a, b = np.sort(np.asarray(a, float)), np.sort(np.asarray(b, float))
    grid = np.concatenate([a, b])
    return float(np.max(np.abs(np.searchsorted(a, grid, side="right") / len(a)
                                - np.searchsorted(b, grid, side="right") / len(b))))


def ks_critical(n: int, m: int, alpha: float = 0.001) -> float:
    return math.sqrt(-math.log(alpha / 2) / 2) * math.sqrt((n + m) / (n * m))


def used_boxes(monkeypatch, image, size: int, draws: int, seed0: int = 0):
    """(top, left, h, w, reduction) in source pixels of the box TrainTransform resized, per draw
    (whole-pixel boxes through resize_box, fractional ones of reduced decodes through
    resize_subpixel)."""
    boxes = []

    def resized(out_h, out_w):
        # What the resize returns, unfilled: these tests read the boxes only (the resizes'
        # pixels: tests/data/test_cropjpeg.py), and 2,000 real resizes of a 1000 px photo took
        # 100 s of CI's CPU.
        return torch.zeros((3, out_h, out_w), dtype=torch.uint8)

    def recording_whole(pixels, top, left, h, w, out_h, out_w):
        sy, sx = image.height / pixels.shape[0], image.width / pixels.shape[1]
        boxes.append((top * sy, left * sx, h * sy, w * sx, sy))
        return resized(out_h, out_w)

    def recording_fractional(pixels, box, out_h, out_w):
        sy, sx = image.height / pixels.shape[0], image.width / pixels.shape[1]
        left, top, right, bottom = box
        boxes.append((top * sy, left * sx, (bottom - top) * sy, (right - left) * sx, sy))
        return resized(out_h, out_w)

    monkeypatch.setattr(transforms, "resize_box", recording_whole)
    monkeypatch.setattr(transforms, "resize_subpixel", recording_fractional)
    transform = TrainTransform(size)
    for seed in range(seed0, seed0 + draws):
        transform(image, np.random.default_rng(seed))
    assert len(boxes) == draws
    return np.array(boxes)


def _features(boxes: np.ndarray, height: int, width: int) -> dict[str, np.ndarray]:
    top, left, h, w = boxes[:, 0], boxes[:, 1], boxes[:, 2], boxes[:, 3]
    return {"scale": h * w / (height * width), "log_ratio": np.log(w / h),
            "centre_y": (top + h / 2) / height, "centre_x": (left + w / 2) / width}


@pytest.mark.parametrize("width, height, reduced", [
    (500, 375, False),      # an ImageNet-sized photo: never reduced for a 224 crop
    (1000, 750, True),      # large: many crops are decoded at 1/2
])
def test_crop_distribution_matches_torchvision(monkeypatch, width, height, reduced):
    image = open_encoded(_jpeg(np.full((height, width, 3), 128, np.uint8)), WHOLE)
    ours = used_boxes(monkeypatch, image, 224, DRAWS)
    assert (ours[:, 4] > 1).any() == reduced
    torch.manual_seed(1234)
    reference = np.array([torchvision_get_params(height, width) for _ in range(DRAWS)], float)
    a, b = _features(ours, height, width), _features(reference, height, width)
    for name in a:
        d = ks_statistic(a[name], b[name])
        assert d < ks_critical(DRAWS, DRAWS), (name, d)
    # The boxes are torchvision's exactly, reduced or not: the same numbers as rrc_params draws.
    drawn = np.array([rrc_params(height, width, np.random.default_rng(seed)) for seed in range(DRAWS)])
    assert np.allclose(ours[:, :4], drawn, atol=1e-6)
    # A crop is never reduced below the output: its shorter side in decoded pixels is >= 224.
    decoded_short = np.minimum(ours[:, 2], ours[:, 3]) / ours[:, 4]
    assert (decoded_short[ours[:, 4] > 1] >= 224).all()


def test_the_test_detects_a_wrong_distribution():
    torch.manual_seed(0)
    good = np.array([torchvision_get_params(375, 500) for _ in range(DRAWS)], float)
    narrow = np.array([torchvision_get_params(375, 500, scale=(0.2, 1.0)) for _ in range(DRAWS)], float)
    assert ks_statistic(_features(good, 375, 500)["scale"],
                        _features(narrow, 375, 500)["scale"]) > ks_critical(DRAWS, DRAWS)


@pytest.mark.parametrize("height, width", [(60, 1000), (1000, 60), (120, 500)])
def test_fallback_centre_crop_matches_torchvision(monkeypatch, height, width):
    image = open_encoded(_jpeg(np.full((height, width, 3), 90, np.uint8)), WHOLE)
    ours = used_boxes(monkeypatch, image, 32, 400)
    torch.manual_seed(7)
    reference = np.array([torchvision_get_params(height, width) for _ in range(400)], float)
    fallback = rrc_params(height, width, np.random.default_rng(0), scale=(2.0, 3.0))
    is_fallback = lambda boxes: (boxes[:, :4] == np.array(fallback, float)).all(axis=1)  # noqa: E731
    # How often all ten attempts miss depends on the shape only: the two rates agree.
    rate_ours, rate_ref = is_fallback(ours).mean(), is_fallback(reference).mean()
    assert abs(rate_ours - rate_ref) < 4 * math.sqrt(rate_ref * (1 - rate_ref) / 400 * 2) + 0.01
    if height * 4 / 3 < width / 5:     # hopelessly elongated: every draw falls back
        assert rate_ours == rate_ref == 1.0


def _reference_train(data: bytes, rng: np.random.Generator, size: int) -> np.ndarray:
    """The torchvision recipe's pixels (before ToTensor): Pillow decode, crop, resize, flip."""
    img = Image.open(io.BytesIO(data)).convert("RGB")
    top, left, h, w = rrc_params(img.height, img.width, rng)
    out = img.crop((left, top, left + w, top + h)).resize((size, size), Image.BILINEAR)
    if rng.random() < 0.5:
        out = out.transpose(Image.FLIP_LEFT_RIGHT)
    return np.asarray(out).transpose(2, 0, 1).astype(np.int16)


def _demo_jpegs(side: int, count: int = 8) -> list[bytes]:
    rng = np.random.default_rng(side)
    return [_jpeg(make_image(k % 10, 10, rng, side)) for k in range(count)]


@pytest.mark.parametrize("decoder", ["cropjpeg", "simplejpeg", "pillow"])
def test_full_resolution_pixels_match_the_torchvision_recipe(decoder, jpeg_decoders):
    if decoder not in jpeg_decoders:
        pytest.skip(f"{decoder} is not installed")
    diffs = []
    for data in _demo_jpegs(300):
        for seed in range(4):
            ours = TrainTransform(160, normalize=False, draft=False)(
                open_encoded(data, decoder), np.random.default_rng(seed))
            reference = _reference_train(data, np.random.default_rng(seed), 160)
            diffs.append(np.abs(ours.numpy().astype(np.int16) - reference).ravel())
    diffs = np.concatenate(diffs)
    assert diffs.max() <= 2 and diffs.mean() < 0.1, (diffs.max(), diffs.mean())


def _smooth_jpeg(height: int = 1200, width: int = 1600) -> bytes:
    y, x = np.mgrid[0:height, 0:width].astype(np.float32)
    pixels = np.stack([128 + 100 * np.sin(x / 37), 128 + 100 * np.cos(y / 23),
                       (x + y) / (height + width) * 255], -1)
    return _jpeg(np.clip(pixels, 0, 255).astype(np.uint8))


@pytest.mark.parametrize("decoder", ["cropjpeg", "simplejpeg", "pillow"])
def test_reduced_decodes_stay_within_the_stated_tolerance(decoder, jpeg_decoders):
    if decoder not in jpeg_decoders:
        pytest.skip(f"{decoder} is not installed")
    cases = [(data, 16.0, 255) for data in _demo_jpegs(520, 4)] + [(_smooth_jpeg(), 1.0, 4)]
    reduced = 0
    for data, mean_limit, max_limit in cases:
        for seed in range(12):
            top, left, h, w = rrc_params(*open_encoded(data).size, np.random.default_rng(seed))
            if min(h, w) < 2 * 224:
                continue
            reduced += 1
            ours = TrainTransform(224, normalize=False)(open_encoded(data, decoder),
                                                        np.random.default_rng(seed))
            diff = np.abs(ours.numpy().astype(np.int16)
                          - _reference_train(data, np.random.default_rng(seed), 224))
            assert diff.mean() < mean_limit and diff.max() <= max_limit, (seed, diff.mean(), diff.max())
    assert reduced >= 10


@pytest.mark.parametrize("decoder", ["cropjpeg", "simplejpeg", "pillow"])
def test_validation_pixels_match_resize_then_centre_crop(decoder, jpeg_decoders):
    if decoder not in jpeg_decoders:
        pytest.skip(f"{decoder} is not installed")
    for data in _demo_jpegs(300, 4):
        img = Image.open(io.BytesIO(data)).convert("RGB")
        new_h, new_w, top, left = val_geometry(img.height, img.width, 160)
        reference = np.asarray(img.resize((new_w, new_h), Image.BILINEAR).crop(
            (left, top, left + 160, top + 160))).transpose(2, 0, 1).astype(np.int16)
        ours = ValTransform(160, normalize=False)(open_encoded(data, decoder))
        assert np.abs(ours.numpy().astype(np.int16) - reference).max() <= 2


def test_uint8_then_device_normalisation_is_bit_identical_to_worker_normalisation():
    data = _demo_jpegs(120, 1)[0]
    for make in (TrainTransform, ValTransform):
        floats = make(96)(open_encoded(data), np.random.default_rng(3))
        uint8 = make(96, normalize=False)(open_encoded(data), np.random.default_rng(3))
        assert uint8.dtype == torch.uint8 and floats.dtype == torch.float32
        assert torch.equal(normalize_batch(uint8[None])[0], floats)


def test_without_simplejpeg_or_cropjpeg_pillow_decodes(monkeypatch):
    data = _demo_jpegs(120, 1)[0]
    with_default = TrainTransform(64, normalize=False)(open_encoded(data), np.random.default_rng(0))
    monkeypatch.setattr(decode, "simplejpeg", None)            # as on a node without the wheel
    monkeypatch.setattr(decode, "_cropjpeg", None)             # nor the built extension
    assert decode.jpeg_decoder() == "pillow"
    image = open_encoded(data)
    assert image.decoder == "pillow"
    without = TrainTransform(64, normalize=False)(image, np.random.default_rng(0))
    assert (without.int() - with_default.int()).abs().max() <= 1


def test_decoder_choice_from_the_environment(jpeg_decoders):
    from hpc_train.data.decode import jpeg_decoder

    assert jpeg_decoder({"HPC_TRAIN_JPEG_DECODER": "pillow"}) == "pillow"
    assert jpeg_decoder({}) == jpeg_decoders[-1]
    assert jpeg_decoder({"HPC_TRAIN_JPEG_DECODER": "simplejpeg"}) == [
        d for d in jpeg_decoders if d != "cropjpeg"][-1]      # the next one down if not installed
    with pytest.raises(ValueError, match="HPC_TRAIN_JPEG_DECODER='turbo'"):
        jpeg_decoder({"HPC_TRAIN_JPEG_DECODER": "turbo"})

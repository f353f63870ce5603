"""Transforms and decode: geometry equals torchvision's, outputs normalised, draft shrinks decode."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch
from PIL import Image

from hpc_train.data.decode import open_encoded
from hpc_train.data.transforms import (IMAGENET_MEAN, IMAGENET_STD, TrainTransform, ValTransform,
                                       normalize_uint8, rrc_params, scale_shift, val_box)


def _jpeg(width: int, height: int, seed: int = 0) -> bytes:
    pixels = np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)
    out = io.BytesIO()
    Image.fromarray(pixels).save(out, format="JPEG", quality=90)
    return out.getvalue()


def _gradient(width: int, height: int) -> Image.Image:
    """Red grows left to right, green top to bottom: a pixel's colour tells where it came from."""
    x = np.linspace(0, 255, width)[None, :].repeat(height, 0)
    y = np.linspace(0, 255, height)[:, None].repeat(width, 1)
    return Image.fromarray(np.stack([x, y, np.zeros_like(x)], -1).astype(np.uint8))


def test_rrc_params_stay_inside_the_image_and_obey_scale_and_ratio():
    rng = np.random.default_rng(0)
    for _ in range(500):
        top, left, h, w = rrc_params(300, 400, rng)
        assert 0 <= top and top + h <= 300 and 0 <= left and left + w <= 400
        assert 0.08 * 0.9 <= h * w / (300 * 400) <= 1.0
        assert 3 / 4 * 0.9 <= w / h <= 4 / 3 * 1.1


def test_rrc_params_are_a_function_of_the_generator_state():
    a = [rrc_params(100, 120, np.random.default_rng(7)) for _ in range(3)]
    assert a[0] == a[1] == a[2]
    assert rrc_params(100, 120, np.random.default_rng(8)) != a[0]


@pytest.mark.parametrize("height, width, expected", [
    (10, 1000, (0, 493, 10, 13)),   # far wider than 4:3 -> full height, width round(10 x 4/3)
    (1000, 10, (493, 0, 13, 10)),   # far taller than 3:4 -> full width, height round(10 / 3/4)
])
def test_rrc_falls_back_to_a_centre_crop_after_ten_misses(height, width, expected):
    # scale > 1 can never fit: all ten attempts miss, as for extreme aspect ratios.
    assert rrc_params(height, width, np.random.default_rng(0), scale=(2.0, 3.0)) == expected


def test_rrc_fallback_takes_the_whole_image_within_the_ratio_range():
    assert rrc_params(90, 100, np.random.default_rng(0), scale=(2.0, 3.0)) == (0, 0, 90, 100)


def test_train_output_is_normalised_float_chw():
    img = Image.fromarray(np.full((50, 60, 3), 128, np.uint8))
    out = TrainTransform(32)(img, np.random.default_rng(0))
    assert out.shape == (3, 32, 32) and out.dtype == torch.float32
    expected = (128 / 255 - torch.tensor(IMAGENET_MEAN)) / torch.tensor(IMAGENET_STD)
    assert torch.allclose(out.mean((1, 2)), expected, atol=1e-4)


def test_normalisation_of_extremes():
    black, white = (normalize_uint8(torch.full((3, 2, 2), v, dtype=torch.uint8), *scale_shift())
                    for v in (0, 255))
    mean, std = torch.tensor(IMAGENET_MEAN), torch.tensor(IMAGENET_STD)
    assert torch.allclose(black[:, 0, 0], -mean / std)
    assert torch.allclose(white[:, 0, 0], (1 - mean) / std)


def test_flip_mirrors_the_same_crop_about_half_the_time():
    img = _gradient(80, 60)
    flipping, plain = TrainTransform(24), TrainTransform(24, flip=False)
    flips = []
    for seed in range(40):
        out = flipping(img, np.random.default_rng(seed))
        reference = plain(img, np.random.default_rng(seed))   # same crop: flip is drawn after it
        flipped = not torch.equal(out, reference)
        assert torch.allclose(out, reference.flip(-1) if flipped else reference)
        red = out[0]                                           # red grows left to right
        assert (red[:, 0].mean() > red[:, -1].mean()) == flipped
        flips.append(flipped)
    assert 10 <= sum(flips) <= 30


def test_train_crop_takes_its_pixels_from_the_chosen_box():
    img = _gradient(400, 300)
    rng = np.random.default_rng(3)
    top, left, h, w = rrc_params(300, 400, np.random.default_rng(3))
    out = TrainTransform(16, flip=False, mean=(0, 0, 0), std=(1, 1, 1))(img, rng) * 255
    # Red encodes x, green encodes y: the output's colour range is the box's.
    assert abs(out[0].min() - left * 255 / 399) < 255 * 0.05 + w * 255 / 399 / 16
    assert abs(out[1].max() - (top + h) * 255 / 299) < 255 * 0.05 + h * 255 / 299 / 16


def test_raw_arrays_and_pil_images_give_the_same_result():
    array = np.asarray(_gradient(64, 48))
    a = TrainTransform(32)(array, np.random.default_rng(1))
    b = TrainTransform(32)(Image.fromarray(array), np.random.default_rng(1))
    assert torch.equal(a, b)
    with pytest.raises(ValueError, match="uint8 HxWx3"):
        TrainTransform(32)(array.astype(np.float32), np.random.default_rng(1))


def test_val_box_is_resize_256_then_centre_crop_224():
    # 500 wide x 375 high: shorter side 375 -> 256, width int(256 * 500 / 375) = 341;
    # crop left round((341 - 224) / 2) = 58 (Python rounds 58.5 to even), top 16.
    left, top, right, bottom = val_box(375, 500, 224)
    sx, sy = 500 / 341, 375 / 256
    assert (left, top) == pytest.approx((58 * sx, 16 * sy))
    assert (right, bottom) == pytest.approx(((58 + 224) * sx, (16 + 224) * sy))


def test_val_transform_equals_resize_then_crop():
    img = _gradient(500, 375)
    out = ValTransform(224, mean=(0, 0, 0), std=(1, 1, 1))(img)
    resized = img.resize((341, 256), Image.BILINEAR).crop((58, 16, 58 + 224, 16 + 224))
    reference = torch.from_numpy(np.asarray(resized).copy()).permute(2, 0, 1).float() / 255
    assert out.shape == (3, 224, 224)
    assert (out - reference).abs().max() < 2 / 255


@pytest.mark.parametrize("decoder", ["cropjpeg", "simplejpeg", "pillow"])
def test_reduced_decode_of_a_large_jpeg(decoder, jpeg_decoders):
    if decoder not in jpeg_decoders:
        pytest.skip(f"{decoder} is not installed")
    data = _jpeg(1024, 800)
    image = open_encoded(data, decoder)
    assert image.size == (800, 1024)                      # the header, nothing decoded yet
    assert image.pixels().shape == (800, 1024, 3)
    assert image.pixels(2).shape == (400, 512, 3)
    assert image.pixels(8).shape == (100, 128, 3)


@pytest.mark.parametrize("decoder", ["simplejpeg", "pillow"])
def test_train_crop_decides_the_reduction(decoder, jpeg_decoders, monkeypatch):
    if decoder not in jpeg_decoders:
        pytest.skip("simplejpeg is not installed")
    asked = []
    pixels = type(open_encoded(_jpeg(8, 8))).pixels
    monkeypatch.setattr(type(open_encoded(_jpeg(8, 8))), "pixels",
                        lambda self, reduce=1: asked.append(reduce) or pixels(self, reduce))
    # A 400x350 image: no crop can be reduced for a 224 output; a 1600x1200 one often can.
    for seed in range(30):
        TrainTransform(224)(open_encoded(_jpeg(400, 350), decoder), np.random.default_rng(seed))
    assert set(asked) == {1}
    asked.clear()
    big = open_encoded(_jpeg(1600, 1200), decoder)
    for seed in range(30):
        top, left, h, w = rrc_params(1200, 1600, np.random.default_rng(seed))
        out = TrainTransform(224)(big, np.random.default_rng(seed))
        assert out.shape == (3, 224, 224)
        assert min(h, w) >= asked[-1] * 224              # the crop stays >= the output size
        assert asked[-1] == 1 or min(h, w) < asked[-1] * 2 * 224   # and the largest such factor
    assert max(asked) >= 2
    asked.clear()
    ValTransform(224)(big)
    assert asked == [4]                                   # shorter side 1200 >= 4 x 256


def test_truncated_jpeg_fails_inside_decode(jpeg_decoders):
    data = _jpeg(200, 200)
    for decoder in jpeg_decoders:
        with pytest.raises((OSError, ValueError)):
            open_encoded(data[: len(data) // 2], decoder).pixels()


def test_uint8_output_normalised_later_equals_normalised_output():
    from hpc_train.data.transforms import normalize_batch

    img = _gradient(90, 70)
    as_float = TrainTransform(32)(img, np.random.default_rng(4))
    as_uint8 = TrainTransform(32, normalize=False)(img, np.random.default_rng(4))
    assert as_uint8.dtype == torch.uint8 and as_uint8.shape == (3, 32, 32)
    assert torch.allclose(normalize_batch(as_uint8[None])[0], as_float, atol=1e-5)
    val = ValTransform(32, normalize=False)(img)
    assert torch.allclose(normalize_batch(val[None])[0], ValTransform(32)(img), atol=1e-5)

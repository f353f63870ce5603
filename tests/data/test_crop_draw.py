"""A sample's crop and flip drawn by the extension (_crop_draw.c) are the numbers numpy draws:
the same boxes and flips as `rrc_params` and `Generator.random()` on `sample_rng(seed, epoch,
index)`, for the keys a run makes, keys past 2^32, images of every shape and other scale and
ratio ranges, both sides of torchvision's fallback included. So a node with the extension and
one without crop every sample alike, and exact resume does not depend on which one a run had."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from hpc_train.data import transforms
from hpc_train.data.decode import open_encoded
from hpc_train.data.transforms import SampleStream, TrainTransform, crop_and_flip, rrc_params, sample_rng

native = pytest.importorskip("hpc_train.data._cropjpeg")
if not hasattr(native, "crop_and_flip"):
    pytest.skip("the built extension predates crop_and_flip: rebuild with env/setup.sh",
                allow_module_level=True)

IMAGENET = ((0.08, 1.0), (3 / 4, 4 / 3))


def numpy_draws(keys, height, width, scale, ratio, flip):
    rng = np.random.default_rng(list(keys))
    top, left, h, w = rrc_params(height, width, rng, scale, ratio)
    return top, left, h, w, bool(flip and rng.random() < 0.5)


def sweep(count: int):
    """Requests of every kind: run keys, huge keys, tiny and elongated images, other ranges."""
    meta = np.random.default_rng(2026)
    for i in range(count):
        kind = i % 6
        seed = int(meta.integers(0, 2**63)) if kind == 0 else int(meta.integers(0, 1000))
        index = int(meta.integers(0, 2**41)) if kind == 1 else int(meta.integers(0, 2_000_000))
        keys = (seed, int(meta.integers(0, 300)), index)
        height = int(meta.integers(1, 5)) if kind == 2 else int(meta.integers(1, 3000))
        width = int(meta.integers(1000, 5000)) if kind == 3 else int(meta.integers(1, 3000))
        scale = IMAGENET[0] if kind < 4 else (float(meta.uniform(0.01, 0.5)), float(meta.uniform(0.5, 2.0)))
        ratio = IMAGENET[1] if kind < 5 else (float(meta.uniform(0.2, 1.0)), float(meta.uniform(1.0, 5.0)))
        yield keys, height, width, scale, ratio, bool(i % 7)


def test_the_extension_draws_numpy_s_numbers():
    fallbacks = flips = 0
    for request in sweep(12_000):
        expected = numpy_draws(*request)
        assert native.crop_and_flip(*request) == expected, request
        keys, height, width, scale, ratio, _ = request
        # torchvision's centred fallback after 10 misses: exercised, not only the attempts
        fallbacks += expected[:4] == rrc_params(height, width, _Misses(), scale, ratio)
        flips += expected[4]
    assert fallbacks > 100 and 0.3 < flips / 12_000 < 0.6


class _Misses:
    """A stand-in generator whose every attempt misses (a target area 10^9 times the image's,
    then a log-ratio of 0): rrc_params returns its fallback."""

    def __init__(self):
        self.calls = 0

    def uniform(self, low, high):
        self.calls += 1
        return 1e9 if self.calls % 2 else 0.0

    def integers(self, low, high):
        raise AssertionError("no attempt fits")


@pytest.mark.parametrize("keys", [(0, 0, 0), (7, 3, 1 << 40), (2**64 - 1, 0, 5), (1, 2)])
def test_keys_become_numpy_s_seed_words(keys):
    # Each key is split into 32-bit words as SeedSequence does (0 is one word; 2^40 two).
    assert native.crop_and_flip(keys, 375, 500, *IMAGENET, True) == numpy_draws(keys, 375, 500, *IMAGENET, True)


def test_bad_requests_are_value_errors_not_crashes():
    for keys, height, width in [((-1, 0, 0), 10, 10), ((), 10, 10), ((0, 0, 0), 0, 10), ((0, 0, 0), 10, 2**32)]:
        with pytest.raises((ValueError, OverflowError)):
            native.crop_and_flip(keys, height, width, *IMAGENET, True)


def test_a_stream_gives_the_same_crop_and_flip_with_and_without_the_extension(monkeypatch):
    streams = [SampleStream(11, epoch, index) for epoch in range(3) for index in range(200)]
    drawn = [crop_and_flip(s, 375, 500, *IMAGENET, True) for s in streams]
    monkeypatch.setattr(transforms, "_crop_and_flip_in_c", None)
    assert [crop_and_flip(s, 375, 500, *IMAGENET, True) for s in streams] == drawn
    # and a Generator (the other kind of stream) draws them too
    assert [crop_and_flip(sample_rng(s.seed, s.epoch, s.index), 375, 500, *IMAGENET, True)
            for s in streams] == drawn


def test_a_training_sample_is_the_same_tensor_either_way(monkeypatch):
    from tests.data.test_cropjpeg import _jpeg, _noisy

    data = _jpeg(_noisy(375, 500, seed=1))
    transform = TrainTransform(64, normalize=False)
    streams = [SampleStream(3, 0, index) for index in range(24)]
    fast = [transform(open_encoded(data), s) for s in streams]
    monkeypatch.setattr(transforms, "_crop_and_flip_in_c", None)
    assert all(torch.equal(a, transform(open_encoded(data), s)) for a, s in zip(fast, streams))

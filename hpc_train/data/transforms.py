"""ImageNet training and validation transforms without torchvision.

The geometry follows torchvision exactly (RandomResizedCrop with its 10 attempts and centre-crop
fallback; Resize(size / 0.875) + CenterCrop(size)), so accuracy recipes carry over. Crop and
resize happen in ONE Pillow call (`resize(..., box=...)`): Pillow scales the filter by the box,
so the result equals crop-then-resize while touching only the pixels of the crop.

Randomness comes from the `np.random.Generator` the caller passes: a transform is a pure
function of (image, generator state), which is what the tests rely on. Datasets pass
`sample_rng(seed, epoch, index)`, so a sample's crop and flip depend on nothing else. Inputs are
RGB PIL images (decoded JPEG) or uint8 HWC numpy arrays (raw shards).
"""

from __future__ import annotations

import math

import numpy as np
import torch
from PIL import Image

IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CROP_FRACTION = 0.875  # validation: resize the shorter side to size / 0.875, crop the centre


def sample_rng(seed: int, epoch: int, index: int) -> np.random.Generator:
    """The augmentation stream of one sample: a pure function of (run seed, epoch, global index).

    No process state goes in, so every worker, start method, rank and world size, and a run
    resumed mid-epoch, draws the same crop for the same sample, and each epoch draws new ones.
    A fresh Generator per sample costs ~15 us, against milliseconds of JPEG decode.
    """
    return np.random.default_rng([seed, epoch, index])


def rrc_params(height: int, width: int, rng: np.random.Generator,
               scale: tuple[float, float] = (0.08, 1.0),
               ratio: tuple[float, float] = (3 / 4, 4 / 3)) -> tuple[int, int, int, int]:
    """torchvision's RandomResizedCrop.get_params: (top, left, crop_height, crop_width)."""
    area = height * width
    log_ratio = (math.log(ratio[0]), math.log(ratio[1]))
    for _ in range(10):
        target_area = area * rng.uniform(scale[0], scale[1])
        aspect = math.exp(rng.uniform(log_ratio[0], log_ratio[1]))
        w = int(round(math.sqrt(target_area * aspect)))
        h = int(round(math.sqrt(target_area / aspect)))
        if 0 < w <= width and 0 < h <= height:
            top = int(rng.integers(0, height - h + 1))
            left = int(rng.integers(0, width - w + 1))
            return top, left, h, w
    # Ten misses (very elongated images): the largest centred crop within the ratio range.
    in_ratio = width / height
    if in_ratio < min(ratio):
        w, h = width, int(round(width / min(ratio)))
    elif in_ratio > max(ratio):
        h, w = height, int(round(height * max(ratio)))
    else:
        h, w = height, width
    return (height - h) // 2, (width - w) // 2, h, w


def val_box(height: int, width: int, size: int,
            crop_fraction: float = CROP_FRACTION) -> tuple[float, float, float, float]:
    """Resize(int(size / crop_fraction)) + CenterCrop(size) as one box in source pixels.

    Returns (left, top, right, bottom) for `Image.resize(box=...)`. Resize and centre-crop
    arithmetic are torchvision's: the shorter side becomes `resize`, the longer int(...) of its
    scaled length, and the crop starts at round((resized - size) / 2).
    """
    resize = int(size / crop_fraction)
    if width <= height:
        new_w, new_h = resize, int(resize * height / width)
    else:
        new_h, new_w = resize, int(resize * width / height)
    top = int(round((new_h - size) / 2.0))
    left = int(round((new_w - size) / 2.0))
    sx, sy = width / new_w, height / new_h
    return left * sx, top * sy, (left + size) * sx, (top + size) * sy


def to_normalized_tensor(img: Image.Image, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> torch.Tensor:
    """uint8 HWC -> float32 CHW, (x / 255 - mean) / std as x * a + b.

    Made contiguous while still uint8 (a quarter of the bytes), then two in-place passes. Each
    torch op here is tiny: DataLoader workers run single-threaded; a main process with several
    intra-op threads on a busy machine makes these ops 10-100x slower (measured).
    """
    chw = to_uint8_tensor(img)
    std255 = np.asarray(std, dtype=np.float32) * 255.0
    scale = torch.from_numpy(1.0 / std255).view(3, 1, 1)
    shift = torch.from_numpy(-np.asarray(mean, dtype=np.float32) * 255.0 / std255).view(3, 1, 1)
    return chw.float().mul_(scale).add_(shift)


def to_uint8_tensor(img: Image.Image) -> torch.Tensor:
    """uint8 HWC -> uint8 CHW: a quarter of the bytes through the worker queues and pinned copy."""
    return torch.from_numpy(np.ascontiguousarray(np.asarray(img, dtype=np.uint8).transpose(2, 0, 1)))


def normalize_batch(images: torch.Tensor, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> torch.Tensor:
    """A uint8 NCHW batch (transforms with normalize=False) -> normalised float, on its device."""
    std255 = torch.tensor(std, dtype=torch.float32, device=images.device).view(1, 3, 1, 1) * 255
    mean255 = torch.tensor(mean, dtype=torch.float32, device=images.device).view(1, 3, 1, 1) * 255
    return (images.float() - mean255) / std255


def _finish(out: Image.Image, normalize: bool, mean, std) -> torch.Tensor:
    # normalize=False: uint8 CHW, 4x fewer bytes through worker queues and host-to-device
    # copies; the trainer then calls normalize_batch on the device.
    return to_normalized_tensor(out, mean, std) if normalize else to_uint8_tensor(out)


def _as_pil(img) -> Image.Image:
    if isinstance(img, np.ndarray):
        if img.dtype != np.uint8 or img.ndim != 3 or img.shape[2] != 3:
            raise ValueError(f"raw image must be uint8 HxWx3, got {img.dtype} {img.shape}")
        return Image.fromarray(img, "RGB")
    return img


class TrainTransform:
    """RandomResizedCrop(size) + random horizontal flip + normalised float CHW tensor."""

    def __init__(self, size: int = 224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                 flip: bool = True, mean=IMAGENET_MEAN, std=IMAGENET_STD, draft: bool = True,
                 normalize: bool = True):
        self.size, self.scale, self.ratio, self.flip = size, tuple(scale), tuple(ratio), flip
        self.mean, self.std, self.normalize = mean, std, normalize
        # Decode so that the whole image's shorter side is still >= size. Small random crops are
        # then upsampled from the reduced image (a little blur); draft=False decodes in full.
        self.draft_size = size if draft else None

    def __call__(self, img, rng: np.random.Generator) -> torch.Tensor:
        img = _as_pil(img)
        width, height = img.size
        top, left, h, w = rrc_params(height, width, rng, self.scale, self.ratio)
        out = img.resize((self.size, self.size), Image.BILINEAR,
                         box=(left, top, left + w, top + h))
        if self.flip and rng.random() < 0.5:
            out = out.transpose(Image.FLIP_LEFT_RIGHT)
        return _finish(out, self.normalize, self.mean, self.std)


class ValTransform:
    """Resize the shorter side to size / 0.875, centre-crop size, normalised float CHW tensor."""

    def __init__(self, size: int = 224, crop_fraction: float = CROP_FRACTION,
                 mean=IMAGENET_MEAN, std=IMAGENET_STD, draft: bool = True,
                 normalize: bool = True):
        self.size, self.crop_fraction, self.mean, self.std = size, crop_fraction, mean, std
        self.normalize = normalize
        self.draft_size = int(size / crop_fraction) if draft else None

    def __call__(self, img, rng: np.random.Generator | None = None) -> torch.Tensor:
        img = _as_pil(img)
        width, height = img.size
        box = val_box(height, width, self.size, self.crop_fraction)
        out = img.resize((self.size, self.size), Image.BILINEAR, box=box)
        return _finish(out, self.normalize, self.mean, self.std)

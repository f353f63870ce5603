"""ImageNet training and validation transforms without torchvision.

The geometry follows torchvision exactly (RandomResizedCrop with its 10 attempts and centre-crop
fallback; Resize(size / 0.875) + CenterCrop(size)), so accuracy recipes carry over. The geometry
is drawn from the image's *header* size before anything is decoded, so the decoder can skip work
(`decode.Encoded.pixels(reduce)`: a DCT-domain 1/2, 1/4, 1/8 decode when the crop is at least
that many times the output; never for a 224 crop of a 500x375 photo), and, where the decoder can
(`Encoded.decodes_regions`: cropjpeg), decode only the crop's rows and columns, with the same
pixels as a full decode. Crop and resize are one
`torch.nn.functional.interpolate(antialias=True)` on a uint8 channels-last view of the decoded
pixels: torch's SIMD (AVX2) uint8 kernel, ~4x faster than Pillow's resize and equal to it
within rounding (tests/data/test_decode_path.py states the tolerance).

Randomness comes from the stream the caller passes, an `np.random.Generator` or a `SampleStream`
(seed, epoch, index): a transform is a pure function of (image, stream state), which is what the
tests rely on. Datasets pass `SampleStream(seed, epoch, index)`, so a sample's crop and flip
depend on nothing else; its draws are `sample_rng(seed, epoch, index)`'s, made by the crop-region
extension where it is built (the same numbers, `crop_and_flip`). Inputs are
`decode.Encoded` (JPEG bytes, decoded here), uint8 HWC numpy arrays (raw shards) or RGB PIL images.
Outputs are uint8 CHW (normalize=False: the rank normalises on its device, train/data.py DeviceInputs)
or normalised float32 CHW; both use the same x * a + b arithmetic, so they agree bit for bit on CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from PIL import Image

from hpc_train.data.decode import Encoded, largest_reduction

try:  # optional, built by env/setup.sh: the draws of rrc_params and the flip, the same numbers
    from hpc_train.data._cropjpeg import crop_and_flip as _crop_and_flip_in_c
except ImportError:  # pragma: no cover - depends on the environment
    _crop_and_flip_in_c = None

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


@dataclass(frozen=True)
class SampleStream:
    """The augmentation stream of one sample, `sample_rng(seed, epoch, index)`, not made yet: a
    training sample's whole use of it (`crop_and_flip`) is drawn without a Generator where the
    extension is built. `generator()` makes the Generator, for any other draw."""
    seed: int
    epoch: int
    index: int

    def generator(self) -> np.random.Generator:
        return sample_rng(self.seed, self.epoch, self.index)


def crop_and_flip(stream: np.random.Generator | SampleStream, height: int, width: int,
                  scale: tuple[float, float], ratio: tuple[float, float],
                  flip: bool) -> tuple[int, int, int, int, bool]:
    """(top, left, crop height, crop width, flipped): `rrc_params`, then `random() < 0.5` when
    `flip`, from the stream. A SampleStream's come from the extension where it is built: the
    numbers numpy draws (tests/data/test_crop_draw.py), at about 1 us instead of the ~70 us a
    Generator and its draws cost in a decode worker."""
    if isinstance(stream, SampleStream):
        if _crop_and_flip_in_c is not None:
            return _crop_and_flip_in_c((stream.seed, stream.epoch, stream.index), height, width,
                                       scale, ratio, flip)
        stream = stream.generator()
    top, left, h, w = rrc_params(height, width, stream, scale, ratio)
    return top, left, h, w, bool(flip and stream.random() < 0.5)


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


def scale_shift(mean=IMAGENET_MEAN, std=IMAGENET_STD) -> tuple[torch.Tensor, torch.Tensor]:
    """(a, b) with (x / 255 - mean) / std == x * a + b, as float32 (3, 1, 1) tensors."""
    std255 = np.asarray(std, dtype=np.float32) * 255.0
    scale = torch.from_numpy(1.0 / std255).view(3, 1, 1)
    shift = torch.from_numpy(-np.asarray(mean, dtype=np.float32) * 255.0 / std255).view(3, 1, 1)
    return scale, shift


def normalize_uint8(chw: torch.Tensor, scale: torch.Tensor, shift: torch.Tensor) -> torch.Tensor:
    """uint8 (..., 3, H, W) -> float32 x * a + b: one conversion, two in-place passes."""
    return chw.float().mul_(scale).add_(shift)


def normalize_batch(images: torch.Tensor, mean=IMAGENET_MEAN, std=IMAGENET_STD) -> torch.Tensor:
    """A uint8 NCHW batch (transforms with normalize=False) -> normalised float, on its device."""
    scale, shift = (t.to(images.device) for t in scale_shift(mean, std))
    return normalize_uint8(images, scale, shift)


def resize_box(pixels: np.ndarray, top: int, left: int, height: int, width: int,
               out_h: int, out_w: int) -> torch.Tensor:
    """The box of uint8 HWC `pixels` resized to (out_h, out_w), bilinear with antialiasing (as
    Pillow's BILINEAR: a triangle filter widened by the scale), as a contiguous uint8 CHW tensor."""
    box = torch.from_numpy(pixels)[top:top + height, left:left + width]
    if (height, width) == (out_h, out_w):
        return box.permute(2, 0, 1).contiguous()
    # A channels-last NCHW view: the memory layout torch's uint8 SIMD kernel reads directly.
    view = box.permute(2, 0, 1).unsqueeze(0)
    out = torch.nn.functional.interpolate(view, size=(out_h, out_w), mode="bilinear",
                                          antialias=True, align_corners=False)
    return out[0].contiguous()


def resize_subpixel(pixels: np.ndarray, box: tuple[float, float, float, float], out_h: int,
                    out_w: int) -> torch.Tensor:
    """A fractional box (left, top, right, bottom) resized with Pillow's `resize(box=)`, which
    places the filter with sub-pixel accuracy. Only for DCT-reduced decodes (large images): there
    the box does not fall on whole pixels, and rounding it would shift fine texture by up to one
    reduced pixel; the reduced decode has saved far more than Pillow's slower resize costs."""
    out = Image.fromarray(pixels, "RGB").resize((out_w, out_h), Image.BILINEAR, box=box)
    return torch.from_numpy(np.array(out, dtype=np.uint8).transpose(2, 0, 1).copy())


def _size(image) -> tuple[int, int]:
    """(height, width) at full resolution, without decoding."""
    if isinstance(image, Encoded):
        return image.size
    if isinstance(image, np.ndarray):
        if image.dtype != np.uint8 or image.ndim != 3 or image.shape[2] != 3:
            raise ValueError(f"raw image must be uint8 HxWx3, got {image.dtype} {image.shape}")
        return image.shape[0], image.shape[1]
    return image.height, image.width


def _pixels(image, reduce: int) -> np.ndarray:
    """uint8 HWC pixels; an encoded image decoded at 1/reduce (others are never reduced)."""
    if isinstance(image, Encoded):
        return image.pixels(reduce)
    if isinstance(image, np.ndarray):
        return image if image.flags.writeable else image.copy()   # torch.from_numpy wants it
    return np.array(image.convert("RGB"), dtype=np.uint8)


def _reduced_box(image: Encoded, box, reduce: int) -> tuple[float, float, float, float]:
    """A box (left, top, right, bottom) in source pixels, on the grid of the 1/reduce decode."""
    reduced_h, reduced_w = image.reduced_size(reduce)
    sy, sx = reduced_h / image.height, reduced_w / image.width
    return box[0] * sx, box[1] * sy, box[2] * sx, box[3] * sy


def _decode_box(image: Encoded, box: tuple[float, float, float, float], reduce: int,
                size: int) -> torch.Tensor:
    """A box (left, top, right, bottom; source pixels, whole at reduce 1) of a region-decoding
    image, resized to size x size: only the box is decoded, plus, reduced, the filter's reach.

    The output equals the full-decode path's bit for bit: at full resolution the same
    resize_box of the same pixels; reduced, Pillow's resize(box=) of the same box on an image
    where only the pixels its filter reads are decoded (shifting the box onto a smaller region
    instead would round Pillow's filter positions differently: up to 1 level, measured).
    """
    if reduce == 1:
        left, top, right, bottom = (int(v) for v in box)
        pixels = image.region(top, left, bottom - top, right - left)
        return resize_box(pixels, 0, 0, bottom - top, right - left, size, size)
    fractional = _reduced_box(image, box, reduce)
    # Pillow's bilinear filter reads up to (box side / size) / 2 + 1 pixels past the box.
    reach = math.ceil(max(fractional[2] - fractional[0], fractional[3] - fractional[1], size)
                      / size) + 1
    rows = (math.floor(fractional[1]) - reach, math.ceil(fractional[3]) + reach)
    cols = (math.floor(fractional[0]) - reach, math.ceil(fractional[2]) + reach)
    return resize_subpixel(_decoded_within(image, rows, cols, reduce), fractional, size, size)


def _decoded_within(image: Encoded, rows: tuple[int, int], cols: tuple[int, int],
                    reduce: int = 1) -> np.ndarray:
    """The whole 1/reduce image with only rows x cols (clipped to it) decoded, zeros elsewhere:
    a resize that reads only those pixels gives exactly what it gives on a full decode."""
    height, width = image.reduced_size(reduce)
    y0, y1 = max(0, rows[0]), min(height, rows[1])
    x0, x1 = max(0, cols[0]), min(width, cols[1])
    pixels = np.zeros((height, width, 3), np.uint8)
    pixels[y0:y1, x0:x1] = image.region(y0, x0, y1 - y0, x1 - x0, reduce)
    return pixels


class _Transform:
    def __init__(self, size: int, mean, std, draft: bool, normalize: bool):
        self.size, self.mean, self.std, self.draft = size, mean, std, draft
        self.normalize = normalize
        self._scale_shift = scale_shift(mean, std)

    def _reduction(self, image, short_side: float, needed: float) -> int:
        return largest_reduction(short_side, needed) if self.draft and isinstance(image, Encoded) else 1

    def _finish(self, chw: torch.Tensor) -> torch.Tensor:
        # normalize=False: uint8, 4x fewer bytes through worker queues and host-to-device
        # copies; the rank then normalises on its device (train/data.py: DeviceInputs).
        return normalize_uint8(chw, *self._scale_shift) if self.normalize else chw


class TrainTransform(_Transform):
    """RandomResizedCrop(size) + random horizontal flip, uint8 or normalised float CHW.

    draft: decode at 1/2, 1/4 or 1/8 when the *crop* stays >= size on its shorter side, so only
    crops that a full decode would downscale at least 2x are affected (never a 224 crop of a
    500x375 photo). The crop distribution is untouched: the box is drawn from the header size
    before decoding and kept exactly (sub-pixel) on the reduced grid. A region-decoding image
    decodes only the crop (and, reduced, what the resize filter reads next to it): same output.
    """

    def __init__(self, size: int = 224, scale=(0.08, 1.0), ratio=(3 / 4, 4 / 3),
                 flip: bool = True, mean=IMAGENET_MEAN, std=IMAGENET_STD, draft: bool = True,
                 normalize: bool = True):
        super().__init__(size, mean, std, draft, normalize)
        self.scale, self.ratio, self.flip = tuple(scale), tuple(ratio), flip

    def __call__(self, image, rng: np.random.Generator | SampleStream) -> torch.Tensor:
        height, width = _size(image)
        top, left, h, w, flip = crop_and_flip(rng, height, width, self.scale, self.ratio, self.flip)
        reduce = self._reduction(image, min(h, w), self.size)
        if isinstance(image, Encoded) and image.decodes_regions:
            out = _decode_box(image, (left, top, left + w, top + h), reduce, self.size)
        else:
            pixels = _pixels(image, reduce)
            if pixels.shape[:2] == (height, width):
                out = resize_box(pixels, top, left, h, w, self.size, self.size)
            else:   # DCT-reduced: the box is fractional on the reduced grid
                sy, sx = pixels.shape[0] / height, pixels.shape[1] / width
                box = (left * sx, top * sy, (left + w) * sx, (top + h) * sy)
                out = resize_subpixel(pixels, box, self.size, self.size)
        if flip:
            out = out.flip(-1)   # ~20 us on 150 KB: cheaper here than a per-sample flag to the device
        return self._finish(out)


def val_geometry(height: int, width: int, size: int,
                 crop_fraction: float = CROP_FRACTION) -> tuple[int, int, int, int]:
    """Resize(int(size / crop_fraction)) + CenterCrop(size): (resized h, resized w, top, left).

    torchvision's arithmetic: the shorter side becomes `resize`, the longer int(...) of its
    scaled length, and the crop starts at round((resized - size) / 2).
    """
    resize = int(size / crop_fraction)
    if width <= height:
        new_w, new_h = resize, int(resize * height / width)
    else:
        new_h, new_w = resize, int(resize * width / height)
    return new_h, new_w, int(round((new_h - size) / 2.0)), int(round((new_w - size) / 2.0))


def val_box(height: int, width: int, size: int,
            crop_fraction: float = CROP_FRACTION) -> tuple[float, float, float, float]:
    """The centre crop of `val_geometry` as a box in source pixels (left, top, right, bottom)."""
    new_h, new_w, top, left = val_geometry(height, width, size, crop_fraction)
    sx, sy = width / new_w, height / new_h
    return left * sx, top * sy, (left + size) * sx, (top + size) * sy


class ValTransform(_Transform):
    """Resize the shorter side to size / 0.875, centre-crop size; uint8 or normalised float CHW.
    The whole (possibly DCT-reduced) image is resized, then cropped: torchvision's order."""

    def __init__(self, size: int = 224, crop_fraction: float = CROP_FRACTION,
                 mean=IMAGENET_MEAN, std=IMAGENET_STD, draft: bool = True,
                 normalize: bool = True):
        super().__init__(size, mean, std, draft, normalize)
        self.crop_fraction = crop_fraction

    def __call__(self, image, rng: np.random.Generator | SampleStream | None = None) -> torch.Tensor:
        height, width = _size(image)
        new_h, new_w, top, left = val_geometry(height, width, self.size, self.crop_fraction)
        reduce = self._reduction(image, min(height, width), min(new_h, new_w))
        if reduce > 1 and isinstance(image, Encoded) and image.decodes_regions:
            box = val_box(height, width, self.size, self.crop_fraction)
            return self._finish(_decode_box(image, box, reduce, self.size))
        # At full resolution the whole image: the centre crop's resize reads ~80 % of its rows
        # and columns, and decoding only those measured no faster (2.0-2.2 ms either way).
        pixels = _pixels(image, reduce)
        if pixels.shape[:2] != (height, width):   # DCT-reduced: a fractional box, as for training
            left_, top_, right, bottom = val_box(height, width, self.size, self.crop_fraction)
            sy, sx = pixels.shape[0] / height, pixels.shape[1] / width
            return self._finish(resize_subpixel(pixels, (left_ * sx, top_ * sy, right * sx,
                                                         bottom * sy), self.size, self.size))
        resized = resize_box(pixels, 0, 0, height, width, new_h, new_w)
        return self._finish(resized[:, top:top + self.size, left:left + self.size].contiguous())

"""The lab's dataset: image files in one folder per class (train), or a flat folder with a
labels file (val, as ImageNet's), decoded with Pillow. Plain torch, nothing of hpc_train."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

MEAN = np.array([0.485, 0.456, 0.406], dtype=np.float32)
STD = np.array([0.229, 0.224, 0.225], dtype=np.float32)


class ImageFiles(Dataset):
    """(image tensor 3 x size x size, class index) for each (file, class) pair."""

    def __init__(self, files: list[Path], labels: list[int], size: int):
        self.files, self.labels, self.size = files, labels, size

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, index: int):
        with Image.open(self.files[index]) as image:
            pixels = image.convert("RGB").resize((self.size, self.size), Image.BILINEAR)
        array = (np.asarray(pixels, dtype=np.float32) / 255.0 - MEAN) / STD
        return torch.from_numpy(array.transpose(2, 0, 1).copy()), self.labels[index]


def images(split: str, root: str, size: int = 32) -> ImageFiles | None:
    """The dataset of `split` under `root`: train/<class>/*.JPEG, or val/ with val_labels.txt
    ('file class' per line); None when the split is not there."""
    base = Path(root)
    classes = sorted(p.name for p in (base / "train").iterdir() if p.is_dir())
    index = {name: k for k, name in enumerate(classes)}
    if split == "train":
        pairs = [(f, index[c]) for c in classes for f in sorted((base / "train" / c).iterdir())]
    elif split == "val" and (base / "val_labels.txt").is_file():
        lines = (base / "val_labels.txt").read_text().split("\n")
        pairs = [(base / "val" / name, index[label])
                 for name, label in (line.split() for line in lines if line.strip())]
    else:
        return None
    return ImageFiles([f for f, _ in pairs], [k for _, k in pairs], size)

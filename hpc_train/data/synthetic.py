"""A learnable synthetic image set: each class is a fixed random pattern plus per-sample noise.

Random labels on random pixels cannot be learned, so a falling loss would prove nothing; here
the class pattern is recoverable, so a training run that works shows a loss that goes down.
Every sample is a pure function of (seed, index): any rank or worker regenerates it alike. There
is no augmentation, so the epoch of a training `SampleKey` changes nothing.
"""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from hpc_train.data.sampler import SampleKey, as_key


class SyntheticImages(Dataset):
    def __init__(self, num_samples: int, num_classes: int, image_size: int, seed: int = 0,
                 noise: float = 2.0, first_index: int = 0):
        # first_index: a split's place in the sample space (validation draws other samples of
        # the same classes by starting far from the training indices).
        self.first_index = first_index
        self.num_samples, self.num_classes = num_samples, num_classes
        self.image_size, self.seed, self.noise = image_size, seed, noise
        patterns = torch.Generator().manual_seed(seed)
        self.patterns = torch.randn(num_classes, 3, image_size, image_size, generator=patterns)

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, key: int | SampleKey) -> tuple[torch.Tensor, int]:
        index = as_key(key).index
        if not 0 <= index < self.num_samples:
            raise IndexError(f"sample {index} outside 0..{self.num_samples - 1}")
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + self.first_index + index + 1)
        label = int(torch.randint(self.num_classes, (1,), generator=gen))
        noise = torch.randn(3, self.image_size, self.image_size, generator=gen)
        return self.patterns[label] + self.noise * noise, label

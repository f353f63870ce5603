"""Each rank's part of an epoch: equal sizes, shuffled deterministically from (seed, epoch).

Equal parts matter: a rank with one batch more waits forever in a collective the others never
join. The remainder (fewer than `size` samples per epoch) is dropped; shuffling changes which
samples those are from epoch to epoch.
"""

from __future__ import annotations

import numpy as np


def epoch_order(num_samples: int, seed: int, epoch: int, shuffle: bool) -> np.ndarray:
    if not shuffle:
        return np.arange(num_samples)
    return np.random.default_rng([seed, epoch]).permutation(num_samples)


def rank_indices(num_samples: int, rank: int, size: int, *, seed: int, epoch: int,
                 shuffle: bool = True) -> np.ndarray:
    """The indices rank `rank` of `size` reads in `epoch`: a contiguous slice of one permutation."""
    per_rank = num_samples // size
    order = epoch_order(num_samples, seed, epoch, shuffle)
    return order[rank * per_rank:(rank + 1) * per_rank]


class EvenShardSampler:
    """A torch-compatible sampler (an iterable of indices with a length) over `rank_indices`."""

    def __init__(self, num_samples: int, rank: int, size: int, *, seed: int = 0,
                 shuffle: bool = True):
        if num_samples < size:
            raise ValueError(f"{num_samples} samples cannot give each of {size} ranks one")
        self.num_samples, self.rank, self.size = num_samples, rank, size
        self.seed, self.shuffle = seed, shuffle
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return self.num_samples // self.size

    def __iter__(self):
        indices = rank_indices(self.num_samples, self.rank, self.size, seed=self.seed,
                               epoch=self.epoch, shuffle=self.shuffle)
        return iter(indices.tolist())

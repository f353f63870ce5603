"""Each rank's part of an epoch: equal sizes, shuffled deterministically from (seed, epoch).

Equal parts matter: a rank with one batch more waits forever in a collective the others never
join. The remainder (fewer than one global step's samples per epoch) is dropped; shuffling
changes which samples those are from epoch to epoch.

Two samplers:
- `ResumableBlockSampler`: for training (shards and synthetic data alike). The epoch order
  shuffles blocks of `block_size` consecutive samples, then the samples inside each block, so a
  batch touches few shard regions (HDF5 reads and page-cache/readahead stay local). Ranks take
  their slice of each PASS (one batch on every rank: `samples_per_pass`, a backward pass of all
  ranks together); a STEP is `passes_per_step` passes (accumulation). The position in an epoch is
  one number, `consumed` (samples of the epoch's order trained), which means the same thing at
  any world size: a resume on other ranks, or with another batch or accumulation, cuts the rest
  of the same order into its own passes, so nothing repeats and nothing is skipped. It yields
  `SampleKey(epoch, index)`: the epoch travels with every index, so a dataset draws the sample's
  augmentation from (seed, epoch, index) alone, even as the copy made once in a persistent worker.
  The epoch's tail: an epoch trains `order[:end]`, where `end` leaves out fewer samples than one
  step of the global batch that finishes the epoch (the rest of the order after `consumed`, in
  whole steps); a resume at another global batch moves `end` by less than one step.
- `ValidationSampler`: every sample exactly once, contiguous parts that differ by at most one.
"""

from __future__ import annotations

from functools import partial
from typing import NamedTuple

import numpy as np


class SampleKey(NamedTuple):
    """A training sample as `ResumableBlockSampler` names it: which epoch draws global `index`."""

    epoch: int
    index: int


def as_key(key) -> SampleKey:
    """What a dataset's `__getitem__` receives, as a SampleKey.

    A plain index (`ValidationSampler`, direct indexing) counts as epoch 0: validation transforms
    draw nothing, and `ds[g]` stays a pure function of `g`.
    """
    return key if isinstance(key, SampleKey) else SampleKey(0, int(key))


# -- training: block-shuffled, sliced per pass, resumable --------------------------------------

def block_order(num_samples: int, seed: int, epoch: int, block_size: int,
                shuffle: bool = True) -> np.ndarray:
    """The epoch's global order: blocks of consecutive indices in shuffled order, each shuffled.

    Pure in (num_samples, seed, epoch, block_size): every rank computes the same array.
    """
    if not shuffle:
        return np.arange(num_samples)
    rng = np.random.default_rng([seed, epoch, block_size])
    num_blocks = -(-num_samples // block_size)
    block_position = rng.permutation(num_blocks)
    within = rng.random(num_samples)
    # Sort by (position of the sample's block, random key): lexsort's last key is the primary.
    return np.lexsort((within, block_position[np.arange(num_samples) // block_size]))


def rank_batches(order: np.ndarray, rank: int, world: int, batch_per_rank: int,
                 consumed: int = 0, passes_per_step: int = 1) -> np.ndarray:
    """Rank `rank`'s indices of what remains after `consumed` samples of `order`.

    Pass s covers order[consumed + s*P : consumed + (s+1)*P] (P = world x batch_per_rank);
    rank r takes its r-th contiguous sub-slice of batch_per_rank. The tail that does not fill
    a step (`passes_per_step` passes) is dropped, so every rank yields the same whole steps.
    """
    per_pass = world * batch_per_rank
    remaining = order[consumed:]
    passes = len(remaining) // (per_pass * passes_per_step) * passes_per_step
    return remaining[:passes * per_pass].reshape(passes, world, batch_per_rank)[:, rank].ravel()


BLOCK_SIZE = 256     # our shards: written shuffled, read in runs of nearby samples


def block_size_for(data_kind: str) -> int:
    """The training order's block size for a data kind: a user's dataset (kind `dataset`) is
    shuffled sample by sample, since many are sorted by class (an image folder), which blocks
    would turn into batches of one class."""
    return 1 if data_kind == "dataset" else BLOCK_SIZE


class ResumableBlockSampler:
    """Torch sampler (iterable of SampleKeys with a length) over `block_order` + `rank_batches`.

    Use with DataLoader(batch_size=batch_per_rank, drop_last=True). Protocol for the trainer:
      sampler.set_epoch(epoch, consumed)   # before iterating; consumed=0 for a fresh epoch
      iterate sampler.steps_left(consumed) steps of passes_per_step batches each
      checkpoint: the position (epoch, consumed) is the trainer's (train/state.Progress), with
                  sampler.state_dict() (the data it orders), checked by load_state_dict at resume
    `consumed` must come from the trainer (steps it trained), never from this sampler's own
    iteration: DataLoader workers prefetch, so the sampler runs ahead of training.
    """

    def __init__(self, num_samples: int, rank: int, world: int, batch_per_rank: int, *,
                 passes_per_step: int = 1, seed: int = 0, block_size: int = BLOCK_SIZE,
                 shuffle: bool = True, fingerprint: str | None = None):
        if not 0 <= rank < world:
            raise ValueError(f"rank {rank} is outside 0..{world - 1}")
        if min(batch_per_rank, block_size, passes_per_step) < 1:
            raise ValueError(f"batch_per_rank ({batch_per_rank}), block_size ({block_size}) and "
                             f"passes_per_step ({passes_per_step}) must be >= 1")
        if num_samples < world * batch_per_rank * passes_per_step:
            raise ValueError(f"{num_samples} samples do not fill one step of {passes_per_step} "
                             f"pass(es) of {world} ranks x {batch_per_rank}")
        self.num_samples, self.rank, self.world = num_samples, rank, world
        self.batch_per_rank, self.passes_per_step = batch_per_rank, passes_per_step
        self.seed, self.block_size, self.shuffle = seed, block_size, shuffle
        # What the data declares it is (a user's dataset's `fingerprint`): checked at resume.
        self.fingerprint = fingerprint
        self.epoch, self.start = 0, 0

    @property
    def samples_per_pass(self) -> int:
        """Samples of one backward pass of all ranks: one batch each."""
        return self.world * self.batch_per_rank

    @property
    def samples_per_step(self) -> int:
        """Samples of one optimizer step over all ranks (`JobSpec.samples_per_step`)."""
        return self.samples_per_pass * self.passes_per_step

    def steps_left(self, consumed: int) -> int:
        """Whole steps of the epoch's order after `consumed` samples: what the epoch still trains."""
        return (self.num_samples - consumed) // self.samples_per_step

    @property
    def steps_per_epoch(self) -> int:
        """Steps of a whole epoch at this global batch."""
        return self.steps_left(0)

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        """The next iteration yields epoch `epoch` from global position `consumed`."""
        if not 0 <= consumed <= self.num_samples:
            raise ValueError(f"consumed {consumed} is outside 0..{self.num_samples}")
        self.epoch, self.start = epoch, consumed

    def __len__(self) -> int:
        return self.steps_left(self.start) * self.passes_per_step * self.batch_per_rank

    def __iter__(self):
        order = block_order(self.num_samples, self.seed, self.epoch, self.block_size, self.shuffle)
        mine = rank_batches(order, self.rank, self.world, self.batch_per_rank, self.start,
                            self.passes_per_step)
        return map(partial(SampleKey, self.epoch), mine.tolist())

    def state_dict(self) -> dict:
        """What the epoch order depends on (not the position: the trainer's Progress has it)."""
        state = {"seed": self.seed, "block_size": self.block_size, "num_samples": self.num_samples}
        return {**state, "fingerprint": self.fingerprint} if self.fingerprint is not None else state

    def load_state_dict(self, state: dict) -> None:
        """Refuse a checkpoint of other data: its position would point into another order. (A
        fingerprint is compared where both the checkpoint and the data have one.)"""
        from hpc_train.errors import DataError

        keys = ("seed", "block_size", "num_samples")
        if state.get("fingerprint") is not None and self.fingerprint is not None:
            keys += ("fingerprint",)
        for key in keys:
            if state[key] != getattr(self, key):
                raise DataError(f"sampler state has {key}={state[key]}, this run has "
                                f"{getattr(self, key)}: the epoch order would differ, so the "
                                "position cannot be resumed (same data and data settings needed)")


# -- validation: every sample once ------------------------------------------------------------

def validation_part(num_samples: int, rank: int, world: int) -> range:
    """Rank `rank`'s contiguous part; sizes differ by at most one, all parts cover every sample."""
    base, extra = divmod(num_samples, world)
    first = rank * base + min(rank, extra)
    return range(first, first + base + (rank < extra))


class ValidationSampler:
    """Every sample exactly once, no shuffle. Parts may differ by one sample, so ranks may run
    different numbers of batches: use DataLoader(drop_last=False), run no collective per batch,
    and allreduce (loss sum, correct, count) once at the end (sums, not means, weight correctly).
    """

    def __init__(self, num_samples: int, rank: int, world: int):
        self.part = validation_part(num_samples, rank, world)

    def set_epoch(self, epoch: int) -> None:  # same order every epoch; here for uniformity
        pass

    def __len__(self) -> int:
        return len(self.part)

    def __iter__(self):
        return iter(self.part)

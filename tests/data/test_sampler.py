"""Block-shuffled, global-batch samplers: deterministic, equal, disjoint, local, exactly resumable."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from hpc_train.data.sampler import (ResumableBlockSampler, SampleKey, ValidationSampler, as_key,
                                    block_order, rank_batches, validation_part)
from hpc_train.errors import DataError


def _epoch(num_samples, world, batch, seed=3, epoch=0, block_size=16, consumed=0):
    """Each rank's global indices (the keys' epochs checked on the way)."""
    parts = []
    for rank in range(world):
        s = ResumableBlockSampler(num_samples, rank, world, batch, seed=seed, block_size=block_size)
        s.set_epoch(epoch, consumed)
        keys = list(s)
        assert all(type(key) is SampleKey and key.epoch == epoch for key in keys)
        parts.append([key.index for key in keys])
    return parts


def test_block_order_is_a_deterministic_permutation_that_changes_per_epoch():
    a = block_order(1000, seed=1, epoch=0, block_size=64)
    assert sorted(a.tolist()) == list(range(1000))
    assert np.array_equal(a, block_order(1000, seed=1, epoch=0, block_size=64))
    assert not np.array_equal(a, block_order(1000, seed=1, epoch=1, block_size=64))
    assert not np.array_equal(a, block_order(1000, seed=2, epoch=0, block_size=64))
    assert np.array_equal(block_order(10, 1, 0, 4, shuffle=False), np.arange(10))


def test_block_order_keeps_blocks_together_and_shuffles_inside_them():
    order = block_order(1000, seed=0, epoch=0, block_size=64)
    blocks = order // 64
    # Each block's samples form one run of the order (the last block has only 1000 - 960 = 40).
    runs = [blocks[i] for i in range(len(blocks)) if i == 0 or blocks[i] != blocks[i - 1]]
    assert sorted(runs) == list(range(16))
    assert runs != sorted(runs)                               # block order shuffled
    assert not np.array_equal(order[:64], np.sort(order[:64]))  # and inside the block


@pytest.mark.parametrize("num_samples, world, batch", [(1000, 4, 8), (999, 3, 5), (64, 1, 64)])
def test_ranks_get_equal_disjoint_parts_of_whole_passes(num_samples, world, batch):
    parts = _epoch(num_samples, world, batch)
    per_pass = world * batch
    passes = num_samples // per_pass
    assert {len(p) for p in parts} == {passes * batch}
    joined = sum(parts, [])
    assert len(set(joined)) == len(joined)
    # Pass s is exactly positions [s*P, (s+1)*P) of the epoch order, rank r's sub-slice r.
    order = block_order(num_samples, 3, 0, 16).tolist()
    for s in range(passes):
        together = sum((p[s * batch:(s + 1) * batch] for p in parts), [])
        assert together == order[s * per_pass:(s + 1) * per_pass]


def test_a_rank_batch_lies_in_few_blocks():
    block_size, batch = 256, 64
    parts = _epoch(100_000, 4, batch, block_size=block_size)
    blocks_per_batch = [len({i // block_size for i in p[k:k + batch]})
                        for p in parts for k in range(0, len(p), batch)]
    # 64 consecutive positions fall in one block, or straddle two.
    assert max(blocks_per_batch) <= 2 and np.mean(blocks_per_batch) < 1.5


def test_interrupted_epoch_resumes_exactly():
    num_samples, world, batch = 1000, 2, 8
    full = _epoch(num_samples, world, batch, epoch=5)
    done = 7                                                   # batches trained before the stop
    for rank in range(world):
        s = ResumableBlockSampler(num_samples, rank, world, batch, seed=3, block_size=16)
        s.set_epoch(5)
        it = iter(s)
        [next(it) for _ in range(done * batch + 13)]           # prefetch ran ahead: irrelevant
        fresh = ResumableBlockSampler(num_samples, rank, world, batch, seed=3, block_size=16)
        fresh.load_state_dict(s.state_dict())
        fresh.set_epoch(5, done * world * batch)               # the trainer's position
        rest = [key.index for key in fresh]
        assert len(fresh) == len(rest)
        assert full[rank][:done * batch] + rest == full[rank]


def _trained(num_samples, segments, seed=3, epoch=0):
    """The epoch's samples in the order their steps trained them, over segments of
    (world, batch, passes_per_step, steps) (None: to the epoch's end), each going on from the
    last one's position as the trainer does."""
    trained, consumed = [], 0
    for world, batch, passes, steps in segments:
        samplers = [ResumableBlockSampler(num_samples, r, world, batch, passes_per_step=passes,
                                          seed=seed, block_size=16) for r in range(world)]
        for s in samplers:
            s.set_epoch(epoch, consumed)
        left = samplers[0].steps_left(consumed)
        steps = left if steps is None else steps
        parts = [[key.index for key in s] for s in samplers]
        per_pass = world * batch
        for step in range(steps):
            for k in range(passes):                            # pass k of the step, rank by rank
                at = (step * passes + k) * batch
                trained += sum((p[at:at + batch] for p in parts), [])
        consumed += steps * per_pass * passes
    return trained, consumed


@pytest.mark.parametrize("segments", [
    [(2, 32, 1, 20), (4, 32, 1, None)],            # 64 -> 128 samples per step
    [(2, 32, 1, 20), (1, 32, 1, None)],            # 64 -> 32
    [(2, 32, 1, 20), (1, 32, 2, None)],            # 64 kept by accumulation 2
    [(4, 8, 1, 5), (3, 5, 2, 7), (2, 16, 1, None)],
])
def test_resume_at_another_global_batch_goes_on_in_the_same_order(segments):
    """Nothing repeated, nothing skipped: the steps trained are a prefix of the epoch's order,
    and the tail left out is smaller than one step of the segment that ends the epoch."""
    num_samples = 3000
    trained, consumed = _trained(num_samples, segments)
    order = block_order(num_samples, 3, 0, 16).tolist()
    assert trained == order[:len(trained)] and len(trained) == consumed
    world, batch, passes, _ = segments[-1]
    assert 0 <= num_samples - consumed < world * batch * passes


def test_rank_batches_drops_only_the_tail():
    order = np.arange(23)
    assert rank_batches(order, 1, 2, 3).tolist() == [3, 4, 5, 9, 10, 11, 15, 16, 17]
    assert rank_batches(order, 0, 2, 3, consumed=12).tolist() == [12, 13, 14]
    # Steps of two passes: the third pass does not make a step, so it is left out.
    assert rank_batches(order, 1, 2, 3, passes_per_step=2).tolist() == [3, 4, 5, 9, 10, 11]


class KeyEcho(torch.utils.data.Dataset):
    """(epoch, index) of each key, as a training dataset sees them."""

    def __len__(self):
        return 100

    def __getitem__(self, key):
        return torch.tensor(as_key(key))


def test_loader_length_and_epoch_change():
    s = ResumableBlockSampler(100, 0, 2, 5, block_size=8)
    loader = DataLoader(KeyEcho(), batch_size=5, sampler=s, drop_last=True)
    assert len(loader) == s.steps_per_epoch == 10
    assert s.samples_per_pass == s.samples_per_step == 2 * 5 and s.steps_left(30) == 7
    s.set_epoch(0, consumed=30)
    assert len(loader) == 7 and s.steps_per_epoch == 10
    assert sum(len(b) for b in loader) == 35
    s.set_epoch(1)
    batches = list(loader)
    assert len(batches) == 10 and all((b[:, 0] == 1).all() for b in batches)   # epoch reaches it
    accumulating = ResumableBlockSampler(100, 0, 2, 5, passes_per_step=3)
    assert (accumulating.samples_per_step, accumulating.steps_per_epoch, len(accumulating)) == (30, 3, 45)


def test_a_plain_index_is_epoch_zero():
    assert as_key(7) == as_key(np.int64(7)) == SampleKey(0, 7)
    assert as_key(SampleKey(3, 7)) == SampleKey(3, 7)


def test_state_from_other_data_is_refused():
    s = ResumableBlockSampler(100, 0, 1, 10)
    state = s.state_dict()
    other = ResumableBlockSampler(101, 0, 1, 10)
    with pytest.raises(DataError, match="num_samples=100, this run has 101"):
        other.load_state_dict(state)
    with pytest.raises(ValueError, match="do not fill one step"):
        ResumableBlockSampler(10, 0, 4, 3)


@pytest.mark.parametrize("num_samples, world", [(10, 3), (9, 3), (2, 4), (1000, 7)])
def test_validation_covers_every_sample_once_in_near_equal_parts(num_samples, world):
    parts = [list(ValidationSampler(num_samples, r, world)) for r in range(world)]
    assert sum(parts, []) == list(range(num_samples))
    assert max(map(len, parts)) - min(map(len, parts)) <= 1
    assert validation_part(10, 0, 3) == range(0, 4)

"""Augmentation is a pure function of (run seed, epoch, sample index): exact resume on real shards.

The shards are the project's own: `data demo` images (textured, varied sizes) through `data shard`,
so random crops really differ. Loaders come from `build_loaders`, as the trainer gets them.
"""

from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader

from hpc_train.cli import main
from hpc_train.data import decode
from hpc_train.data.sampler import SampleKey
from hpc_train.data.shard_dataset import ShardedImages
from hpc_train.data.transforms import TrainTransform, rrc_params, sample_rng
from hpc_train.spec import load_spec
from hpc_train.train.data import build_loaders
from tests.conftest import REPO

SEED = 5


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    """36 training samples in 4 shards (10, 10, 10, 6) and 6 validation samples."""
    tmp = tmp_path_factory.mktemp("augment")
    assert main(["data", "demo", "--out", str(tmp / "demo"), "--classes", "3", "--per-class", "12",
                 "--val-per-class", "2", "--size", "32"]) == 0
    out = tmp / "shards"
    assert main(["data", "shard", "--src", str(tmp / "demo/train"), "--out", str(out),
                 "--shard-size", "10"]) == 0
    assert main(["data", "shard", "--src", str(tmp / "demo/val"), "--labels",
                 str(tmp / "demo/val_labels.txt"), "--split", "val", "--out", str(out),
                 "--classes", str(out / "train/manifest.json")]) == 0
    return out


def loaders(shards, *, workers: int, batch: int = 4, rank: int = 0, world: int = 1,
            start_method: str = "fork"):
    spec = load_spec(REPO / "jobs/smoke.yaml", [
        f"data.path={shards}", "data.num_classes=3", "data.image_size=16",
        f"data.batch_size={batch}", f"data.workers={workers}", f"data.start_method={start_method}",
        f"run.seed={SEED}"])
    return build_loaders(spec, rank, world, pin=False)


def expected(dataset, keys) -> tuple[torch.Tensor, torch.Tensor]:
    """What the keys give read one by one in this process: the reference for every loader."""
    samples = [dataset[key] for key in keys]
    return torch.stack([image for image, _ in samples]), torch.tensor([label for _, label in samples])


def joined(batches) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.cat([images for images, _ in batches]), torch.cat([labels for _, labels in batches])


def worker_pids(loader) -> list[int]:
    return [w.pid for w in loader._iterator._workers]


@pytest.mark.parametrize("workers, start_method", [(0, "fork"), (2, "fork"), (2, "forkserver"),
                                                   (2, "spawn")])
def test_a_key_gives_the_same_tensors_in_any_loader(shards, workers, start_method):
    train, _ = loaders(shards, workers=workers, start_method=start_method)
    sampler, dataset = train.sampler, train.dataset
    assert isinstance(dataset, ShardedImages) and dataset.seed == SEED
    pids = None
    for epoch in (0, 1):
        sampler.set_epoch(epoch)
        keys = list(sampler)
        images, labels = joined(list(train))
        reference = expected(dataset, keys)
        assert torch.equal(images, reference[0]) and torch.equal(labels, reference[1])
        if workers:   # persistent: epoch 1 ran in epoch 0's processes, on their copy of the dataset
            assert pids is None or worker_pids(train) == pids
            pids = worker_pids(train)


@pytest.mark.parametrize("decoder", decode.DECODERS)
def test_resumed_epoch_equals_the_tail_of_the_uninterrupted_one(shards, decoder, jpeg_decoders,
                                                                monkeypatch):
    if decoder not in jpeg_decoders:
        pytest.skip(f"{decoder} is not installed")
    monkeypatch.setenv(decode.DECODER_ENV, decoder)         # workers inherit it
    assert decode.jpeg_decoder() == decoder
    train, _ = loaders(shards, workers=0, batch=4)
    train.sampler.set_epoch(2)
    uninterrupted = list(train)
    done = 3                                                # batches trained before the stop
    state = train.sampler.state_dict()
    # Resumed on 2 ranks of 2 samples (same 4 samples per pass), each with 2 persistent workers.
    ranks = []
    for rank in range(2):
        resumed, _ = loaders(shards, workers=2, batch=2, rank=rank, world=2)
        resumed.sampler.load_state_dict(state)                  # the same data: accepted
        resumed.sampler.set_epoch(2, done * 4)                  # the trainer's position
        ranks.append(list(resumed))
    tail = uninterrupted[done:]
    assert len(ranks[0]) == len(ranks[1]) == len(tail) > 0
    for whole, part0, part1 in zip(tail, *ranks):
        assert torch.equal(whole[0], torch.cat([part0[0], part1[0]]))
        assert torch.equal(whole[1], torch.cat([part0[1], part1[1]]))


def test_epochs_indices_and_seeds_draw_different_crops(shards):
    dataset = ShardedImages(shards, "train", TrainTransform(16), seed=SEED)
    other_seed = ShardedImages(shards, "train", TrainTransform(16), seed=SEED + 1)
    for index in range(len(dataset)):
        image = dataset[SampleKey(0, index)][0]
        assert torch.equal(image, dataset[index][0])                 # a plain index is epoch 0
        assert not torch.equal(image, dataset[SampleKey(1, index)][0])
        assert not torch.equal(image, other_seed[SampleKey(0, index)][0])
    # Same image, other indices: the stream itself differs, not just the pixels.
    crops = {rrc_params(300, 400, sample_rng(SEED, 0, index)) for index in range(100)}
    assert len(crops) == 100


def test_loaders_leave_the_global_torch_rng_alone(shards):
    before = torch.get_rng_state()
    for workers in (0, 2):
        train, val = loaders(shards, workers=workers)
        for loader in (train, val, train):                 # twice: persistent iterators reused
            assert sum(len(labels) for _, labels in loader) > 0
    assert torch.equal(torch.get_rng_state(), before)
    # The check bites: a loader without its own generator draws from the global RNG at iter().
    iter(DataLoader(train.dataset, batch_size=4))
    assert not torch.equal(torch.get_rng_state(), before)

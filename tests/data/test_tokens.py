"""Byte-token data: the generated corpus, HDF5 token shards from `data tokenize`, the reader."""

from __future__ import annotations

import h5py
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from hpc_train.data.sampler import SampleKey
from hpc_train.data.tokens import TokenShards, TokenWindows, generate_corpus
from hpc_train.errors import DataError
from tests.conftest import REPO
from tests.runs import cli


def test_corpus_is_deterministic_text_of_the_asked_size():
    corpus = generate_corpus(5000, seed=3)
    assert len(corpus) == 5000 and corpus == generate_corpus(5000, seed=3)
    assert corpus != generate_corpus(5000, seed=4)
    assert corpus.decode().count(". ") > 50            # sentences, not noise


def test_windows_are_shifted_by_one():
    tokens = np.frombuffer(b"abcdefghij", dtype=np.uint8)
    windows = TokenWindows(tokens, seq_len=3)
    assert len(windows) == 3                           # (10 - 1) // 3
    x, y = windows[1]
    assert bytes(x.numpy().astype(np.uint8)) == b"def" and bytes(y.numpy().astype(np.uint8)) == b"efg"
    assert x.dtype == torch.int64
    # The training sampler's keys read the same window whatever the epoch (no augmentation).
    assert all(torch.equal(a, b) for a, b in zip(windows[SampleKey(4, 1)], (x, y)))


@pytest.fixture(scope="module")
def shards(tmp_path_factory):
    out = tmp_path_factory.mktemp("tokens")
    text = tmp_path_factory.mktemp("text") / "book.txt"
    text.write_bytes(generate_corpus(30_000, seed=1))
    result = cli("data", "tokenize", str(text), "--out", str(out), "--shard-tokens", "7000",
                 "--val-fraction", "0.1")
    assert result.returncode == 0, result.stderr
    return out, text.read_bytes()


def test_tokenize_writes_train_and_val_shards_of_the_given_bytes(shards):
    out, data = shards
    train = TokenShards(out, "train", seq_len=32)
    val = TokenShards(out, "val", seq_len=32)
    assert len(train.files) == 4 and len(val.files) == 1          # 27000 train bytes / 7000
    stored = b"".join(h5py.File(f, "r")["tokens"][()].tobytes() for f in train.files)
    assert stored == data[:27_000]
    # Every window is a real slice of its shard, input and target shifted by one.
    for index in (0, len(train) // 2, len(train) - 1):
        x, y = train[index]
        assert torch.equal(x[1:], y[:-1])
        assert bytes(x.numpy().astype(np.uint8)) in data
    assert len(train) == sum((7000 - 1) // 32 for _ in range(3)) + (27_000 - 21_000 - 1) // 32


def test_worker_processes_read_the_same_windows(shards):
    out, _ = shards
    dataset = TokenShards(out, "train", seq_len=32)
    plain = [b for b in DataLoader(dataset, batch_size=16)]
    forked = [b for b in DataLoader(dataset, batch_size=16, num_workers=2,
                                    multiprocessing_context="fork")]
    assert all(torch.equal(a[0], b[0]) for a, b in zip(plain, forked))


def test_training_loader_reads_the_windows_its_sampler_names(shards):
    from hpc_train.spec import load_spec
    from hpc_train.train.data import build_loaders

    out, _ = shards
    spec = load_spec(REPO / "jobs/transformer_pipeline_cpu.yaml", [
        "data.kind=tokens", f"data.path={out}", "data.seq_len=32", "data.workers=2"])
    train, val = build_loaders(spec, 0, 1, pin=False)
    train.sampler.set_epoch(1)
    keys = list(train.sampler)[:spec.data.batch_size]
    x, y = next(iter(train))
    assert torch.equal(x, torch.stack([train.dataset[k.index][0] for k in keys]))
    assert torch.equal(x[:, 1:], y[:, :-1]) and len(next(iter(val))[0]) > 0


def test_truncated_or_corrupt_shards_raise_data_errors(shards, tmp_path):
    out, _ = shards
    import shutil
    copy = tmp_path / "copy"
    shutil.copytree(out, copy)
    first = copy / "train" / "tokens-00000.h5"
    with h5py.File(first, "r+") as f:                 # truncate: the manifest promises more
        del f["tokens"]
        f.create_dataset("tokens", data=np.zeros(100, dtype=np.uint8))
    dataset = TokenShards(copy, "train", seq_len=32)
    with pytest.raises(DataError, match="tokens-00000.h5.*short") as truncated:
        dataset[50]
    (copy / "train" / "tokens-00001.h5").write_bytes(b"not hdf5 at all")
    with pytest.raises(DataError, match="tokens-00001.h5: cannot read token shard") as unreadable:
        dataset[len(dataset) // 2]
    # `diagnose` knows both, as a rank's log shows them (the last line of the traceback).
    from hpc_train.inspection.signatures import match_signatures

    for caught in (truncated, unreadable):
        line = f"hpc_train.errors.DataError: {caught.value}"
        assert [m.signature.id for m in match_signatures([("rank-00000.log", line)])] == ["corrupt_shard"]


def test_tokenize_refuses_a_missing_input(tmp_path):
    result = cli("data", "tokenize", str(tmp_path / "nope.txt"), "--out", str(tmp_path / "o"))
    assert result.returncode == 6 and "nope.txt" in result.stderr


def test_data_text_writes_the_generated_corpus_as_text_files(tmp_path, capsys):
    """What env/setup.sh writes for the example of a dataset of the user's own (jobs/hf_lm.yaml):
    the corpus of data.kind text, train from the seed, val from the next one."""
    from hpc_train.cli import main

    assert main(["data", "text", "--out", str(tmp_path / "t"), "--bytes", "3000",
                 "--val-bytes", "500", "--seed", "2"]) == 0
    assert (tmp_path / "t/train.txt").read_bytes() == generate_corpus(3000, 2)
    assert (tmp_path / "t/val.txt").read_bytes() == generate_corpus(500, 3)
    assert "train.txt (3,000 bytes)" in capsys.readouterr().out
    assert main(["data", "text", "--out", str(tmp_path / "u"), "--val-bytes", "0"]) == 0
    assert sorted(p.name for p in (tmp_path / "u").iterdir()) == ["train.txt"]
    assert len((tmp_path / "u/train.txt").read_bytes()) == 1 << 16

"""Byte-level token data for the gpt model: a generated corpus, HDF5 token shards, windows.

Tokens are bytes (vocabulary 256), so any UTF-8 text is data and no tokenizer ships with us.
Layout (`python -m hpc_train data tokenize`): DIR/<split>/tokens-NNNNN.h5 each holding a 1-D
uint8 dataset `tokens`, and DIR/<split>/manifest.json {"kind": "tokens", "vocab": 256,
"shards": [{"file", "tokens", "sha256"}]}. A sample is a window of seq_len + 1 tokens
(input = first seq_len, target = last seq_len); windows never cross a shard. Windows are read
as they are (no augmentation): the epoch of a training `SampleKey` changes nothing.
"""

from __future__ import annotations

import bisect
import hashlib
import json
import os
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset

from hpc_train.data.manifest import token_windows
from hpc_train.data.sampler import SampleKey, as_key
from hpc_train.errors import DataError
from hpc_train.spec.schema import BYTE_VOCAB as VOCAB   # the spec's data.vocab_size must match
_SUBJECTS = ("the cat", "a dog", "the model", "every rank", "the scheduler", "a student",
             "the cluster", "my node", "the pipeline", "a bird")
_VERBS = ("sees", "trains", "waits for", "follows", "saves", "reads", "likes", "sends")
_OBJECTS = ("the data", "a checkpoint", "the gradient", "a small fish", "the queue",
            "its neighbour", "the red ball", "every batch")


def generate_corpus(num_bytes: int, seed: int = 0) -> bytes:
    """Deterministic English-like sentences: learnable structure (words, grammar, counting)
    that a small model picks up in minutes, with no download."""
    rng = np.random.default_rng(seed)
    parts, size, count = [], 0, 0
    while size < num_bytes:
        count += 1
        sentence = (f"{_SUBJECTS[rng.integers(len(_SUBJECTS))]} "
                    f"{_VERBS[rng.integers(len(_VERBS))]} "
                    f"{_OBJECTS[rng.integers(len(_OBJECTS))]} {count % 100}. ")
        parts.append(sentence)
        size += len(sentence)
    return "".join(parts).encode()[:num_bytes]


def write_text_splits(out: Path, train_bytes: int, val_bytes: int, seed: int = 0) -> list[Path]:
    """OUT/train.txt (`seed`) and OUT/val.txt (`seed + 1`, other sentences of the same language;
    none for 0 bytes) of the generated corpus, each written whole or not at all."""
    from hpc_train.rundir import write_atomic

    out.mkdir(parents=True, exist_ok=True)
    written = []
    for name, size, split_seed in (("train.txt", train_bytes, seed), ("val.txt", val_bytes, seed + 1)):
        if size > 0:
            write_atomic(out / name, generate_corpus(size, split_seed))
            written.append(out / name)
    return written


class TokenWindows(Dataset):
    """(input, target) int64 windows of `seq_len` over in-memory tokens."""

    def __init__(self, tokens: np.ndarray, seq_len: int):
        self.tokens, self.seq_len = np.asarray(tokens, dtype=np.uint8), seq_len
        if len(self) < 1:
            raise DataError(f"{len(self.tokens)} tokens make no window of {seq_len + 1}")

    def __len__(self) -> int:
        return (len(self.tokens) - 1) // self.seq_len

    def __getitem__(self, key: int | SampleKey):
        start = as_key(key).index * self.seq_len
        window = torch.from_numpy(self.tokens[start:start + self.seq_len + 1].astype(np.int64))
        return window[:-1], window[1:]


# -- HDF5 token shards -------------------------------------------------------------------------

def write_token_shards(data: bytes, split_dir: Path, shard_tokens: int) -> dict:
    """Write `data` as shards of at most `shard_tokens` bytes; each via a tmp file + rename,
    the manifest last (a split without manifest is incomplete)."""
    import h5py

    split_dir.mkdir(parents=True, exist_ok=True)
    shards = []
    for number, start in enumerate(range(0, len(data), shard_tokens)):
        chunk = data[start:start + shard_tokens]
        name = f"tokens-{number:05d}.h5"
        tmp = split_dir / f".{name}.tmp"
        with h5py.File(tmp, "w") as f:
            f.create_dataset("tokens", data=np.frombuffer(chunk, dtype=np.uint8))
            f.attrs["vocab"] = VOCAB
        os.replace(tmp, split_dir / name)
        shards.append({"file": name, "tokens": len(chunk), "sha256": hashlib.sha256(chunk).hexdigest()})
    manifest = {"kind": "tokens", "vocab": VOCAB, "num_tokens": len(data), "shards": shards}
    (split_dir / "manifest.json").write_text(json.dumps(manifest, indent=1))
    return manifest


def tokenize_to_shards(data: bytes, out: Path, val_fraction: float, shard_tokens: int) -> dict:
    """Split bytes into train (the first part) and val (the last `val_fraction`) shards."""
    cut = len(data) - int(len(data) * val_fraction)
    return {"train": write_token_shards(data[:cut], out / "train", shard_tokens),
            "val": write_token_shards(data[cut:], out / "val", shard_tokens) if cut < len(data) else None}


class TokenShards(Dataset):
    """Windows over DIR/<split>/tokens-*.h5; files open lazily per process (fork-safe)."""

    def __init__(self, root: str | os.PathLike, split: str, seq_len: int):
        self.split_dir, self.seq_len = Path(root) / split, seq_len
        try:
            manifest = json.loads((self.split_dir / "manifest.json").read_text())
        except (OSError, ValueError) as exc:
            raise DataError(f"{self.split_dir}/manifest.json: {exc}; write the split with "
                            "`python -m hpc_train data tokenize --out DIR`") from None
        if manifest.get("kind") != "tokens" or manifest.get("vocab") != VOCAB:
            raise DataError(f"{self.split_dir}: not byte-token shards (kind {manifest.get('kind')!r})")
        self.files = [self.split_dir / s["file"] for s in manifest["shards"]]
        windows = token_windows(manifest, seq_len)
        self.starts = np.concatenate([[0], np.cumsum(windows)]).astype(np.int64).tolist()
        self._pid, self._open = None, {}

    def __len__(self) -> int:
        return self.starts[-1]

    def __getstate__(self):
        return {**self.__dict__, "_pid": None, "_open": {}}   # no HDF5 handle crosses a pickle

    def _file(self, k: int):
        import h5py

        if self._pid != os.getpid():   # inherited through fork: drop, never close, the parent's
            self._pid, self._open = os.getpid(), {}
        if k not in self._open:
            try:
                self._open[k] = h5py.File(self.files[k], "r")["tokens"]
            except (OSError, KeyError) as exc:
                raise DataError(f"{self.files[k]}: cannot read token shard: {exc}") from None
        return self._open[k]

    def __getitem__(self, key: int | SampleKey):
        index = as_key(key).index
        if not 0 <= index < len(self):
            raise IndexError(f"window {index} outside 0..{len(self) - 1} of {self.split_dir}")
        k = bisect.bisect_right(self.starts, index) - 1
        start = (index - self.starts[k]) * self.seq_len
        try:
            window = self._file(k)[start:start + self.seq_len + 1]
        except OSError as exc:
            raise DataError(f"{self.files[k]}: tokens {start}..{start + self.seq_len}: {exc}") from None
        if len(window) != self.seq_len + 1:
            raise DataError(f"{self.files[k]}: window {index} is short ({len(window)} tokens): "
                            "the shard is truncated; convert it again")
        window = torch.from_numpy(window.astype(np.int64))
        return window[:-1], window[1:]

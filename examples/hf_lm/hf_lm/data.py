"""Text files as byte sequences for a causal LM, read with Hugging Face `datasets`.

`text(split, root)` reads ROOT/<split>.txt with the `text` builder and cuts its bytes into
(ids, targets) pairs of `seq_len` tokens, targets shifted by one. The dataset's cache goes to a
temporary directory removed once the bytes are in memory (not ~/.cache), and its progress bars
and logs are off: what a rank prints is the training's.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path

import numpy as np
import torch
from torch.utils.data import Dataset


class ByteWindows(Dataset):
    """(ids, targets) int64 tensors of `seq_len` over `tokens`, windows one after the other."""

    def __init__(self, tokens: np.ndarray, seq_len: int):
        self.tokens, self.seq_len = tokens, seq_len
        # Checked at resume with the length: the same text, or the order means other samples.
        self.fingerprint = hashlib.sha256(tokens.tobytes()).hexdigest()[:16]

    def __len__(self) -> int:
        return max(0, (len(self.tokens) - 1) // self.seq_len)

    def __getitem__(self, index: int):
        start = index * self.seq_len
        window = torch.from_numpy(self.tokens[start:start + self.seq_len + 1].astype(np.int64))
        return window[:-1], window[1:]


def read_bytes(path: Path) -> np.ndarray:
    """The file's bytes as uint8 tokens, read through datasets' text builder line by line."""
    import datasets

    datasets.disable_progress_bars()
    datasets.logging.set_verbosity_error()
    with tempfile.TemporaryDirectory(prefix="hf_lm-datasets-") as cache:
        lines = datasets.load_dataset("text", data_files=str(path), split="train", cache_dir=cache,
                                      keep_linebreaks=True, keep_in_memory=True)
        encoded = lines.map(lambda batch: {"ids": [list(t.encode()) for t in batch["text"]]},
                            batched=True, remove_columns=["text"], keep_in_memory=True)
        return np.fromiter((b for ids in encoded["ids"] for b in ids), dtype=np.uint8)


def text(split: str, root: str, seq_len: int = 64) -> ByteWindows | None:
    """The `split` ("train", "val") of ROOT/<split>.txt; None when there is no such file."""
    path = Path(root) / f"{split}.txt"
    if not path.is_file():
        return None
    return ByteWindows(read_bytes(path), seq_len)

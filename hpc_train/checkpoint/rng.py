"""Every random stream a rank uses, as plain data that `torch.load(weights_only=True)` accepts."""

from __future__ import annotations

import random

import numpy as np
import torch


def capture_rng() -> dict:
    numpy_state = np.random.get_state()
    state = {
        "python": random.getstate(),
        "numpy": {"name": numpy_state[0], "keys": torch.from_numpy(numpy_state[1].copy()),
                  "pos": int(numpy_state[2]), "has_gauss": int(numpy_state[3]),
                  "cached_gaussian": float(numpy_state[4])},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng(state: dict) -> None:
    random.setstate(_as_tuples(state["python"]))
    n = state["numpy"]
    np.random.set_state((n["name"], n["keys"].numpy(), n["pos"], n["has_gauss"], n["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def _as_tuples(value):
    """random.setstate wants tuples; a round trip through some formats yields lists."""
    if isinstance(value, list | tuple):
        return tuple(_as_tuples(v) for v in value)
    return value

"""A rank's part of the model: a contiguous slice of the block list, with remat and autocast.

Parameters keep their index in the full list (`blocks.3.attn.qkv.weight` is block 3 wherever
it lives), so a stage's state maps one-to-one onto the single-process model's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

_AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


class StageModule(nn.Module):
    def __init__(self, blocks: Sequence[nn.Module], first_index: int, remat: bool = False,
                 precision: str = "fp32", device_type: str = "cpu"):
        super().__init__()
        self.blocks = nn.ModuleDict({str(first_index + i): b for i, b in enumerate(blocks)})
        self.remat, self.device_type = remat, device_type
        self.autocast_dtype = _AUTOCAST.get(precision)

    def _run_block(self, block: nn.Module, x: torch.Tensor) -> torch.Tensor:
        if self.remat and self.training and torch.is_grad_enabled():
            # Rematerialization: keep only the block's input; recompute its inside in backward.
            return checkpoint(block, x, use_reentrant=False)
        return block(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(self.device_type, dtype=self.autocast_dtype or torch.float32,
                            enabled=self.autocast_dtype is not None):
            for block in self.blocks.values():
                x = self._run_block(block, x)
        # Stage boundaries carry float32 (or int64 ids into the first stage): the receiving
        # stage and the gradient sent back then always agree on the dtype.
        return x.float() if x.is_floating_point() else x

    def block_state_dict(self) -> dict[str, torch.Tensor]:
        """State with the full model's names (`3.attn.qkv.weight`), as `nn.Sequential` has them."""
        return {name.removeprefix("blocks."): t for name, t in self.state_dict().items()}

    def load_block_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        self.load_state_dict({f"blocks.{name}": t for name, t in state.items()})


def slice_blocks(full: nn.Sequential, bounds: tuple[int, int]) -> list[nn.Module]:
    start, end = bounds
    return [full[i] for i in range(start, end)]


def parameter_costs(full: nn.Sequential) -> list[float]:
    return [float(sum(p.numel() for p in block.parameters())) for block in full]


def time_blocks(full: nn.Sequential, example: torch.Tensor, repeats: int = 3) -> list[float]:
    """Forward + backward seconds of each block on one micro-batch (the best of `repeats`)."""
    costs = []
    x = example
    for block in full:
        best = float("inf")
        for _ in range(repeats):
            inp = x.detach().requires_grad_(x.is_floating_point())
            start = time.perf_counter()
            out = block(inp)
            out.float().sum().backward()
            best = min(best, time.perf_counter() - start)
        costs.append(best)
        with torch.no_grad():
            x = block(x)
    full.zero_grad(set_to_none=True)
    return costs

"""A GPT-style causal Transformer as a flat list of blocks: [embedding, layer x N, head].

Flat on purpose: pipeline parallelism cuts this list into contiguous stages, and every block
takes one tensor and returns one tensor, so any cut is valid. Parameter names follow the
block's index in the list (`3.attn.qkv.weight`), the same in one process and in a stage.
No weight tying between embedding and head: tied weights on two stages would need their own
cross-stage all-reduce.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from hpc_train.models.catalog import GptOptions


class Embedding(nn.Module):
    """Token + learned position embeddings: (batch, seq) int64 -> (batch, seq, dim)."""

    def __init__(self, vocab: int, dim: int, seq_len: int, dropout: float = 0.0):
        super().__init__()
        self.tokens = nn.Embedding(vocab, dim)
        self.positions = nn.Embedding(seq_len, dim)
        self.dropout = nn.Dropout(dropout)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.dropout(self.tokens(ids) + self.positions(positions))


class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, dropout: float = 0.0):
        super().__init__()
        self.heads, self.dropout = heads, dropout
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, dim = x.shape
        q, k, v = self.qkv(x).split(dim, dim=2)
        q, k, v = (t.view(batch, seq, self.heads, dim // self.heads).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True,
                                           dropout_p=self.dropout if self.training else 0.0)
        return self.proj(y.transpose(1, 2).reshape(batch, seq, dim))


class TransformerLayer(nn.Module):
    """Pre-norm layer: x + attn(ln(x)), then x + mlp(ln(x))."""

    def __init__(self, dim: int, heads: int, mlp_ratio: int = 4, dropout: float = 0.0):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, dropout)
        self.mlp = nn.Sequential(nn.Linear(dim, mlp_ratio * dim), nn.GELU(),
                                 nn.Linear(mlp_ratio * dim, dim), nn.Dropout(dropout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class Head(nn.Module):
    """Final norm + projection to the vocabulary: (batch, seq, dim) -> (batch, seq, vocab)."""

    def __init__(self, dim: int, vocab: int):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.out = nn.Linear(dim, vocab, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.out(self.ln(x))


def _init_weights(module: nn.Module, layers: int) -> None:
    # GPT-2's initialisation: N(0, 0.02), residual projections scaled by 1/sqrt(2 x layers).
    for name, param in module.named_parameters():
        if param.dim() < 2:
            continue
        std = 0.02 / math.sqrt(2 * layers) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
        nn.init.normal_(param, mean=0.0, std=std)


def gpt(vocab_size: int, *, seq_len: int, **options) -> nn.Sequential:
    """The flat block list for `vocab_size` token values (256: bytes) and sequences of up to
    `seq_len`; `options` are `GptOptions` (names and defaults in models/catalog.py)."""
    o = GptOptions(**options)
    if o.dim % o.heads:
        raise ValueError(f"gpt: dim {o.dim} is not divisible by heads {o.heads}")
    blocks = nn.Sequential(Embedding(vocab_size, o.dim, seq_len, o.dropout),
                           *(TransformerLayer(o.dim, o.heads, o.mlp_ratio, o.dropout)
                             for _ in range(o.layers)),
                           Head(o.dim, vocab_size))
    _init_weights(blocks, o.layers)
    return blocks


def shard_units(blocks: nn.Sequential) -> list[nn.Module]:
    """fsdp's units: every block of the list (embedding, each layer, head)."""
    return list(blocks)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over every position: (B, S, V) logits, (B, S) targets."""
    return F.cross_entropy(logits.float().flatten(0, 1), targets.flatten())

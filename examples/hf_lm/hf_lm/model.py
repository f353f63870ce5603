"""A small GPT-2 of Hugging Face transformers, built from a config in code: nothing is
downloaded, and its vocabulary is the 256 byte values, so no tokenizer is needed either.

`blocks(model)` is the model as pipeline stages cut it (model.blocks in a spec): the embeddings,
each transformer block, then the final norm and the LM head, every one a module that maps one
tensor to one tensor. They share the model's own modules, so what the stages train is this model.
"""

from __future__ import annotations

import torch
from torch import nn
from transformers import GPT2Config, GPT2LMHeadModel

BYTES = 256


def byte_gpt2(layers: int = 2, width: int = 64, heads: int = 2, context: int = 64,
              dropout: float = 0.0) -> GPT2LMHeadModel:
    """GPT-2 of `layers` blocks of `width` channels over byte tokens, for sequences of up to
    `context` tokens."""
    config = GPT2Config(
        vocab_size=BYTES, n_positions=context, n_embd=width, n_layer=layers, n_head=heads,
        resid_pdrop=dropout, embd_pdrop=dropout, attn_pdrop=dropout,
        bos_token_id=None, eos_token_id=None,     # GPT-2's 50256 is outside a byte vocabulary
        # Untied: in pipeline stages the embedding and the head live on different ranks, and a
        # weight shared between them would be trained apart.
        tie_word_embeddings=False,
        # SDPA attends causally when given no mask, which is what a block alone is given.
        attn_implementation="sdpa")
    return GPT2LMHeadModel(config)


class Embeddings(nn.Module):
    """Token ids (batch, sequence) -> hidden states: token plus position embeddings."""

    def __init__(self, transformer):
        super().__init__()
        self.wte, self.wpe, self.drop = transformer.wte, transformer.wpe, transformer.drop

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        return self.drop(self.wte(ids) + self.wpe(positions))


class Layer(nn.Module):
    """One GPT2Block as a function of the hidden states alone."""

    def __init__(self, block):
        super().__init__()
        self.block = block

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        out = self.block(hidden)
        return out[0] if isinstance(out, tuple) else out    # older transformers return a tuple


class Head(nn.Module):
    """Hidden states -> logits (batch, sequence, 256): the final norm and the LM head."""

    def __init__(self, model):
        super().__init__()
        self.ln_f, self.lm_head = model.transformer.ln_f, model.lm_head

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.lm_head(self.ln_f(hidden))


def blocks(model: GPT2LMHeadModel) -> list[nn.Module]:
    """The model's blocks in order: their composition is `model(ids).logits`."""
    if model.config._attn_implementation != "sdpa":
        # Eager attention given no mask attends to later tokens too.
        raise ValueError(f"blocks() needs attn_implementation='sdpa', the model has "
                         f"{model.config._attn_implementation!r}")
    return [Embeddings(model.transformer), *(Layer(b) for b in model.transformer.h), Head(model)]

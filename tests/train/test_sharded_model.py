"""Evaluation in step under a sharded model (train/sharded_model.py): a rank out of validation
batches forwards again while another rank has one, and a rank that had none forwards a blank
input shaped and typed as its first training input, whatever the model takes (token ids of a
language model here, not an image)."""

from __future__ import annotations

import contextlib

import torch
from torch import nn

from hpc_train.train.sharded_model import BlankInput, evaluate_in_step
from hpc_train.train.task import CausalLm


class Recorder(nn.Module):
    """A tiny causal LM that records what it was given."""

    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(256, 256)
        self.seen: list[torch.Tensor] = []

    def forward(self, ids):
        self.seen.append(ids)
        return self.embed(ids)


def others_have(batches: int):
    """allreduce_sum of a world where another rank has `batches` batches: the sum of 'have one'."""
    left = iter(range(batches, -1, -1))

    def allreduce_sum(mine: torch.Tensor) -> torch.Tensor:
        return mine + (1.0 if next(left) > 0 else 0.0)
    return allreduce_sum


def run(batches, other_rank_batches: int, blank: BlankInput):
    model = Recorder()
    totals = evaluate_in_step(model, CausalLm(), batches, blank, contextlib.nullcontext,
                              lambda: None, others_have(other_rank_batches))
    return model, totals


def test_a_rank_without_validation_batches_forwards_its_first_training_inputs_shape():
    blank = BlankInput()
    blank.see(torch.randint(256, (8, 12)))
    blank.see(torch.randn(2, 3, 32, 32))           # only the first one counts
    model, totals = run([], 2, blank)
    assert len(model.seen) == 2                    # in step with the other rank's two batches
    for ids in model.seen:
        assert ids.shape == (1, 12) and ids.dtype == torch.int64 and not ids.any()
    assert totals.tolist() == [0.0, 0.0, 0.0]      # nothing counted


def test_a_rank_out_of_batches_forwards_its_last_one_uncounted():
    blank = BlankInput()
    batch = (torch.randint(256, (4, 6)), torch.randint(256, (4, 6)))
    model, totals = run([batch], 3, blank)
    assert len(model.seen) == 3 and all(ids is batch[0] for ids in model.seen)
    assert totals[2].item() == 24                  # one batch of 4 x 6 tokens counted


def test_the_blank_keeps_nested_inputs_and_says_when_it_has_none():
    blank = BlankInput()
    try:
        blank()
    except RuntimeError as exc:
        assert "no training input seen yet" in str(exc)
    else:
        raise AssertionError("a blank before any input must fail")
    blank.see({"ids": torch.ones(5, 7, dtype=torch.long), "mask": (torch.ones(5, 7), 3)})
    got = blank()
    assert got["ids"].shape == (1, 7) and got["ids"].dtype == torch.long and not got["ids"].any()
    assert got["mask"][0].shape == (1, 7) and got["mask"][1] == 3

"""A model as the pipeline cuts it (models/blocks.py): model.blocks, or an nn.Sequential's
children; every parameter in exactly one block; a stage's state (block-index names) loads into
the user's model under its own names. And the Hugging Face example's blocks compose to its
forward (examples/hf_lm)."""

from __future__ import annotations

import sys
import textwrap

import pytest
import torch
from torch import nn

from hpc_train.models.blocks import block_list, cover_problem, describe
from hpc_train.usercode import UserCodeError
from tests.conftest import REPO, require

USER = """
    from torch import nn

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.embed = nn.Embedding(16, 8)
            self.layers = nn.ModuleList([nn.Linear(8, 8), nn.Linear(8, 8)])
            self.head = nn.Linear(8, 16)

        def forward(self, ids):
            x = self.embed(ids)
            for layer in self.layers:
                x = layer(x)
            return self.head(x)

    def net():
        return Net()

    def blocks(model):
        return [model.embed, *model.layers, model.head]

    def tied(model):
        model.head.weight = model.embed.weight    # 16 x 8 both: a tied weight on two blocks
        return [model.embed, *model.layers, model.head]

    def partial(model):
        return [model.embed, model.layers[0]]

    def foreign(model):
        return [model.embed, *model.layers, model.head, nn.Linear(2, 2)]

    def not_modules(model):
        return [model.embed, lambda x: x]

    def nothing(model):
        return 3
    """


@pytest.fixture
def ublocks(tmp_path, monkeypatch):
    (tmp_path / "ublocks.py").write_text(textwrap.dedent(USER))
    monkeypatch.syspath_prepend(str(tmp_path))
    sys.modules.pop("ublocks", None)
    import ublocks

    yield ublocks
    sys.modules.pop("ublocks", None)


def test_the_blocks_a_reference_returns_share_the_models_modules(ublocks):
    model = ublocks.net()
    blocks = block_list("ublocks:net", model, "ublocks:blocks")
    assert describe(blocks) == "4 blocks: Embedding, Linear x3"
    ids = torch.randint(16, (2, 5))
    assert torch.equal(blocks(ids), model(ids))            # their composition is the forward
    # A stage's state under block-index names loads into the user's model, under its own names.
    trained = {name: torch.randn_like(t) for name, t in blocks.state_dict().items()}
    assert sorted(trained) == ["0.weight", "1.bias", "1.weight", "2.bias", "2.weight",
                               "3.bias", "3.weight"]
    fresh = ublocks.net()
    block_list("ublocks:net", fresh, "ublocks:blocks").load_state_dict(trained)
    assert torch.equal(fresh.state_dict()["layers.1.weight"], trained["2.weight"])
    assert torch.equal(fresh.state_dict()["head.bias"], trained["3.bias"])


def test_a_sequential_model_is_its_own_block_list():
    model = nn.Sequential(nn.Embedding(4, 2), nn.Linear(2, 4))
    blocks = block_list("lab.nets:seq", model, None)
    assert list(blocks) == list(model)


@pytest.mark.parametrize("reference, words", [
    (None, "ublocks:net built Net, which is not an nn.Sequential, and model.blocks is not set"),
    ("ublocks:tied", "parameter embed.weight is in blocks 0 and 3"),
    ("ublocks:partial", "4 parameter(s) of the model are in no block (layers.1.weight, "
                        "layers.1.bias, head.weight and 1 more)"),
    ("ublocks:foreign", "the blocks hold 2 parameter(s) that are not the model's"),
    ("ublocks:not_modules", "returned function as block 1, not a torch.nn.Module"),
    ("ublocks:nothing", "returned int, not a list of modules"),
])
def test_blocks_that_do_not_cut_the_model_are_one_line_naming_the_reference(ublocks, reference, words):
    with pytest.raises(UserCodeError) as caught:
        block_list("ublocks:net", ublocks.net(), reference)
    message = str(caught.value)
    assert words in message and "Fix: " in message and "\n" not in message, message


def test_cover_is_fine_with_a_weight_shared_inside_one_block():
    shared = nn.Linear(3, 3)
    block = nn.Sequential(shared, shared)
    assert cover_problem(nn.Sequential(block), [block]) is None


def test_the_hf_examples_blocks_compose_to_its_forward(monkeypatch):
    require("transformers")
    monkeypatch.syspath_prepend(str(REPO / "examples/hf_lm"))
    from hf_lm.model import blocks, byte_gpt2

    torch.manual_seed(0)
    model = byte_gpt2(layers=2, width=32, heads=2, context=16).eval()
    cut = block_list("hf_lm.model:byte_gpt2", model, "hf_lm.model:blocks")
    assert describe(cut) == "4 blocks: Embeddings, Layer x2, Head"
    ids = torch.randint(256, (3, 16))
    with torch.no_grad():
        assert torch.allclose(cut(ids), model(ids).logits, atol=1e-5)
        # Causal: the logits of a position do not depend on later tokens.
        changed = ids.clone()
        changed[:, 8:] = (changed[:, 8:] + 1) % 256
        assert torch.allclose(cut(changed)[:, :8], cut(ids)[:, :8], atol=1e-5)
    eager = byte_gpt2(layers=1, width=32, heads=2, context=16)
    eager.config._attn_implementation = "eager"
    with pytest.raises(ValueError, match="needs attn_implementation='sdpa'"):
        blocks(eager)

"""A model as the pipeline cuts it: an ordered list of blocks whose composition is its forward.

The gpt model is such a list already (an `nn.Sequential`). A user's model says where its blocks
are with `model.blocks` (`package.module:callable`, called as `blocks(model)`), or is itself an
`nn.Sequential`, whose children are the blocks. The first block takes the token ids, every
block takes one tensor and returns one tensor, the last returns the logits: any cut between two
blocks is then a valid stage boundary.

The list is an `nn.Sequential` over the model's own modules (shared, not copied): a block's
parameters are named by its index (`2.block.attn.c_attn.weight`), as the stages save them, and a
state dict of those names loaded into the list lands in the user's model, under its own names.
"""

from __future__ import annotations

from typing import Any

from torch import nn

from hpc_train.usercode import UserCodeError, call


def block_list(name: str, model: nn.Module, blocks: str | None) -> nn.Sequential:
    """The blocks of `model` (built from model.name `name`) in order: `blocks(model)` where
    model.blocks names a function, else the children of an `nn.Sequential` model. UserCodeError
    in one line when there are none, when one is not a module, or when the blocks share a
    parameter or leave one out (it would be on no stage, or on two that train it apart)."""
    if blocks is not None:
        found = call(blocks, "the model's pipeline blocks", model)
        found = _modules(blocks, found)
    elif isinstance(model, nn.Sequential):
        found = list(model)
    else:
        raise UserCodeError(
            f"model.name {name} built {type(model).__name__}, which is not an nn.Sequential, and "
            "model.blocks is not set: pipeline stages cut a list of blocks. Fix: set model.blocks: "
            "package.module:callable returning the model's blocks in order (blocks(model) -> "
            "[the one taking token ids, ..., the one returning logits]), or "
            "parallel.pipeline.stages: 1")
    if not found:
        raise UserCodeError(f"{blocks or name} gave no blocks: the pipeline needs at least one "
                            "block per stage. Fix: return the model's blocks in order")
    problem = cover_problem(model, found)
    if problem:
        raise UserCodeError(f"{blocks or name}: {problem}")
    return nn.Sequential(*found)


def _modules(reference: str, found: Any) -> list[nn.Module]:
    """`found` as a list of modules; UserCodeError naming the first item that is not one."""
    try:
        items = list(found)
    except TypeError:
        raise UserCodeError(f"model.blocks {reference} returned {type(found).__name__}, not a list "
                            "of modules. Fix: return the blocks in order, e.g. [embed, *layers, head]") from None
    for index, item in enumerate(items):
        if not isinstance(item, nn.Module):
            raise UserCodeError(f"model.blocks {reference} returned {type(item).__name__} as block "
                                f"{index}, not a torch.nn.Module. Fix: wrap it in a module whose "
                                "forward maps one tensor to one tensor")
    return items


def cover_problem(model: nn.Module, blocks: list[nn.Module]) -> str | None:
    """What is wrong with `blocks` as a cut of `model`'s parameters, or None: each parameter of
    the model in exactly one block (a tied weight in two blocks would be trained apart on two
    stages; one in none would never be trained), and no parameter from elsewhere."""
    owner: dict[int, list[int]] = {}
    for index, block in enumerate(blocks):
        for parameter in block.parameters():
            owner.setdefault(id(parameter), []).append(index)
    names: dict[int, str] = {}
    for name, parameter in model.named_parameters(remove_duplicate=False):
        names.setdefault(id(parameter), name)     # a tied weight by its first name
    shared = [(names.get(key, "?"), found) for key, found in owner.items() if len(found) > 1]
    if shared:
        where, found = shared[0]
        return (f"parameter {where} is in blocks {found[0]} and {found[1]}: the stages would train "
                "two copies of it apart (tied weights?). Fix: untie it (e.g. tie_word_embeddings="
                "False), or keep both uses in one block")
    missing = [n for n, p in model.named_parameters() if id(p) not in owner]
    if missing:
        shown = ", ".join(missing[:3]) + (f" and {len(missing) - 3} more" if len(missing) > 3 else "")
        return (f"{len(missing)} parameter(s) of the model are in no block ({shown}): no stage "
                "would train them. Fix: return blocks that hold every parameter")
    foreign = [key for key in owner if key not in names]
    if foreign:
        return (f"the blocks hold {len(foreign)} parameter(s) that are not the model's. Fix: "
                "return modules of the model given to blocks(model), not new ones")
    return None


def describe(blocks: nn.Sequential) -> str:
    """'4 blocks: Embeddings, Layer x2, Head': the classes in order, runs counted."""
    runs: list[list] = []
    for block in blocks:
        kind = type(block).__name__
        if runs and runs[-1][0] == kind:
            runs[-1][1] += 1
        else:
            runs.append([kind, 1])
    return f"{len(blocks)} blocks: " + ", ".join(k if n == 1 else f"{k} x{n}" for k, n in runs)


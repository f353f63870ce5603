"""Model registry: `build_model(name, num_classes, options, **inputs)`.

Names, builders and options are declared once, in `catalog.py`, which the spec reads on the login
node; this module imports a builder (and with it torch) only inside `build_model`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Mapping, Sequence

from hpc_train.models.catalog import MODEL_NAMES, model as model_entry

if TYPE_CHECKING:
    from torch import nn

__all__ = ["MODEL_NAMES", "build_model", "declared_units", "shard_units"]


def build_model(name: str, num_classes: int, options: Mapping[str, Any] | None = None,
                **inputs: Any) -> "nn.Module":
    """Build a model by catalog name.

    `num_classes` (gpt: the vocabulary size) and `inputs` (gpt: `seq_len`) come from the data;
    `options` are the model's own (`model.options` of a spec), declared in the catalog, where
    the unset ones take their defaults. Unknown names or options raise ValueError listing what
    is valid.
    """
    entry = model_entry(name)
    options = dict(options or {})
    if entry.own:
        return _own_model(name, options)
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    unknown = sorted(set(options) - set(entry.option_names))
    if unknown:
        raise ValueError(f"model {name!r} does not accept option(s) {unknown}; "
                         f"valid options: {list(entry.option_names)}")
    return _named(entry.builder)(num_classes, **inputs, **options)


def shard_units(name: str, model: "nn.Module", classes: Sequence[str] = ()) -> "list[nn.Module]":
    """The submodules of `model` (built as model `name`) that fsdp shards one by one, before the
    root: those of the class names `classes` (parallel.fsdp.units) if given, else the entry's
    (ResNet stages, gpt blocks, a user model's fsdp_units()). Each is gathered whole for its
    forward, so the largest one bounds the memory of gathered parameters."""
    if not classes:
        return list(_named(model_entry(name).shard_units)(model))
    units = [m for m in model.modules() if type(m).__name__ in classes and m is not model]
    found = {type(m).__name__ for m in units}
    if missing := [c for c in classes if c not in found]:
        present = sorted({type(m).__name__ for m in model.modules()})
        raise ValueError(f"parallel.fsdp.units: no submodule of class {', '.join(missing)} in "
                         f"{name}; its classes: {', '.join(present)}")
    # A unit inside another unit is sharded first, as fully_shard needs (modules() is outer first).
    return units[::-1]


def _own_model(name: str, options: dict[str, Any]) -> "nn.Module":
    """The user's model: their callable with model.options as keyword arguments."""
    from torch import nn

    from hpc_train.usercode import UserCodeError, call

    model = call(name, "a model", **options)
    if not isinstance(model, nn.Module):
        raise UserCodeError(f"model.name {name} returned {type(model).__name__}, not a "
                            "torch.nn.Module; return the model itself")
    return model


def declared_units(model: "nn.Module") -> "list[nn.Module]":
    """FSDP's units of a user's model: what its `fsdp_units()` method returns (a list of
    submodules, e.g. its blocks), like the catalog's `shard_units`; none (the model is sharded
    as one unit) when it has no such method."""
    units = getattr(model, "fsdp_units", None)
    return list(units()) if callable(units) else []


def _named(target: str):
    """The function a catalog "module:function" string names, imported now."""
    module_name, function = target.split(":")
    return getattr(importlib.import_module(module_name), function)

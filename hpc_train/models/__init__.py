"""Model registry: `build_model(name, num_classes, options, **inputs)`.

Names, builders and options are declared once, in `catalog.py`, which the spec reads on the login
node; this module imports a builder (and with it torch) only inside `build_model`.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Mapping

from hpc_train.models.catalog import MODEL_NAMES, model

if TYPE_CHECKING:
    from torch import nn

__all__ = ["MODEL_NAMES", "build_model"]


def build_model(name: str, num_classes: int, options: Mapping[str, Any] | None = None,
                **inputs: Any) -> "nn.Module":
    """Build a model by catalog name.

    `num_classes` (gpt: the vocabulary size) and `inputs` (gpt: `seq_len`) come from the data;
    `options` are the model's own (`model.options` of a spec), declared in the catalog, where
    the unset ones take their defaults. Unknown names or options raise ValueError listing what
    is valid.
    """
    entry = model(name)
    options = dict(options or {})
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    unknown = sorted(set(options) - set(entry.option_names))
    if unknown:
        raise ValueError(f"model {name!r} does not accept option(s) {unknown}; "
                         f"valid options: {list(entry.option_names)}")
    module_name, function = entry.builder.split(":")
    builder = getattr(importlib.import_module(module_name), function)
    return builder(num_classes, **inputs, **options)

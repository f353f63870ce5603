"""Model registry: `build_model(name, num_classes, **options)`.

Names are the keys of one dict, so the valid list in errors and `MODEL_NAMES` cannot drift.
The config layer may import `MODEL_NAMES` on the login node; this module imports torch
lazily (inside `build_model`) so that stays cheap.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from torch import nn

# name -> (module, factory). Strings, not objects, so importing this package needs no torch.
_REGISTRY: dict[str, tuple[str, str]] = {
    "resnet18": ("hpc_train.models.resnet", "resnet18"),
    "resnet34": ("hpc_train.models.resnet", "resnet34"),
    "resnet50": ("hpc_train.models.resnet", "resnet50"),
    "resnet101": ("hpc_train.models.resnet", "resnet101"),
    "resnet152": ("hpc_train.models.resnet", "resnet152"),
    "resnet_tiny": ("hpc_train.models.resnet", "resnet_tiny"),
    "gpt": ("hpc_train.models.gpt", "gpt"),   # num_classes = vocabulary size
}

MODEL_NAMES: tuple[str, ...] = tuple(_REGISTRY)

__all__ = ["MODEL_NAMES", "build_model"]


def build_model(name: str, num_classes: int, **options: Any) -> "nn.Module":
    """Build a model by registry name.

    `options` go to the factory (e.g. `zero_init_residual=True`; for resnet_tiny also
    `width`, `layers`). Unknown names or options raise ValueError listing what is valid.
    """
    if name not in _REGISTRY:
        import difflib
        close = difflib.get_close_matches(name, MODEL_NAMES, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"unknown model {name!r}; valid names: {', '.join(MODEL_NAMES)}.{hint}")
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
        raise ValueError(f"num_classes must be a positive integer, got {num_classes!r}")
    module_name, factory_name = _REGISTRY[name]
    factory = getattr(importlib.import_module(module_name), factory_name)
    import inspect
    valid = [p for p in inspect.signature(factory).parameters if p != "num_classes"]
    unknown = sorted(set(options) - set(valid))
    if unknown:
        raise ValueError(f"model {name!r} does not accept option(s) {unknown}; "
                         f"valid options: {valid}")
    return factory(num_classes=num_classes, **options)

"""The model catalog: every model's name, builder and options, readable without torch.

One source for each: the spec takes its valid `model.name`s from `MODELS` and checks
`model.options` against the model's options dataclass on the login node (unknown names, types,
limits: exit 2 before anything is queued); the builders take their option defaults from the same
dataclass on the ranks. Builders are named by strings and imported only when a model is built
(`hpc_train.models.build_model`), so reading this module costs no torch.

What a builder takes from the data section (classes or vocabulary, gpt's sequence length) is not
an option: the spec keeps it in `data`, so model and data cannot disagree.
"""

from __future__ import annotations

import difflib
from dataclasses import MISSING, dataclass, field, fields
from typing import Any, Callable


def option(default: Any = MISSING, *, doc: str, factory: Callable[[], Any] | None = None,
           **limits: Any) -> Any:
    """An options field. Its metadata holds what the spec loader checks, named as for a spec
    field (`spec.schema.spec_field`): `doc`, limits `ge`/`gt`/`le`/`lt`, `check`."""
    meta = {"doc": doc, **limits}
    if factory is not None:
        return field(default_factory=factory, metadata=meta)
    return field(default=default, metadata=meta)


def _four_stages(layers: list[int]):
    """`check` rule (None or (rule, fix)) for a ResNet's blocks per stage."""
    if len(layers) == 4 and min(layers) >= 1:
        return None
    return ("a ResNet has four stages of at least one block each",
            "give four counts, e.g. model.options.layers: [1, 1, 1, 1]")


@dataclass(frozen=True)
class ResNetOptions:
    """torchvision's ResNets (same module names, so their weights load)."""

    zero_init_residual: bool = option(
        False, doc="start every residual branch at zero, each block as the identity "
        "(Goyal et al. 2017, sec. 5.1; helps large batches)")


@dataclass(frozen=True)
class TinyResNetOptions(ResNetOptions):
    """A narrow BasicBlock ResNet with a CIFAR stem, for tests and smoke runs."""

    width: int = option(16, doc="channels of the first stage, doubled at each later stage", ge=1)
    layers: list[int] = option(doc="BasicBlocks in each of the four stages",
                               factory=lambda: [1, 1, 1, 1], check=_four_stages)


@dataclass(frozen=True)
class GptOptions:
    """The gpt block list [embedding, layer x `layers`, head]; its vocabulary and sequence
    length are data.vocab_size and data.seq_len."""

    layers: int = option(4, doc="Transformer layers; the block list has layers + 2 blocks", ge=1)
    dim: int = option(128, doc="model width (channels per token)", ge=1)
    heads: int = option(4, doc="attention heads; they split dim, so they must divide it", ge=1)
    mlp_ratio: int = option(4, doc="hidden width of each layer's MLP, in multiples of dim", ge=1)
    dropout: float = option(0.0, doc="dropout probability in training", ge=0, lt=1)


@dataclass(frozen=True)
class Model:
    builder: str    # "module:function": called as function(num_classes, **inputs, **options)
    # The options dataclass: names, types, defaults and limits. None: the user's own model
    # (model.name a reference), called as builder(**options) with what the spec gives.
    options: type | None
    block_list: bool = False   # built as a block list: trains on the pipeline, one stage or more
    shard_units: str = ""      # "module:function": function(model) -> the submodules fsdp shards

    @property
    def own(self) -> bool:
        """The user's model, not one of the catalog's."""
        return self.options is None

    @property
    def option_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in fields(self.options)) if self.options else ()


_RESNET_UNITS = "hpc_train.models.resnet:shard_units"


def _torchvision(name: str) -> Model:
    return Model(f"hpc_train.models.resnet:{name}", ResNetOptions, shard_units=_RESNET_UNITS)


MODELS: dict[str, Model] = {
    **{name: _torchvision(name) for name in ("resnet18", "resnet34", "resnet50", "resnet101",
                                             "resnet152")},
    "resnet_tiny": Model("hpc_train.models.resnet:resnet_tiny", TinyResNetOptions,
                         shard_units=_RESNET_UNITS),
    "gpt": Model("hpc_train.models.gpt:gpt", GptOptions, block_list=True,   # num_classes: vocabulary
                 shard_units="hpc_train.models.gpt:shard_units"),
}

MODEL_NAMES: tuple[str, ...] = tuple(MODELS)


# FSDP's units of a user's model: those it declares (hpc_train.models.declared_units).
_DECLARED_UNITS = "hpc_train.models:declared_units"


def model(name: str) -> Model:
    """The catalog entry of `name`, or the entry of the user's model a `module:callable`
    reference names; ValueError naming the valid names (and a close one) otherwise."""
    if name in MODELS:
        return MODELS[name]
    if isinstance(name, str) and ":" in name:
        return Model(name, None, shard_units=_DECLARED_UNITS)
    close = difflib.get_close_matches(str(name), MODEL_NAMES, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    raise ValueError(f"unknown model {name!r}; valid names: {', '.join(MODEL_NAMES)}.{hint}")


def options_of(name: Any) -> type | None:
    """The options dataclass of model `name`, or None for a name that is not in the catalog."""
    entry = MODELS.get(name) if isinstance(name, str) else None
    return entry.options if entry else None

"""DeepSpeed's config for a job spec (pure), and its check against DeepSpeed's own config model.

The spec owns what our loop decides (batch, accumulation, clipping, precision, optimizer, the
ZeRO keys of parallel.deepspeed); `parallel.deepspeed.config` passes the rest through. The
engine is driven by our loop: it is given our optimizer (hence `zero_allow_untested_optimizer`),
our learning rate every step (no DeepSpeed scheduler) and our autocast (no DeepSpeed bf16/fp16).

`engine_config` imports nothing heavy, so the login node can build and show it;
`deepspeed_problems` imports DeepSpeed inside the function, only when it is installed.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
from typing import Any

# Keys of DeepSpeed's config that the spec sets, and the spec key that sets each.
OWNED = {
    "train_micro_batch_size_per_gpu": "data.batch_size",
    "train_batch_size": "data.batch_size (x ranks x parallel.accumulation)",
    "gradient_accumulation_steps": "parallel.accumulation",
    "gradient_clipping": "optim.grad_clip",
    "optimizer": "optim.name",
    "scheduler": "optim.schedule",
    "fp16": "precision.mode",
    "bf16": "precision.mode",
    "bfloat16": "precision.mode",
    "torch_autocast": "precision.mode",
    "zero_allow_untested_optimizer": "optim.name (our optimizer is always given to the engine)",
}
OWNED_ZERO = {"stage": "parallel.deepspeed.stage", "offload_optimizer":
              "parallel.deepspeed.offload_optimizer", "offload_param": "parallel.deepspeed.offload_params",
              "overlap_comm": "parallel.deepspeed.overlap_comm"}
CONFIG_KEY = "parallel.deepspeed.config"
INSTALL_FIX = ("install the extra: bash env/setup.sh (installs it unless --no-deepspeed), or pip "
               "install -e '.[deepspeed]' after torch; or set parallel.backend: ddp")


def installed() -> bool:
    """Whether DeepSpeed can be imported here (found without importing it)."""
    return importlib.util.find_spec("deepspeed") is not None


def owned_keys(passed: dict[str, Any]) -> list[tuple[str, str]]:
    """(dotted key under parallel.deepspeed.config, the spec key that owns it) of `passed`."""
    found = [(key, OWNED[key]) for key in passed if key in OWNED]
    zero = passed.get("zero_optimization")
    if isinstance(zero, dict):
        found += [(f"zero_optimization.{key}", OWNED_ZERO[key]) for key in zero if key in OWNED_ZERO]
    return found


def engine_config(spec) -> dict[str, Any]:
    """The whole config `deepspeed.initialize` is given for `spec` (passed-through keys first,
    then the spec's: the spec wins where both set one, which validate refuses)."""
    ds = spec.parallel.deepspeed
    config = copy.deepcopy(dict(ds.config))
    zero = dict(config.get("zero_optimization") or {})
    zero.update(stage=ds.stage, overlap_comm=ds.overlap_comm)
    if ds.offload_optimizer != "none":
        zero["offload_optimizer"] = {"device": ds.offload_optimizer}
    if ds.offload_params != "none":
        zero["offload_param"] = {"device": ds.offload_params}
    config.update(
        zero_optimization=zero, zero_allow_untested_optimizer=True,
        train_micro_batch_size_per_gpu=spec.data.batch_size,
        gradient_accumulation_steps=spec.parallel.accumulation,
        gradient_clipping=float(spec.optim.grad_clip or 0.0))
    config.setdefault("steps_per_print", 2 ** 31 - 1)   # our loop logs; DeepSpeed's would repeat it
    return config


def deepspeed_problems(config: dict[str, Any]) -> list[tuple[str, Any, str]]:
    """(dotted key, value, what DeepSpeed says) for each key of `config` that DeepSpeed's own
    config model refuses or does not know; [] when it accepts them all."""
    previous = logging.root.manager.disable
    logging.disable(logging.WARNING)    # DeepSpeed's import logs its accelerator choice to stdout
    try:
        return _refused(config)
    finally:
        logging.disable(previous)


def _refused(config: dict[str, Any]) -> list[tuple[str, Any, str]]:
    from pydantic import ValidationError
    from deepspeed.runtime.config import DeepSpeedConfig, DeepSpeedConfigError

    reader = _KeyRecorder(config)
    try:
        DeepSpeedConfig(reader)
    except ValidationError as exc:
        return [(".".join(str(part) for part in _section_of(exc, config) + list(error["loc"])),
                 error.get("input"), error["msg"]) for error in exc.errors()]
    except (DeepSpeedConfigError, ValueError, AssertionError, KeyError, TypeError) as exc:
        return [("", None, f"{type(exc).__name__}: {exc}")]
    known = reader.seen | _declared_top_level_keys()
    return [(key, config[key], "DeepSpeed's config has no such key")
            for key in config if key not in known]


class _KeyRecorder(dict):
    """A config that records the top-level keys DeepSpeed's config reader asks for: DeepSpeed
    ignores a top-level key it does not know, so what it asked for is what it knows."""

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)
        self.seen: set[str] = set()    # shared by the copy.copy the reader makes

    def get(self, key, *default):
        self.seen.add(key)
        return super().get(key, *default)

    def __getitem__(self, key):
        self.seen.add(key)
        return super().__getitem__(key)

    def __contains__(self, key):
        self.seen.add(key)
        return super().__contains__(key)


def _section_of(exc, config: dict[str, Any]) -> list[str]:
    """The top-level section a pydantic model's error is in: its title names the model, the
    config has one section per model (zero_optimization for DeepSpeedZeroConfig, ...)."""
    title = getattr(exc, "title", "")
    sections = {"DeepSpeedZeroConfig": "zero_optimization"}
    section = sections.get(title)
    return [section] if section and section in config else []


def _declared_top_level_keys() -> set[str]:
    """Top-level names DeepSpeed declares as constants (sections it reads with `keys()`, which
    the recorder cannot see: optimizer, scheduler, flops_profiler, ...)."""
    import deepspeed.runtime.constants as constants
    from deepspeed.profiling import constants as profiling

    return {value for module in (constants, profiling) for name, value in vars(module).items()
            if name.isupper() and isinstance(value, str) and value.islower() and "_" in value or
            name in ("OPTIMIZER", "SCHEDULER", "FLOPS_PROFILER", "AUTOTUNING")}

"""Cross-field rules of `parallel.backend: deepspeed`: the package, what it runs with, its config.

DeepSpeed is an optional extra: without it a deepspeed spec is refused here, on the login node,
in one line that says how to install it. With it, the config the ranks will be given
(parallel/deepspeed_config.engine_config) is checked against DeepSpeed's own config model, so a
key DeepSpeed does not know fails at `validate`, not minutes into the job.
"""

from __future__ import annotations

from collections.abc import Iterator

from hpc_train.parallel import deepspeed_config
from hpc_train.spec.problems import Problem, show
from hpc_train.spec.schema import JobSpec


def _uses_deepspeed(spec: JobSpec) -> bool:
    return spec.parallel.backend == "deepspeed"


def deepspeed_installed(spec: JobSpec) -> Iterator[Problem]:
    if _uses_deepspeed(spec) and not deepspeed_config.installed():
        yield Problem("parallel.backend", "'deepspeed'", "DeepSpeed is not installed in this "
                      "environment (an optional extra)", deepspeed_config.INSTALL_FIX)


def deepspeed_precision(spec: JobSpec) -> Iterator[Problem]:
    """fp16 needs a loss scaler inside the engine: DeepSpeed's CPU accelerator has none, and on
    GPUs our loop does not drive DeepSpeed's yet."""
    if _uses_deepspeed(spec) and spec.precision.mode == "fp16":
        where = "on CPUs DeepSpeed supports bf16, not fp16" if not spec.uses_gpu else \
            "DeepSpeed's fp16 loss scaler is not driven by our loop"
        yield Problem("precision.mode", "'fp16' with parallel.backend 'deepspeed'", where,
                      "set precision.mode: bf16 (or fp32)")


def deepspeed_without_pipeline(spec: JobSpec) -> Iterator[Problem]:
    if _uses_deepspeed(spec) and spec.uses_pipeline:
        yield Problem("parallel.pipeline.stages", f"{spec.parallel.pipeline.stages} with "
                      "parallel.backend 'deepspeed'", "ZeRO shards the whole model over the "
                      "ranks; it does not run our pipeline stages",
                      "set parallel.pipeline.stages: 1, or parallel.backend: ddp")


def params_offload_needs_stage_3(spec: JobSpec) -> Iterator[Problem]:
    ds = spec.parallel.deepspeed
    if _uses_deepspeed(spec) and ds.offload_params != "none" and ds.stage != 3:
        yield Problem("parallel.deepspeed.offload_params", f"{ds.offload_params!r} with "
                      f"parallel.deepspeed.stage {ds.stage}", "only ZeRO-3 partitions the "
                      "parameters, so only it can offload them",
                      "set parallel.deepspeed.stage: 3, or offload_params: none")


def deepspeed_keys_owned(spec: JobSpec) -> Iterator[Problem]:
    """A passed-through key that the spec sets: two places for one number would disagree."""
    if not _uses_deepspeed(spec):
        return
    passed = spec.parallel.deepspeed.config
    for key, owner in deepspeed_config.owned_keys(passed):
        value = passed
        for part in key.split("."):
            value = value[part]
        yield Problem(f"{deepspeed_config.CONFIG_KEY}.{key}", show(value),
                      f"the spec sets it ({owner})", f"remove it and set {owner.split(' ')[0]}")


def deepspeed_config_known(spec: JobSpec) -> Iterator[Problem]:
    """The generated config, checked by DeepSpeed's own config model (when installed)."""
    if not _uses_deepspeed(spec) or not deepspeed_config.installed():
        return
    if list(deepspeed_config.owned_keys(spec.parallel.deepspeed.config)):
        return      # reported by deepspeed_keys_owned; the generated config overrides them
    for key, value, message in deepspeed_config.deepspeed_problems(deepspeed_config.engine_config(spec)):
        yield Problem(f"{deepspeed_config.CONFIG_KEY}.{key}" if key else deepspeed_config.CONFIG_KEY,
                      show(value) if key else None, f"DeepSpeed refuses it: {message.strip()}",
                      "remove it or correct it (DeepSpeed's config reference: "
                      "https://www.deepspeed.ai/docs/config-json/)")


DEEPSPEED_ERROR_RULES = (deepspeed_installed, deepspeed_precision, deepspeed_without_pipeline,
                         params_offload_needs_stage_3, deepspeed_keys_owned, deepspeed_config_known)

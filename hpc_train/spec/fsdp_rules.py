"""Cross-field rules of `parallel.backend: fsdp`: the combinations FSDP2 here does not run.

Each is refused at submit time in one line naming the key, the value, the rule and the fix:
otherwise the job would fail on its ranks after the queue wait, or silently do something else.
"""

from __future__ import annotations

from collections.abc import Iterator

from hpc_train.models.catalog import model as model_entry
from hpc_train.spec.problems import Problem
from hpc_train.spec.schema import JobSpec


def _fsdp(spec: JobSpec) -> bool:
    return spec.parallel.backend == "fsdp"


def fsdp_without_pipeline(spec: JobSpec) -> Iterator[Problem]:
    stages = spec.parallel.pipeline.stages
    if _fsdp(spec) and stages > 1:
        yield Problem("parallel.pipeline.stages", f"{stages} with parallel.backend 'fsdp'",
                      "fsdp shards whole models over all ranks; stages x sharded replicas is "
                      "not built", "set parallel.pipeline.stages: 1, or parallel.backend: ddp "
                      "for a pipeline")


def fp16_shards_need_scaling(spec: JobSpec) -> Iterator[Problem]:
    """fp16 gradients underflow without the loss scaler that only precision.mode fp16 runs."""
    settings = spec.parallel.fsdp
    if not _fsdp(spec) or spec.precision.mode == "fp16":
        return
    for name in ("param_dtype", "reduce_dtype"):
        if getattr(settings, name) == "fp16":
            yield Problem(f"parallel.fsdp.{name}", f"'fp16' with precision.mode "
                          f"{spec.precision.mode!r}", "fp16 gradients need the loss scaler of "
                          "precision.mode fp16", f"set precision.mode: fp16, or "
                          f"parallel.fsdp.{name}: bf16")


def half_parameters_without_batch_norm(spec: JobSpec) -> Iterator[Problem]:
    """BatchNorm's running statistics are fp32 buffers, which FSDP does not cast: a half-precision
    weight meets them in batch_norm and the first forward fails."""
    dtype = spec.parallel.fsdp.param_dtype
    entry = model_entry(spec.model.name)
    # The user's own model: whether it has BatchNorm is not known here (nor imported to find out).
    if _fsdp(spec) and dtype not in (None, "fp32") and not entry.block_list and not entry.own:
        yield Problem("parallel.fsdp.param_dtype", f"{dtype!r} with model.name "
                      f"{spec.model.name!r}", "the model's BatchNorm keeps fp32 running "
                      "statistics, which half-precision weights cannot meet",
                      "remove parallel.fsdp.param_dtype (precision.mode's autocast computes in "
                      "half precision), or set it for gpt only")


def offload_on_cpu(spec: JobSpec) -> Iterator[Problem]:
    if _fsdp(spec) and spec.parallel.fsdp.cpu_offload and not spec.uses_gpu:
        yield Problem("parallel.fsdp.cpu_offload", "true on a CPU job",
                      "the state of a CPU job is in host memory already; it is ignored",
                      "remove it on CPU jobs")


FSDP_ERROR_RULES = (fsdp_without_pipeline, fp16_shards_need_scaling,
                    half_parameters_without_batch_norm)
FSDP_WARNING_RULES = (offload_on_cpu,)

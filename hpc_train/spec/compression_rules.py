"""Which backend compresses gradients how (parallel.compression): the one table, and its rule.

Horovod casts to fp16 in its DistributedOptimizer; DDP runs torch's communication hooks (fp16,
bf16, PowerSGD: parallel/ddp_hooks.py); fsdp reduces in parallel.fsdp.reduce_dtype, DeepSpeed
in the gradients' own dtype, and a pipeline averages its stages' gradients with its own
uncompressed all-reduce.
"""

from __future__ import annotations

from collections.abc import Iterator

from hpc_train.parallel.layout import Parallelism
from hpc_train.spec.problems import Problem
from hpc_train.spec.schema import JobSpec

COMPRESSIONS: dict[str, tuple[str, ...]] = {"horovod": ("none", "fp16"),
                                            "ddp": ("none", "fp16", "bf16", "powersgd")}
# Where a backend without compression reduces in fewer bytes instead, if it can.
INSTEAD = {"fsdp": " (parallel.fsdp.reduce_dtype: bf16 halves the bytes)"}


def compressions_of(spec: JobSpec) -> tuple[str, ...]:
    """The parallel.compression values this spec's backend and layout run."""
    if spec.parallelism is Parallelism.PIPELINE:
        return ("none",)
    return COMPRESSIONS.get(spec.parallel.backend, ("none",))


def compression_the_backend_runs(spec: JobSpec) -> Iterator[Problem]:
    compression, allowed = spec.parallel.compression, compressions_of(spec)
    if compression in allowed:
        return
    where = ("a pipeline" if spec.parallelism is Parallelism.PIPELINE
             else f"parallel.backend {spec.parallel.backend!r}")
    others = [b for b, kinds in COMPRESSIONS.items() if compression in kinds]
    fix = f"set parallel.compression: {' or '.join(allowed)}" + INSTEAD.get(spec.parallel.backend, "")
    if others and spec.parallelism is not Parallelism.PIPELINE:
        fix += f", or parallel.backend: {' or '.join(others)}"
    rule = (f"{where} compresses gradients to {' or '.join(allowed[1:])} only" if len(allowed) > 1
            else f"{where} does not compress gradients")
    yield Problem("parallel.compression", f"{compression!r} with {where}", rule, fix)


COMPRESSION_ERROR_RULES = (compression_the_backend_runs,)
# parallel.powersgd set without PowerSGD: spec/rules.py's section_settings_unused.

"""parallel.backend fsdp at submit time: its settings, the combinations refused in one line, the
parts it picks, and the mixed-precision policy its settings make."""

from __future__ import annotations

import pytest
import torch

from hpc_train.parallel.fsdp import policy_dtypes
from hpc_train.parallel.layout import Parallelism
from hpc_train.spec import spec_from_dict
from hpc_train.spec.problems import SpecInvalid
from hpc_train.spec.rules import check_spec
from hpc_train.train.fsdp_parts import FsdpParts
from hpc_train.train.trainer import parts_for

GPT = {"model": {"name": "gpt"}, "data": {"kind": "text", "vocab_size": 256}}


def problems(*overrides: str, base: dict | None = None) -> tuple[list[str], list[str]]:
    try:
        spec = spec_from_dict({"run": {"name": "t"}, **(base or {})}, list(overrides))
    except SpecInvalid as exc:       # errors stop the load already
        return [str(p) for p in exc.problems], []
    errors, warnings = check_spec(spec)
    return [str(e) for e in errors], [str(w) for w in warnings]


@pytest.mark.parametrize("base", [{}, GPT])
def test_fsdp_picks_its_parts_for_images_and_tokens(base):
    spec = spec_from_dict({"run": {"name": "t"}, **base}, ["parallel.backend=fsdp"])
    assert spec.parallelism is Parallelism.FSDP and parts_for(spec.layout) is FsdpParts
    assert problems("parallel.backend=fsdp", base=base) == ([], [])


@pytest.mark.parametrize("overrides, expected", [
    (["parallel.pipeline.stages=2", "parallel.pipeline.microbatches=8", "slurm.tasks_per_node=2"],
     "parallel.pipeline.stages: 2 with parallel.backend 'fsdp' is not allowed"),
    (["parallel.compression=fp16"],
     "parallel.compression: 'fp16' with parallel.backend 'fsdp' is not allowed"),
    (["parallel.fsdp.reduce_dtype=fp16"],
     "parallel.fsdp.reduce_dtype: 'fp16' with precision.mode 'fp32' is not allowed"),
    (["precision.mode=bf16", "parallel.fsdp.param_dtype=bf16", "model.name=resnet_tiny",
      "data.kind=synthetic"],
     "parallel.fsdp.param_dtype: 'bf16' with model.name 'resnet_tiny' is not allowed"),
])
def test_unsupported_combinations_are_refused_in_one_line(overrides, expected):
    errors, _ = problems("parallel.backend=fsdp", *overrides, base=GPT)
    (error,) = errors
    assert error.startswith(expected) and "Fix: " in error and "\n" not in error


def test_fp16_shards_with_the_fp16_scaler_are_fine():
    assert problems("parallel.backend=fsdp", "precision.mode=fp16",
                    "parallel.fsdp.param_dtype=fp16", base=GPT)[0] == []


@pytest.mark.parametrize("overrides, expected", [
    (["parallel.backend=ddp", "parallel.fsdp.reshard_after_forward=false"],
     "parallel.fsdp: reshard_after_forward with parallel.backend 'ddp': these settings only tune fsdp"),
    (["parallel.backend=fsdp", "parallel.fsdp.cpu_offload=true"],
     "parallel.fsdp.cpu_offload: true on a CPU job"),
    (["parallel.backend=fsdp", "parallel.deepspeed.stage=3", "parallel.deepspeed.config={steps_per_print: 5}"],
     "parallel.deepspeed: stage, config with parallel.backend 'fsdp': these settings only tune "
     "deepspeed; they are ignored. Consider: set parallel.backend: deepspeed, or remove the "
     "parallel.deepspeed keys"),
    (["parallel.backend=horovod", "parallel.deepspeed.overlap_comm=true"],
     "parallel.deepspeed: overlap_comm with parallel.backend 'horovod'"),
])
def test_settings_that_do_nothing_are_warnings(overrides, expected):
    errors, warnings = problems(*overrides)
    assert errors == [] and len(warnings) == 1 and warnings[0].startswith(expected)


def test_fsdp_settings_in_a_deepspeed_job_are_a_warning():
    # Errors aside: a deepspeed spec is refused where DeepSpeed is not installed.
    _, warnings = problems("parallel.backend=deepspeed", "parallel.fsdp.param_dtype=bf16",
                           "parallel.fsdp.cpu_offload=true", base=GPT)
    assert warnings == ["parallel.fsdp: param_dtype, cpu_offload with parallel.backend 'deepspeed': "
                        "these settings only tune fsdp; they are ignored. Consider: set "
                        "parallel.backend: fsdp, or remove the parallel.fsdp keys"]


def test_each_backend_keeps_its_own_settings_quietly():
    assert problems("parallel.backend=fsdp", "parallel.fsdp.reshard_after_forward=false") == ([], [])


def test_a_bad_dtype_names_the_choices():
    with pytest.raises(SpecInvalid, match="parallel.fsdp.param_dtype .*'fp8' is not allowed: "
                                          "must be one of 'fp32', 'bf16', 'fp16'"):
        spec_from_dict({"run": {"name": "t"}}, ["parallel.fsdp.param_dtype=fp8"])


@pytest.mark.parametrize("settings, expected", [
    ((None, None), (None, None)),                             # fp32 untouched; autocast computes
    (("bf16", None), (torch.bfloat16, torch.float32)),        # half the gathers, fp32 sums
    (("bf16", "bf16"), (torch.bfloat16, torch.bfloat16)),
    ((None, "bf16"), (None, torch.bfloat16)),
])
def test_the_policy_follows_the_settings(settings, expected):
    assert policy_dtypes(*settings) == expected

"""The data-parallel advice as `validate` warnings, and the Horovod knobs: refused when wrong,
exported to the ranks as Horovod reads them."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_train.launch.horovod import horovod_env, read_knobs
from hpc_train.rundir import RunPaths
from hpc_train.spec import load_spec, spec_from_dict, validate_spec_file
from hpc_train.spec.rules import check_spec
from tests.conftest import REPO
from tests.runs import cli

GPU = {"slurm": {"gpus_per_node": 4, "tasks_per_node": 4},
       "data": {"kind": "hdf5", "path": "/shards", "batch_size": 64, "workers": 4}}


def warnings_of(*overrides: str, base: dict = GPU) -> list[str]:
    spec = spec_from_dict({"run": {"name": "t"}, **base}, overrides)
    errors, warnings = check_spec(spec)
    assert errors == []
    return [str(w) for w in warnings]


def test_a_well_fed_gpu_job_gets_no_warning():
    assert warnings_of() == []


@pytest.mark.parametrize("overrides, expected", [
    (["data.batch_size=16"], "data.batch_size: 16: under 32 samples per GPU per step"),
    (["data.batch_size=8", "parallel.accumulation=2"],
     "data.batch_size: 8 x parallel.accumulation 2: under 32 samples per GPU per step"),
    (["data.workers=1"], "data.workers: 1 per rank (one rank per GPU): under 2 loader workers per GPU"),
    (["data.pin_memory=false"], "data.pin_memory: false on a GPU job"),
    (["parallel.backend=ddp", "parallel.horovod.cycle_time_ms=3"],
     "parallel.horovod: HOROVOD_CYCLE_TIME with parallel.backend 'ddp'"),
])
def test_broken_advice_is_a_warning_naming_key_value_and_fix(overrides, expected):
    (warning,) = warnings_of(*overrides)
    assert warning.startswith(expected) and "Consider: " in warning


def test_the_advice_on_gpus_does_not_apply_to_cpu_jobs():
    cpu = {"data": {"kind": "hdf5", "path": "/shards", "batch_size": 8, "workers": 0,
                    "pin_memory": False}}
    assert warnings_of(base=cpu) == []


def test_accumulation_counts_toward_the_samples_per_step():
    assert warnings_of("data.batch_size=16", "parallel.accumulation=2") == []


def test_synthetic_data_needs_no_loader_workers():
    assert warnings_of("data.kind=synthetic", "data.path=null", "data.workers=0") == []


def test_hierarchical_allreduce_on_a_cpu_job_is_a_warning():
    (warning,) = warnings_of("parallel.horovod.hierarchical_allreduce=true", base={})
    assert warning.startswith("parallel.horovod.hierarchical_allreduce: true on a CPU job")


@pytest.mark.parametrize("name", ["resnet.yaml", "smoke.yaml"])
def test_no_warning_for_the_shipped_jobs(name):
    _, warnings = validate_spec_file(REPO / "jobs" / name)
    assert warnings == []


def test_validate_prints_the_warnings_and_exits_0():
    out = cli("validate", "jobs/resnet.yaml", "--no-slurm", "--set", "data.workers=1", "--set", "data.pin_memory=false",
              "--set", "parallel.backend=ddp", "--set", "parallel.powersgd.rank=8")
    assert out.returncode == 0, out.stderr
    keys = [line.split(":")[1].strip() for line in out.stderr.splitlines()]
    assert keys == ["data.workers", "data.pin_memory", "parallel.powersgd"], out.stderr
    assert all(line.startswith("warning: ") for line in out.stderr.splitlines())


@pytest.mark.parametrize("override, expected", [
    ("parallel.horovod.fusion_threshold_mb=-1", "parallel.horovod.fusion_threshold_mb"),
    ("parallel.horovod.fusion_threshold_mb=1.5", "parallel.horovod.fusion_threshold_mb"),
    ("parallel.horovod.cycle_time_ms=0", "must be > 0"),
    ("parallel.horovod.timeline=maybe", "parallel.horovod.timeline"),
    ("parallel.horovod.autotune=2", "parallel.horovod.autotune"),
    ("parallel.horovod.fusion=64", "parallel.horovod.fusion (from --set): unknown key"),
])
def test_bad_knob_values_are_refused_with_exit_2(override, expected):
    out = cli("validate", "jobs/smoke.yaml", "--set", override)
    assert out.returncode == 2 and expected in out.stderr, out.stderr
    assert out.stderr.startswith("error: ") and "Fix: " in out.stderr


def test_knobs_become_horovod_variables(tmp_path):
    spec = load_spec(REPO / "jobs/smoke.yaml", [
        "parallel.horovod.fusion_threshold_mb=32", "parallel.horovod.cycle_time_ms=2.5",
        "parallel.horovod.hierarchical_allreduce=true", "parallel.horovod.timeline=true",
        "parallel.horovod.autotune=true"])
    paths = RunPaths(tmp_path)
    env = horovod_env(spec.parallel.horovod, paths)
    assert env == {"HOROVOD_FUSION_THRESHOLD": str(32 * 2**20), "HOROVOD_CYCLE_TIME": "2.5",
                   "HOROVOD_HIERARCHICAL_ALLREDUCE": "1",
                   "HOROVOD_TIMELINE": str(tmp_path / "horovod-timeline.json"),
                   "HOROVOD_AUTOTUNE": "1", "HOROVOD_AUTOTUNE_LOG": str(tmp_path / "horovod-autotune.csv")}
    # A requeued run writes its own timeline and log.
    again = horovod_env(spec.parallel.horovod, paths, restart=2)
    assert Path(again["HOROVOD_TIMELINE"]).name == "horovod-timeline-2.json"
    assert Path(again["HOROVOD_AUTOTUNE_LOG"]).name == "horovod-autotune-2.csv"
    assert read_knobs({**env, "HOROVOD_OTHER": "x", "PATH": "/bin"}) == env


def test_knobs_left_unset_export_nothing(tmp_path):
    assert horovod_env(load_spec(REPO / "jobs/smoke.yaml").parallel.horovod, RunPaths(tmp_path)) == {}


def test_horovod_on_one_core_without_its_tuning_is_a_warning():
    (warning,) = warnings_of("parallel.horovod.few_core_tuning=false", "slurm.cpus_per_task=1",
                             base={})
    assert warning.startswith("parallel.horovod.few_core_tuning: false with one core per rank")

"""bench train's pure parts: the matrix, the launches in alternating rounds, each configuration's
spec, the step breakdown and the report built from rank results."""

from __future__ import annotations

import pytest

from hpc_train.bench import train_plan, train_report
from hpc_train.bench.train_plan import Config, Matrix, SpecData
from hpc_train.errors import HpcTrainError
from hpc_train.spec import load_spec
from hpc_train.train.timing import NO_CLOCK, PARTS, StepClock, breakdown
from tests.conftest import REPO


def test_the_default_matrix_names_every_configuration_of_the_issue():
    configs = train_plan.configurations(Matrix(), world_size=2, data=SpecData(real=True))[0]
    trainer = {(c.backend, c.precision, c.compression, c.ranks, c.data)
               for c in configs if c.kind == "trainer"}
    # Both backends compress to fp16 (Horovod's optimizer, DDP's hook).
    expected = {(b, p, c, n, d) for b in ("ddp", "horovod") for p in ("fp32", "fp16")
                for c in ("none", "fp16") for n in (1, 2) for d in ("synthetic", "real")}
    assert trainer == expected and len(trainer) == 32
    bare = {(c.backend, c.precision, c.ranks) for c in configs if c.kind == "bare"}
    assert bare == {(b, p, n) for b in ("ddp", "horovod") for p in ("fp32", "fp16") for n in (1, 2)}
    assert all(c.accumulation == 1 for c in configs)


def test_each_compression_runs_under_the_backends_that_have_it():
    matrix = Matrix(backends=("ddp", "horovod", "fsdp"), precisions=("fp32",),
                    compressions=("none", "fp16", "bf16", "powersgd"), ranks=(2,), data=("synthetic",))
    configs = train_plan.configurations(matrix, world_size=2, data=SpecData(real=True))[0]
    ran = {(c.backend, c.compression) for c in configs if c.kind == "trainer"}
    assert ran == {("ddp", "none"), ("ddp", "fp16"), ("ddp", "bf16"), ("ddp", "powersgd"),
                   ("horovod", "none"), ("horovod", "fp16"), ("fsdp", "none")}
    assert len({c.name for c in configs}) == len(configs)


def test_synthetic_specs_have_no_real_data_rows_and_one_rank_specs_one_rank_count():
    configs = train_plan.configurations(Matrix(), world_size=1, data=SpecData(real=False))[0]
    assert {c.ranks for c in configs} == {1} and {c.data for c in configs} == {"synthetic"}
    with pytest.raises(HpcTrainError, match="more than the spec's 2 ranks"):
        train_plan.configurations(Matrix(ranks=(4,)), world_size=2, data=SpecData(real=True))[0]
    with pytest.raises(HpcTrainError, match="--data real"):
        train_plan.configurations(Matrix(data=("real",)), world_size=2, data=SpecData(real=False))[0]


def test_a_users_dataset_is_measured_on_itself_by_both_loops():
    data = SpecData(real=True, dataset=True)
    configs = train_plan.configurations(Matrix(backends=("horovod",), precisions=("fp32",)), 2, data)[0]
    assert {(c.kind, c.data) for c in configs} == {("trainer", "real"), ("bare", "real")}
    with pytest.raises(HpcTrainError, match="a dataset of your own"):
        train_plan.configurations(Matrix(data=("synthetic",)), 2, data)


def test_token_specs_measure_both_loops_on_their_own_data():
    # A causal LM (text, token shards, a user's dataset of sequences): no images stand in for
    # its data, so the bare loop reads the spec's own, and is paired with the trainer on it.
    configs = train_plan.configurations(Matrix(backends=("ddp",), precisions=("fp32",)), world_size=2,
                                        data=SpecData(real=True, text=True))[0]
    assert {c.data for c in configs} == {"real"}
    units = [unit for n in (1, 2) for unit in train_plan.units([c for c in configs if c.ranks == n])]
    assert [[name.split("-")[0] for name in unit] for unit in units if len(unit) == 2] == [
        ["trainer", "bare"]] * 2


def test_launches_alternate_their_order_every_other_round():
    configs = train_plan.configurations(Matrix(backends=("ddp",), precisions=("fp32",), bare=False,
                                               data=("synthetic",)), world_size=2, data=SpecData(real=False))[0]
    launches = train_plan.launches(configs, rounds=3)
    assert [(launch["round"], launch["ranks"]) for launch in launches] == [
        (0, 1), (0, 2), (1, 2), (1, 1), (2, 1), (2, 2)]
    assert [launch["id"] for launch in launches] == list(range(6))
    two = train_plan.configurations(Matrix(backends=("ddp", "horovod"), precisions=("fp32",), bare=False,
                                           compressions=("none",), data=("synthetic",), ranks=(2,)),
                                    world_size=2, data=SpecData(real=False))[0]
    first, second = train_plan.launches(two, rounds=2)
    assert second["units"] == list(reversed(first["units"])) and len(first["units"]) == 2


def test_each_bare_loop_is_paired_with_its_trainer_and_nothing_runs_twice():
    configs = train_plan.configurations(Matrix(), world_size=2, data=SpecData(real=True))[0]
    launches = train_plan.launches(configs, rounds=1)
    names = [name for launch in launches for unit in launch["units"] for name in unit]
    assert sorted(names) == sorted(c.name for c in configs)
    pairs = [unit for launch in launches for unit in launch["units"] if len(unit) == 2]
    assert len(pairs) == 8
    for trainer, bare in pairs:
        t, b = trainer.split("-"), bare.split("-")
        assert t[0] == "trainer" and b[0] == "bare" and t[1:] == b[1:]   # same everything else


def test_parse_lists_refuse_unknown_values():
    assert train_plan.parse_list("ddp, horovod,ddp", train_plan.BACKENDS, "--backends") == ("ddp", "horovod")
    with pytest.raises(HpcTrainError, match="--backends 'nccl'"):
        train_plan.parse_list("nccl", train_plan.BACKENDS, "--backends")
    assert train_plan.parse_counts("2,1,2", "--ranks") == (1, 2)
    with pytest.raises(HpcTrainError, match="whole numbers"):
        train_plan.parse_counts("0,x", "--ranks")


def test_each_configuration_becomes_a_valid_spec_of_its_own():
    base = REPO / "jobs/smoke.yaml"
    config = Config("trainer", "ddp", "fp16", "none", 1, 2, "synthetic")
    spec = load_spec(base, train_plan.config_overrides(config, 2, 32, 10))
    assert (spec.parallel.backend, spec.precision.mode, spec.parallel.accumulation) == ("ddp", "fp16", 2)
    assert spec.world_size == 1 and spec.data.kind == "synthetic" and spec.data.val_samples == 0
    assert spec.data.train_samples >= spec.samples_per_step * 10    # the timed steps fit in one epoch
    real = load_spec(base, train_plan.config_overrides(
        Config("trainer", "horovod", "fp32", "fp16", 2, 1, "real"), 2, 32, 10))
    assert (real.data.kind, real.world_size, real.parallel.compression) == ("hdf5", 2, "fp16")


def test_breakdown_splits_a_step_into_parts_that_add_up():
    ddp = breakdown({"start": 0.0, "data": 0.1, "grads": 0.5, "backward": 0.6, "optimizer": 0.7, "end": 0.75})
    assert ddp == pytest.approx({"step": 0.75, "data": 0.1, "compute": 0.4, "comm": 0.1,
                                 "optimizer": 0.1, "other": 0.05})
    horovod = breakdown({"start": 0.0, "data": 0.1, "backward": 0.5, "reduced": 0.8, "optimizer": 0.9, "end": 1.0})
    assert horovod["compute"] == pytest.approx(0.4) and horovod["comm"] == pytest.approx(0.3)
    for parts in (ddp, horovod):
        assert sum(parts[p] for p in PARTS) == pytest.approx(parts["step"])
    # A grads mark after backward returned (a late hook) counts no negative time.
    late = breakdown({"start": 0.0, "data": 0.1, "grads": 0.7, "backward": 0.6, "end": 0.6})
    assert min(late.values()) >= 0 and late["comm"] == 0


def test_the_step_clock_marks_only_when_asked():
    import torch

    clock = StepClock(torch.device("cpu"))
    clock.mark("data")                          # before any step: ignored
    for _ in range(2):
        clock.mark("start")
        clock.after(lambda: None, "reduced")()
        clock.mark("end")
    clock.mark("start")                          # an unfinished step is not reported
    seconds = clock.seconds()
    assert len(seconds) == 2 and all(0 <= s["reduced"] <= s["end"] for s in seconds)
    clock.reset()
    assert clock.seconds() == []
    function = object()
    assert NO_CLOCK.after(function, "x") is function and NO_CLOCK.mark("start") is None


def _run(rank, round_, steps, **recorded):
    return {"rank": rank, "round": round_, "host": "h", "configs": [
        {"name": recorded.pop("name"), "steps": steps, "recorded": recorded,
         "peak_memory_bytes": 100 + rank, "peak_memory_source": "VmHWM"}], "allreduce": None}


def _steps(step: float, n: int = 3) -> list[dict]:
    return [{"step": step, "data": 0.1 * step, "compute": 0.6 * step, "comm": 0.2 * step,
             "optimizer": 0.1 * step, "other": 0.0}] * n


def test_the_report_gives_rates_scaling_overhead_and_allreduce_ratios():
    configs = [Config("trainer", "ddp", "fp32", "none", 1, 1, "synthetic"),
               Config("trainer", "ddp", "fp32", "none", 2, 1, "synthetic"),
               Config("bare", "ddp", "fp32", "none", 2, 1, "synthetic")]
    settings = {"spec": "s.yaml", "model": "m", "batch_size": 32, "image_size": 32, "launcher": "mpirun",
                "hosts": 1, "warmup": 1, "steps": 3, "rounds": 1}
    plan = {"settings": settings, "configs": [c.as_dict() for c in configs]}
    results = [_run(0, 0, _steps(0.1), name=configs[0].name, samples_per_step=32),
               _run(0, 0, _steps(0.125), name=configs[1].name, samples_per_step=64),
               _run(1, 0, _steps(0.1), name=configs[1].name, samples_per_step=64),
               _run(0, 0, _steps(0.1), name=configs[2].name, samples_per_step=64),
               _run(1, 0, _steps(0.1), name=configs[2].name, samples_per_step=64)]
    results.append({"rank": 0, "round": 0, "host": "h", "configs": [], "allreduce": {
        "model": "resnet50", "parameters": 100, "bytes": 400, "device": "cpu", "torch_backend": "gloo",
        "repetitions": 5, "rounds": 2,
        "seconds": {"mpi4py": 1.0, "horovod gradients": 1.25, "ddp buckets": 0.5}}})
    report = train_report.build(plan, results)
    one, two, bare = report["rows"]
    assert one["images_per_s"] == pytest.approx(320) and two["step_s"] == pytest.approx(0.125)  # slowest rank
    assert two["images_per_s"] == pytest.approx(512)
    assert two["scaling_efficiency"] == pytest.approx(512 / (2 * 320))
    assert one["epoch_hours"] == pytest.approx(1_281_167 / 320 / 3600)
    assert two["parts_s"]["compute"] == pytest.approx((0.6 * 0.125 + 0.6 * 0.1) / 2)
    assert two["peak_memory_bytes"] == 101 and two["ranks_agree"]
    (overhead,) = report["overhead"]
    assert overhead["overhead"] == pytest.approx(0.25) and not overhead["within_target"]
    assert overhead["overhead_per_round"] == [pytest.approx(0.25)]
    ratios = {r["method"]: r for r in report["allreduce"]["rows"]}
    assert ratios["horovod gradients"]["vs_mpi"] == pytest.approx(0.8)
    assert ratios["horovod gradients"]["within_target"] is False
    assert ratios["ddp buckets"]["vs_mpi"] == pytest.approx(2.0) and ratios["ddp buckets"]["within_target"]
    assert ratios["mpi4py"]["target"] is None
    markdown = train_report.markdown(report)
    assert markdown.count("\n| trainer ddp fp32 |") == 2 and "overhead +25.0%" in markdown
    assert report["missing"] == []


def test_the_overhead_compares_each_round_with_its_own_baseline():
    """Load that changes between rounds (here: round 1 twice as slow) cancels in the ratio."""
    trainer = Config("trainer", "horovod", "fp32", "none", 1, 1, "synthetic")
    bare = Config("bare", "horovod", "fp32", "none", 1, 1, "synthetic")
    plan = {"settings": {}, "configs": [trainer.as_dict(), bare.as_dict()]}
    results = [_run(0, 0, _steps(0.11, 3), name=trainer.name, samples_per_step=32),
               _run(0, 1, _steps(0.22, 9), name=trainer.name, samples_per_step=32),
               _run(0, 0, _steps(0.10, 9), name=bare.name, samples_per_step=32),
               _run(0, 1, _steps(0.20, 3), name=bare.name, samples_per_step=32)]
    (overhead,) = train_report.build(plan, results)["overhead"]
    assert overhead["overhead_per_round"] == [pytest.approx(0.1), pytest.approx(0.1)]
    assert overhead["overhead"] == pytest.approx(0.1)
    assert overhead["overhead_pooled"] == pytest.approx(0.22 / 0.10 - 1)   # what pooling would say

"""bench train's sharded rows (fsdp, zero1-3) and text specs, the memory split of a rank's
state and the bytes on the wire per step: the pure parts, and the accounting on real tensors."""

from __future__ import annotations

import pytest
import torch

from hpc_train.bench import state_memory, train_plan, train_report, wire
from hpc_train.bench.train_plan import Config, Matrix, SpecData
from hpc_train.errors import HpcTrainError
from hpc_train.spec import load_spec
from tests.conftest import REPO

GPT_CPU = REPO / "jobs/transformer_zero_cpu.yaml"
ALL = ("ddp", "horovod", "fsdp", "zero1", "zero2", "zero3")


def test_sharded_backends_get_trainer_rows_only_and_no_compression():
    configs, skipped = train_plan.configurations(Matrix(backends=ALL), 2, SpecData(real=False))
    trainer = {(c.backend, c.compression) for c in configs if c.kind == "trainer"}
    assert trainer == {(b, "none") for b in ALL} | {("horovod", "fp16"), ("ddp", "fp16")} and skipped == []
    assert {c.backend for c in configs if c.kind == "bare"} == {"ddp", "horovod"}


def test_without_deepspeed_its_rows_are_left_out_in_one_line_each():
    configs, skipped = train_plan.configurations(Matrix(backends=("ddp", "zero1", "zero3")), 2,
                                                 SpecData(real=False), deepspeed=False)
    assert {c.backend for c in configs} == {"ddp"}
    assert len(skipped) == 2 and all("DeepSpeed is not installed" in line for line in skipped)
    assert "zero1 left out" in skipped[0] and "zero3 left out" in skipped[1]


def test_a_text_spec_runs_both_loops_on_its_own_corpus():
    configs, _ = train_plan.configurations(Matrix(backends=("ddp", "fsdp")), 2, SpecData(real=False, text=True))
    assert {c.data for c in configs} == {"real"}
    assert {c.backend for c in configs if c.kind == "bare"} == {"ddp"}       # the bare loop's backends
    with pytest.raises(HpcTrainError, match="--data synthetic: this spec's data is text, which no"):
        train_plan.configurations(Matrix(data=("synthetic",)), 2, SpecData(real=False, text=True))


@pytest.mark.parametrize("backend, expected", [("zero1", ("deepspeed", 1)), ("zero3", ("deepspeed", 3)),
                                               ("fsdp", ("fsdp", None)), ("ddp", ("ddp", None))])
def test_bench_backend_names_map_to_the_spec(backend, expected):
    assert train_plan.spec_backend(backend) == expected


def test_each_sharded_configuration_of_the_gpt_spec_is_a_valid_spec():
    zero2 = load_spec(GPT_CPU, train_plan.config_overrides(Config("trainer", "zero2", "bf16", "none", 2, 1, "real"),
                                                           2, 16, 10))
    assert (zero2.parallel.backend, zero2.parallel.deepspeed.stage, zero2.precision.mode) == ("deepspeed", 2, "bf16")
    assert zero2.data.kind == "text" and zero2.checkpoint.every_steps is None   # no save among timed steps
    fsdp = load_spec(GPT_CPU, train_plan.config_overrides(Config("trainer", "fsdp", "fp32", "none", 1, 1, "real"),
                                                          2, 16, 10))
    assert fsdp.parallel.backend == "fsdp" and fsdp.world_size == 1


def test_ring_model_bytes_per_rank():
    assert wire.ring_wire_bytes("all_reduce", 1000, 4) == pytest.approx(1500)      # 2 (N-1)/N
    assert wire.ring_wire_bytes("all_gather", 1000, 4) == pytest.approx(750)       # (N-1)/N x whole
    assert wire.ring_wire_bytes("reduce_scatter", 1000, 2) == pytest.approx(500)
    assert wire.ring_wire_bytes("all_reduce", 1000, 1) == 0
    ops = wire.per_step([("all_reduce", 800), ("all_reduce", 8), ("all_gather", 400)] * 2, steps=2,
                        ranks=2, source="measured")
    assert ops["all_reduce"] == {"calls": 2, "payload_bytes": 808, "source": "measured",
                                 "wire_bytes": pytest.approx(808)}
    total = wire.summary({f"measured {k}": v for k, v in ops.items()})
    assert total["payload_bytes"] == 1208 and total["wire_bytes"] == pytest.approx(1008)
    assert total["sources"] == ["measured"]


def test_horovods_gradients_are_computed_halved_by_fp16_compression():
    assert wire.horovod_gradients(1000, fp32=True, compression="none") == [("all_reduce", 1000)]
    assert wire.horovod_gradients(1000, fp32=True, compression="fp16") == [("all_reduce", 500)]
    assert wire.horovod_gradients(1000, fp32=False, compression="fp16") == [("all_reduce", 1000)]


@pytest.mark.filterwarnings("ignore:`torch.distributed.all_gather_into_tensor` is deprecated")
def test_the_counter_records_each_collective_of_a_step_and_restores_the_functions(tmp_path):
    import torch.distributed as dist

    created = not dist.is_initialized()
    if created:
        dist.init_process_group("gloo", init_method=f"file://{tmp_path}/store", rank=0, world_size=1)
    try:
        original = dist.all_reduce
        counter = wire.CollectiveCounter()

        def step():
            dist.all_reduce(torch.zeros(10))
            dist.all_gather_into_tensor(torch.zeros(6), torch.zeros(6))
            dist.broadcast(tensor=torch.zeros(3, dtype=torch.float64), src=0)

        counter.counting(step)()
        assert counter.calls == [("all_reduce", 40), ("all_gather", 24), ("broadcast", 24)]
        assert counter.steps == 1 and dist.all_reduce is original
        dist.all_reduce(torch.zeros(1))                  # outside a counted step: not recorded
        assert len(counter.calls) == 3
    finally:
        if created:
            dist.destroy_process_group()


def test_views_and_flat_buffers_count_once():
    flat = torch.zeros(100)
    storages = state_memory._Storages()
    storages.add("parameters", [flat, [flat[:50], {"x": flat[50:]}]])
    storages.add("gradients", [flat[10:20], torch.zeros(5)])
    assert storages.result() == state_memory.StateBytes(parameters=400, gradients=20, optimizer=0)


def test_a_data_parallel_rank_holds_parameters_gradients_and_adam_state():
    model = torch.nn.Linear(10, 4)
    optimizer = torch.optim.AdamW(model.parameters())
    model(torch.ones(2, 10)).sum().backward()
    optimizer.step()
    model(torch.ones(2, 10)).sum().backward()
    with state_memory.at_optimizer_step(lambda: state_memory.data_parallel_state(model, optimizer)) as taken:
        optimizer.step()
        optimizer.step()
    (state,) = taken                                       # the first step only
    params = 44 * 4
    assert (state.parameters, state.gradients, state.master) == (params, params, 0)
    assert state.optimizer == 2 * params + 2 * 4           # two moments, a float32 step per tensor
    assert state.total == state.parameters + state.gradients + state.optimizer


def _result(rank: int, name: str, backend: str, rate_step: float, state: int, payload: float):
    split = {"parameters": state // 4, "gradients": state // 4, "optimizer": state // 2, "master": 0,
             "total": state}
    ops = {"measured all_reduce": {"calls": 1, "payload_bytes": payload, "source": "measured",
                                   "wire_bytes": payload}}
    return {"rank": rank, "round": 0, "host": "h", "allreduce": None, "configs": [{
        "name": name, "recorded": {"samples_per_step": 64, "backend": backend},
        "steps": [{"step": rate_step, "data": 0, "compute": rate_step, "comm": 0, "optimizer": 0,
                   "other": 0}], "peak_memory_bytes": 1000 + rank, "peak_memory_source": "VmHWM",
        "state_bytes": split, "wire": wire.summary(ops)}]}


def test_the_report_splits_memory_and_compares_with_ddp():
    ddp, zero3 = (Config("trainer", b, "fp32", "none", 2, 1, "real") for b in ("ddp", "zero3"))
    settings = {"spec": "s.yaml", "model": "gpt", "batch_size": 16, "image_size": 224, "launcher": "mpirun",
                "hosts": 1, "warmup": 2, "steps": 1, "rounds": 1, "sample": "sequence", "seq_len": 64}
    plan = {"settings": settings, "configs": [ddp.as_dict(), zero3.as_dict()]}
    results = [_result(r, ddp.name, "ddp", 0.1, 400, 800) for r in (0, 1)] + \
              [_result(r, zero3.name, "deepspeed", 0.2, 100, 1200) for r in (0, 1)]
    report = train_report.build(plan, results)
    base, sharded = report["rows"]
    assert sharded["vs_ddp"] == pytest.approx(0.5) and base["vs_ddp"] == pytest.approx(1.0)
    assert sharded["state_vs_ddp"] == pytest.approx(0.25)
    split = sharded["memory_split"]
    assert split["rank"] == 1 and split["peak"] == 1001 and split["rest"] == 1001 - 100
    assert sum(split[k] for k in train_report.STATE_PARTS) + split["rest"] == split["peak"]
    markdown = train_report.markdown(report)
    assert "| sequences/s |" in markdown and "ImageNet" not in markdown and "64 tokens" in markdown
    assert "| state vs ddp | payload MB/step | wire MB/step | wire |" in markdown
    line = next(row for row in markdown.splitlines() if row.startswith("| trainer zero3"))
    assert "| 0.25 |" in line and line.endswith("| measured |")

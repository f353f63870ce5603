"""parallel.backend: deepspeed: the spec and its refusals, and real ZeRO runs under mpirun.

The runs drive the engine with our loop on 2 CPU ranks (Gloo): the first step's loss is DDP's
on the same seed and data (fp32), and a run stopped by a signal and resumed ends with every
rank's DeepSpeed shards bit-identical to the run that never stopped.
"""

from __future__ import annotations

import signal
import sys

import pytest

from hpc_train.checkpoint import layout
from hpc_train.errors import CheckpointMismatch
from hpc_train.parallel import deepspeed_config
from hpc_train.parallel.deepspeed_engine import ENGINE_TAG
from hpc_train.spec import load_spec
from hpc_train.spec.problems import SpecInvalid
from hpc_train.spec.rules import check_spec
from hpc_train.runtime.stop import STOP_EXIT
from tests.conftest import REPO
from tests.runs import drive, events, layout_step, local_run, metrics_after, sharded_tensors

needs_deepspeed = pytest.mark.skipif(not deepspeed_config.installed(),
                                     reason="DeepSpeed not installed (extra `deepspeed`)")


# Tiny runs of the two shipped CPU jobs: a ResNet on synthetic images, gpt on text.
SMOKE = ("data.kind=synthetic", "data.train_samples=256", "data.val_samples=64", "data.image_size=16",
         "data.workers=0", "data.batch_size=16", "optim.epochs=1", "log.every_steps=1",
         "checkpoint.every_steps=null", "checkpoint.keep_last=10")
GPT = ("slurm.tasks_per_node=2", "parallel.pipeline.stages=1", "parallel.pipeline.microbatches=1",
       "data.train_samples=128", "data.val_samples=32", "data.seq_len=32", "data.batch_size=8",
       "model.options={layers: 2, dim: 32, heads: 2}", "optim.warmup_epochs=0", "log.every_steps=1")
RUNS = {"smoke": ("jobs/smoke.yaml", SMOKE), "gpt": ("jobs/transformer_pipeline_cpu.yaml", GPT)}
# ZeRO-3 keeps parameters under 1e5 elements whole on every rank by default: all of these.
PARTITIONED = ("parallel.deepspeed.config={zero_optimization: {stage3_param_persistence_threshold: 0}}",)


def spec_with(*overrides: str, spec_file: str = "jobs/smoke.yaml"):
    """The overrides with parallel.backend deepspeed; a refused spec as its problems' lines."""
    try:
        return load_spec(REPO / spec_file, ["parallel.backend=deepspeed", *overrides])
    except SpecInvalid as exc:
        return [str(p) for p in exc.problems]


def errors_of(spec) -> list[str]:
    return spec if isinstance(spec, list) else [str(p) for p in check_spec(spec)[0]]


def test_the_engine_config_is_the_specs():
    spec = spec_with("parallel.deepspeed.stage=3", "parallel.deepspeed.offload_params=cpu",
                     "parallel.accumulation=2", "optim.grad_clip=1.5",
                     "parallel.deepspeed.config={zero_optimization: {reduce_bucket_size: 1000}, "
                     "steps_per_print: 10}")
    assert not isinstance(spec, list), spec
    config = deepspeed_config.engine_config(spec)
    assert config["zero_optimization"] == {"stage": 3, "overlap_comm": False, "reduce_bucket_size": 1000,
                                           "offload_param": {"device": "cpu"}}
    assert (config["train_micro_batch_size_per_gpu"], config["gradient_accumulation_steps"],
            config["gradient_clipping"], config["steps_per_print"]) == (32, 2, 1.5, 10)
    assert config["zero_allow_untested_optimizer"] is True
    assert "bf16" not in config and "optimizer" not in config     # ours: autocast, our optimizer


def test_a_deepspeed_spec_without_deepspeed_is_refused_in_one_line(monkeypatch):
    monkeypatch.setattr(deepspeed_config, "installed", lambda: False)
    [line] = errors_of(spec_with())
    assert line.startswith("parallel.backend: 'deepspeed' is not allowed: DeepSpeed is not installed")
    assert "env/setup.sh" in line and ".[deepspeed]" in line
    assert errors_of(load_spec(REPO / "jobs/smoke.yaml")) == []   # other backends need nothing


def test_without_the_package_validate_refuses_before_anything_else():
    # A real process where `import deepspeed` finds nothing.
    code = ("import sys; sys.modules['deepspeed'] = None; from hpc_train.cli import main; "
            "sys.exit(main(['validate', 'jobs/smoke.yaml', '--set', 'parallel.backend=deepspeed']))")
    import subprocess

    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    [line] = out.stderr.splitlines()
    assert "DeepSpeed is not installed" in line and "Fix: install the extra" in line


@pytest.mark.parametrize("overrides, expected", [
    (["precision.mode=fp16"], "precision.mode: 'fp16' with parallel.backend 'deepspeed' is not allowed"),
    (["parallel.pipeline.stages=2"], "parallel.pipeline.stages: 2 with parallel.backend 'deepspeed'"),
    (["parallel.deepspeed.offload_params=cpu"], "parallel.deepspeed.offload_params: 'cpu' with "
                                                "parallel.deepspeed.stage 1"),
    (["parallel.compression=fp16"], "parallel.compression: 'fp16' with parallel.backend 'deepspeed'"),
    (["parallel.deepspeed.config={gradient_accumulation_steps: 4}"],
     "parallel.deepspeed.config.gradient_accumulation_steps: 4 is not allowed: the spec sets it "
     "(parallel.accumulation). Fix: remove it and set parallel.accumulation"),
    (["parallel.deepspeed.config={zero_optimization: {stage: 2}}"],
     "parallel.deepspeed.config.zero_optimization.stage: 2 is not allowed: the spec sets it"),
])
def test_combinations_the_backend_does_not_run_are_refused(overrides, expected):
    errors = errors_of(spec_with(*overrides))
    assert any(line.startswith(expected) for line in errors), errors


@needs_deepspeed
@pytest.mark.parametrize("passed, key", [
    ("{zero_optimization: {overlap_comms: true}}", "zero_optimization.overlap_comms: True"),
    ("{zero_optimization: {reduce_bucket_size: big}}", "zero_optimization.reduce_bucket_size: 'big'"),
    ("{steps_per_prnt: 10}", "steps_per_prnt: 10"),
])
def test_deepspeeds_own_model_checks_the_passed_config(passed, key):
    [line] = errors_of(spec_with(f"parallel.deepspeed.config={passed}"))
    assert line.startswith(f"parallel.deepspeed.config.{key} is not allowed: DeepSpeed refuses it")


@needs_deepspeed
def test_keys_deepspeed_knows_pass():
    assert errors_of(spec_with("parallel.deepspeed.stage=2", "parallel.deepspeed.overlap_comm=true",
                               "parallel.deepspeed.config={zero_optimization: {reduce_bucket_size: "
                               "1000000, contiguous_gradients: true}, wall_clock_breakdown: false}")) == []


@pytest.mark.parametrize("spec_file, overrides", [("jobs/smoke.yaml", ()),
                                                   ("jobs/transformer_pipeline_cpu.yaml", GPT)])
def test_the_backend_alone_picks_the_zero_parts(spec_file, overrides):
    from hpc_train.parallel.layout import Parallelism
    from hpc_train.train.deepspeed_parts import DeepSpeedParts
    from hpc_train.train.trainer import parts_for

    spec = spec_with(*overrides, spec_file=spec_file)
    assert spec.parallelism is Parallelism.DEEPSPEED and parts_for(spec.layout) is DeepSpeedParts


def test_shards_load_only_at_their_world_size():
    from hpc_train.train.deepspeed_parts import ZeroShape

    ZeroShape(2, 3).load_state_dict({"world_size": 2, "stage": 3})
    with pytest.raises(CheckpointMismatch, match="ZeRO-3 shards of 2 ranks, the job runs ZeRO-3 on 4"):
        ZeroShape(4, 3).load_state_dict({"world_size": 2, "stage": 3})


# ----------------------------------------------------------------------------- real runs


def first_loss(paths) -> float:
    return next(m["loss"] for m in metrics_after(paths, 0) if m["step"] == 1)


@pytest.fixture(scope="module")
def ddp_first_loss(tmp_path_factory):
    """DDP's first-step loss per job, run once."""
    cache: dict[str, float] = {}

    def loss(job: str) -> float:
        if job not in cache:
            spec_file, overrides = RUNS[job]
            paths = local_run(tmp_path_factory.mktemp("ddp"), *overrides, "parallel.backend=ddp",
                              name=f"ddp-{job}", spec_file=spec_file)
            assert drive(paths) == 0
            cache[job] = first_loss(paths)
        return cache[job]
    return loss


@needs_deepspeed
@pytest.mark.mpi
@pytest.mark.slow
# The whole matrix with --heavy. CI covers it elsewhere: the first step against DDP's in
# tests/e2e/test_sharded_e2e.py (ZeRO-3 and the GPT spec, ZeRO-1 and the smoke spec, on Slurm),
# the shards and the whole-model digest on the straight run of
# test_a_stopped_zero_run_resumes_bit_identical[3] (the smoke spec, ZeRO-3 partitioned).
@pytest.mark.heavy
@pytest.mark.parametrize("job, stage", [(job, stage) for job in RUNS for stage in (1, 2, 3)])
def test_zero_trains_and_its_first_step_is_ddps(job, stage, tmp_path, ddp_first_loss):
    spec_file, overrides = RUNS[job]
    paths = local_run(tmp_path, *overrides, "parallel.backend=deepspeed",
                      f"parallel.deepspeed.stage={stage}", *(PARTITIONED if stage == 3 else []),
                      name=f"ds{stage}-{job}", spec_file=spec_file)
    assert drive(paths) == 0
    assert first_loss(paths) == pytest.approx(ddp_first_loss(job), abs=1e-6)
    assert_every_rank_saved_and_ended_whole(paths)


def assert_every_rank_saved_and_ended_whole(paths) -> None:
    """Both ranks finished; the last checkpoint holds each rank's optimizer shard; every rank's
    end digest is of the whole model (ZeRO-3 too, whose ranks hold a part each)."""
    finished = events(paths, "rank_finished")
    assert {e["rank"] for e in finished} == {0, 1}
    final = sorted((p for p in paths.checkpoints.iterdir() if p.name.startswith("step-")),
                   key=lambda p: int(p.name.split("-")[1]))[-1]
    shards = sorted(p.name for p in (final / layout.SHARDED / ENGINE_TAG).iterdir())
    assert [n for n in shards if "optim_states" in n] == [
        f"zero_pp_rank_{r}_mp_rank_00_optim_states.pt" for r in (0, 1)]   # every rank its shard
    assert {e["params_sha256"] for e in finished} == {whole_model_digest(paths, final)}


def whole_model_digest(paths, checkpoint) -> str:
    """`parameters_digest` of the whole model that DeepSpeed's own converter (zero_to_fp32)
    rebuilds from the shards of `checkpoint`, named as the engine names it (under `module.`)."""
    import torch
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from hpc_train.train.sharded_model import build_job_model
    from hpc_train.train.trainer import parameters_digest

    whole = get_fp32_state_dict_from_zero_checkpoint(str(checkpoint / layout.SHARDED), tag=ENGINE_TAG)
    model = build_job_model(load_spec(paths.spec))
    model.load_state_dict(whole)
    return parameters_digest(torch.nn.ModuleDict({"module": model}))


def engine_tensors(paths, step: int) -> dict:
    """Every tensor of the DeepSpeed shards of checkpoint `step`, by file and path."""
    return sharded_tensors(layout_step(paths, step))


@needs_deepspeed
@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("stage", [pytest.param(1, marks=pytest.mark.heavy), 3])   # CI: ZeRO-3's, the partitioned one
def test_a_stopped_zero_run_resumes_bit_identical(stage, tmp_path):
    """Stopped by USR2 at step 5, resumed to the end: every tensor of the engine's shards and the
    loss of every step as the uninterrupted run's. At ZeRO-3 the first resume is also killed in a
    save: rank 1 SIGKILLs itself in the save of step 8 (the first epoch's end), between its two
    state files (HPC_TRAIN_FAULT kill_in_save). That run dies, the half-written step never
    counts, and the next one resumes from the stop's checkpoint and still ends bit-identical.
    (The kill was a run of its own before; one run now carries both, a DeepSpeed start less.)"""
    import torch

    from hpc_train.slurm.resume import prepare_resume

    overrides = [*SMOKE, "optim.epochs=2", "parallel.backend=deepspeed", f"parallel.deepspeed.stage={stage}",
                 "launch.restarts_in_job=0", *(PARTITIONED if stage == 3 else [])]
    straight = local_run(tmp_path, *overrides, name="straight")
    assert drive(straight) == 0
    assert_every_rank_saved_and_ended_whole(straight)
    stopped = local_run(tmp_path, *overrides, name="stopped")
    assert drive(stopped, signal_at_step=2, signum=signal.SIGUSR2) == STOP_EXIT   # agreed at step 5
    [stop] = events(stopped, "stop_saved")
    if stage == 3:
        prepare_resume(stopped, ["launch.env.HPC_TRAIN_FAULT=kill_in_save:1:8"], True)
        assert drive(stopped) != 0
        assert layout.list_complete(stopped.checkpoints) == [stop["step"]]
        half = stopped.checkpoints / layout.tmp_dir_name(8) / layout.SHARDED / ENGINE_TAG
        written = {p.name for p in half.iterdir()}
        assert "zero_pp_rank_1_mp_rank_00_model_states.pt" in written        # its first file,
        assert "zero_pp_rank_1_mp_rank_00_optim_states.pt" not in written    # not its second
        prepare_resume(stopped, ["launch.env.HPC_TRAIN_FAULT=''"], True)
    assert drive(stopped) == 0
    resumed = [e["from_checkpoint"] for e in events(stopped, "resumed")]
    assert resumed == [stop["step"]] * (2 if stage == 3 else 1)
    total = 16          # 256 samples / (16 x 2 ranks) = 8 steps per epoch, 2 epochs
    assert layout.list_complete(stopped.checkpoints)[-2:] == [8, total]
    expected, got = engine_tensors(straight, total), engine_tensors(stopped, total)
    assert expected.keys() == got.keys() and expected
    for where in expected:
        assert torch.equal(expected[where], got[where]), where
    losses = {m["step"]: m["loss"] for m in metrics_after(straight, 0)}
    assert {m["step"]: m["loss"] for m in metrics_after(stopped, 0)} == losses

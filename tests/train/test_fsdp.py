"""parallel.backend fsdp on real mpirun ranks, driven without Slurm: it trains as DDP does, its
sharded checkpoints (DCP) resume at other world sizes, and DDP and fsdp resume each other's.

The runs are jobs/smoke.yaml on synthetic images (no augmentation, one thread per rank: the
deterministic setting) and the GPT CPU spec at one stage; a few steps each. One fsdp run stopped
mid-run serves every test that resumes an fsdp checkpoint: each resumes a copy of it.
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
from pathlib import Path

import pytest

from hpc_train.checkpoint import layout
from hpc_train.launch.local import free_port
from hpc_train.rundir import RunPaths, read_jsonl
from hpc_train.runtime.stop import STOP_EXIT
from hpc_train.slurm.resume import prepare_resume
from hpc_train.spec import load_spec
from tests.conftest import REPO
from tests.ledger import assert_every_sample_once_in_order, read_ledger
from tests.runs import assert_identical, cli, drive, events, local_run, rank_results, train_losses

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

# No data workers: what fsdp shards is the model and optimizer, and the loader's state resumes
# the same under every backend (data workers across a stop: tests/train/test_resume_exact.py and
# tests/e2e/test_lifecycle_e2e.py). A worker's forkserver costs each rank start 1.5 s of CPU.
SMOKE = ["data.kind=synthetic", "data.train_samples=256", "data.val_samples=64",
         "data.image_size=16", "data.workers=0", "optim.epochs=2", "log.every_steps=1",
         "checkpoint.every_steps=null", "checkpoint.keep_last=10"]
TOTAL = 8        # 256 samples / (32 x 2 ranks) = 4 steps per epoch, 2 epochs
STOP = 5         # a USR2 at step 2: the ranks agree on stops every 5 steps
GPT = ["slurm.tasks_per_node=2", "parallel.pipeline.stages=1", "parallel.pipeline.microbatches=1",
       "model.options.layers=2", "data.train_samples=128", "data.val_samples=32",
       "optim.max_steps=3", "log.every_steps=1"]


def run(root, backend: str, *overrides: str, name: str, spec_file: str = "jobs/smoke.yaml",
        stop: bool = False) -> RunPaths:
    paths = local_run(root, f"parallel.backend={backend}", *overrides, name=name,
                      spec_file=spec_file)
    if stop:
        assert drive(paths, signal_at_step=2, signum=signal.SIGUSR2) == STOP_EXIT
    else:
        assert drive(paths) == 0
    return paths


def resumed_copy(paths: RunPaths, name: str, *overrides: str) -> RunPaths:
    """A copy of a stopped run, resumed to the end with `overrides` (consented to)."""
    copy = RunPaths(paths.root.with_name(name))
    shutil.copytree(paths.root, copy.root)
    prepare_resume(copy, list(overrides), True)
    assert drive(copy) == 0
    return copy


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """Uninterrupted 2-rank runs of the smoke spec under DDP and under fsdp."""
    root = tmp_path_factory.mktemp("fsdp-straight")
    return {backend: run(root, backend, *SMOKE, name=backend) for backend in ("ddp", "fsdp")}


@pytest.fixture(scope="module")
def stopped_fsdp(tmp_path_factory) -> tuple[RunPaths, Path]:
    """One 2-rank fsdp run of the smoke spec stopped at step STOP, with the sample ledger on:
    (the run, its ledger as the stop left it). The tests that resume it resume copies of it
    (`resumed_copy`), never the run: each of them starts from the same stop. The copies' ranks
    append to the ledger the spec names, so the ledger of the stop is kept apart first."""
    root = tmp_path_factory.mktemp("fsdp-stopped")
    ledger = root / "ledger"
    paths = run(root, "fsdp", *SMOKE, f"launch.env.HPC_TRAIN_SAMPLE_LEDGER={ledger}",
                name="fsdp-stopped", stop=True)
    at_stop = shutil.copy(ledger, root / "ledger-at-stop")
    return paths, Path(at_stop)


def stopped_run(saved: str, request, tmp_path) -> RunPaths:
    """A run of `saved` stopped at STOP: fsdp's is the module's (copied by who resumes it),
    made only where a test asks for it."""
    if saved == "fsdp":
        return request.getfixturevalue("stopped_fsdp")[0]
    return run(tmp_path, saved, *SMOKE, name=f"{saved}-stopped", stop=True)


def test_fsdp_trains_as_ddp_does(straight):
    ddp, fsdp = train_losses(straight["ddp"]), train_losses(straight["fsdp"])
    assert len(ddp) == len(fsdp) == TOTAL
    assert abs(fsdp[0] - ddp[0]) <= 1e-6
    assert max(abs(a - b) for a, b in zip(ddp, fsdp)) <= 1e-4
    final = straight["fsdp"].checkpoints / layout.step_dir_name(TOTAL)
    assert (final / layout.SHARDED / ".metadata").is_file()     # every rank's shards, by DCP
    assert len(list((final / layout.SHARDED).glob("*.distcp"))) == 2
    finished = events(straight["fsdp"], "rank_finished")
    assert len({e["params_sha256"] for e in finished}) == 1       # the gathered weights agree


def test_evaluate_and_export_read_the_sharded_checkpoint(straight, mpirun_argv, python, tmp_path):
    import torch

    from hpc_train.models import build_model
    from hpc_train.train.trainer import parameters_digest

    paths = straight["fsdp"]
    evaluated = cli("evaluate", str(paths.root), "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    report = json.loads(evaluated.stdout)
    (line,) = [m for m in read_jsonl(paths.metrics) if m.get("split") == "val" and m["step"] == TOTAL]
    assert report["step"] == TOTAL and report["accuracy"] == line["accuracy"]
    assert report["loss"] == pytest.approx(line["loss"], rel=1e-6)     # the trainer's validation
    argv = [*mpirun_argv(2), "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}",
            python, "-m", "hpc_train", "evaluate", str(paths.root), "--json"]
    two = subprocess.run(argv, capture_output=True, text=True, timeout=180, cwd=REPO)
    assert two.returncode == 0, two.stderr[-3000:]
    assert json.loads(two.stdout)["loss"] == pytest.approx(report["loss"], rel=1e-12)
    exported = cli("export", str(paths.root), "-o", str(tmp_path / "model.pt"))
    assert exported.returncode == 0, exported.stderr
    model = build_model("resnet_tiny", 10)
    model.load_state_dict(torch.load(tmp_path / "model.pt", weights_only=True)["state_dict"])
    (digest,) = {e["params_sha256"] for e in events(paths, "rank_finished")}
    assert parameters_digest(model) == digest       # the weights training ended with


def test_the_gpt_spec_trains_as_ddp_does(tmp_path):
    spec = "jobs/transformer_pipeline_cpu.yaml"
    ddp = train_losses(run(tmp_path, "ddp", *GPT, name="ddp", spec_file=spec))
    fsdp = train_losses(run(tmp_path, "fsdp", *GPT, name="fsdp", spec_file=spec))
    assert len(ddp) == len(fsdp) == 3
    assert abs(fsdp[0] - ddp[0]) <= 1e-6
    assert max(abs(a - b) for a, b in zip(ddp, fsdp)) <= 1e-5    # with gradient clipping
    # bf16 weights gathered, fp32 reductions, kept gathered to backward: close, not equal.
    half = train_losses(run(tmp_path, "fsdp", *GPT, "precision.mode=bf16",
                            "parallel.fsdp.param_dtype=bf16",
                            "parallel.fsdp.reshard_after_forward=false", name="bf16",
                            spec_file=spec))
    assert max(abs(a - b) for a, b in zip(ddp, half)) <= 1e-2


def test_fp16_scales_the_sharded_loss(straight, tmp_path):
    paths = run(tmp_path, "fsdp", *SMOKE, "precision.mode=fp16", "optim.max_steps=3", name="fp16")
    steps = [m for m in read_jsonl(paths.metrics) if m.get("split") is None]
    assert abs(steps[0]["loss"] - train_losses(straight["ddp"])[0]) <= 1e-2
    assert all(m["skipped_steps"] == 0 and m["loss_scale"] == 2.0 ** 16 for m in steps)


# CI runs one pair per direction: sharded to replicated (fsdp -> ddp) and replicated to sharded
# (horovod -> fsdp); the other two with --heavy.
@pytest.mark.parametrize("saved, resumed", [
    pytest.param("ddp", "fsdp", marks=pytest.mark.heavy), ("fsdp", "ddp"),
    pytest.param("horovod", "fsdp", marks=pytest.mark.horovod),
    pytest.param("fsdp", "horovod", marks=[pytest.mark.horovod, pytest.mark.heavy])])
def test_ddp_and_fsdp_resume_each_others_checkpoints(saved, resumed, straight, request, tmp_path):
    stopped = stopped_run(saved, request, tmp_path)
    copy = resumed_copy(stopped, f"{saved}-as-{resumed}", f"parallel.backend={resumed}")
    assert [e["step"] for e in events(copy, "resumed")] == [STOP]
    expected = train_losses(straight["ddp"])
    got = train_losses(copy)
    assert len(got) == TOTAL
    assert max(abs(a - b) for a, b in zip(expected, got)) <= 1e-4   # the same run, carried on


def final_state(paths: RunPaths) -> tuple[dict, dict, list[dict]]:
    """(whole model + optimizer from the shards, replicated.pt, each rank's own file) at TOTAL."""
    import torch

    from hpc_train.checkpoint.sharded import whole_state

    directory = paths.checkpoints / layout.step_dir_name(TOTAL)
    ranks = [torch.load(directory / layout.rank_file_name(r), weights_only=True) for r in (0, 1)]
    return (whole_state(directory / layout.SHARDED),
            torch.load(directory / layout.REPLICATED, weights_only=True), ranks)


def assert_same_final_state(straight: RunPaths, paths: RunPaths) -> None:
    """`paths` ended with every rank's state of `straight` at TOTAL, bit for bit."""
    expected, got = final_state(straight), final_state(paths)
    assert_identical(expected[0], got[0], "sharded")        # model and optimizer, every shard
    assert_identical(expected[1]["precision"], got[1]["precision"], "precision")
    for rank in (0, 1):
        assert_identical(expected[2][rank]["buffers"], got[2][rank]["buffers"], f"rank {rank}")


def test_a_stopped_run_resumed_on_its_ranks_ends_bit_identical(straight, stopped_fsdp):
    stopped, _ = stopped_fsdp
    copy = resumed_copy(stopped, "again")
    assert [e["step"] for e in events(copy, "resumed")] == [STOP]
    assert_same_final_state(straight["fsdp"], copy)


def test_a_sharded_checkpoint_resumes_at_one_and_at_four_ranks(stopped_fsdp, tmp_path):
    stopped, ledger = stopped_fsdp
    rows_before = read_ledger(ledger)
    for ranks in (1, 4):
        own = tmp_path / f"ledger-{ranks}"
        shutil.copy(ledger, own)
        copy = resumed_copy(stopped, f"at-{ranks}", f"slurm.tasks_per_node={ranks}",
                            f"launch.env.HPC_TRAIN_SAMPLE_LEDGER={own}")
        (resumed,) = events(copy, "resumed")
        assert (resumed["step"], resumed["saved_world_size"]) == (STOP, 2), resumed
        spec = load_spec(copy.spec)
        rows = read_ledger(own)
        assert len(rows) > len(rows_before)
        assert_every_sample_once_in_order(rows, spec, 256)
        assert events(copy, "rank_finished") and len(
            {e["params_sha256"] for e in events(copy, "rank_finished")}) == 1


@pytest.mark.parametrize("ranks", [2, 4])
def test_each_rank_holds_a_part_of_the_parameters(ranks, mpirun_argv, python, tmp_path):
    argv = [*mpirun_argv(ranks), "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}",
            "-x", "OMP_NUM_THREADS=1", "-x", f"PYTHONPATH={REPO}", python, str(REPO / "tests/workers/fsdp_shards.py"),
            str(tmp_path)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    results = rank_results(tmp_path, ranks)
    total = results[0]["total"]
    assert sum(r["local"] for r in results) == total
    for r in results:
        assert r["local"] <= total / ranks * 1.05, r      # 1/N, give or take uneven rows
        assert r["digest"] == results[0]["digest"]        # and the same whole model


def test_a_rank_killed_mid_save_leaves_the_previous_checkpoint(straight, tmp_path):
    """Rank 1 SIGKILLs itself in the save of step TOTAL, after its DCP data file and before the
    metadata (HPC_TRAIN_FAULT kill_in_save): the run dies, the half-written step never counts,
    and the next run resumes from the epoch's checkpoint before it and ends bit-identical."""
    paths = local_run(tmp_path, "parallel.backend=fsdp", *SMOKE, "launch.restarts_in_job=0",
                      f"launch.env.HPC_TRAIN_FAULT=kill_in_save:1:{TOTAL}", name="killed")
    assert drive(paths) != 0
    assert layout.list_complete(paths.checkpoints) == [TOTAL // 2]
    half = paths.checkpoints / layout.tmp_dir_name(TOTAL)
    assert (half / layout.SHARDED / "__1_0.distcp").is_file()     # killed mid-write, truly:
    assert not (half / layout.SHARDED / ".metadata").exists()     # its shards, no metadata
    assert not list(half.glob("rank-*.pt"))
    assert not events(paths, "rank_finished")
    prepare_resume(paths, ["launch.env.HPC_TRAIN_FAULT=''"], True)
    assert drive(paths) == 0
    assert [e["from_checkpoint"] for e in events(paths, "resumed")] == [TOTAL // 2]
    assert_same_final_state(straight["fsdp"], paths)

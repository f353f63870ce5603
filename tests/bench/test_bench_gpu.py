"""The GPU protocol: its verdicts and merge (pure), and its whole code path on the CPU (no GPU
here; on a CUDA machine `bench gpu` runs the same code with device cuda)."""

from __future__ import annotations

import json

import pytest

from hpc_train.bench import gpu
from tests.conftest import REPO
from tests.runs import cli


def _phases(synthetic: float, shards: float) -> dict:
    return {"synthetic fp16 ddp": {"images_per_s_per_gpu": synthetic},
            "shards fp16 ddp": {"images_per_s_per_gpu": shards}}


def test_targets_apply_to_h100_and_h200_only():
    met = gpu.verdicts(_phases(4200, 3900), "NVIDIA H200", "fp16")
    assert met["synthetic_ok"] and met["shards_ok"] and met["shards_vs_synthetic"] == pytest.approx(3900 / 4200)
    missed = gpu.verdicts(_phases(3500, 2000), "NVIDIA H100 80GB HBM3", "fp16")
    assert not missed["synthetic_ok"] and not missed["shards_ok"] and "NO" in missed["verdict"]
    other = gpu.verdicts(_phases(2600, 2500), "NVIDIA A100-SXM4-80GB", "fp16")
    assert "synthetic_ok" not in other and other["verdict"].startswith("no target for NVIDIA A100")
    assert other["vs_anchor"] == pytest.approx(2600 / 2470)
    assert gpu.verdicts({}, None, "fp16")["vs_anchor"] is None


def test_merge_averages_per_gpu_and_sums_the_machine():
    ranks = [{"phases": {"p": {"images_per_s_per_gpu": 100.0, "steps": 9}}, "skipped": [], "gpu": "g"},
             {"phases": {"p": {"images_per_s_per_gpu": 300.0, "steps": 9}}, "skipped": [], "gpu": "g"}]
    merged = gpu.merge(ranks)["phases"]["p"]
    assert merged["images_per_s_per_gpu"] == 200 and merged["images_per_s_all_gpus"] == 400


def test_settings_leave_a_core_per_gpu_for_training():
    settings = gpu.settings_from(gpu.default_args(), gpus=1, shards=REPO, budget=100)
    assert 2 <= settings["workers"] <= 16 and settings["precisions"] == ["fp16", "bf16"]
    with pytest.raises(Exception, match="--precisions"):
        gpu.settings_from(gpu.default_args(precisions="fp8"), 1, REPO, 100)


def test_without_cuda_bench_gpu_says_so():
    out = cli("bench", "gpu")
    assert out.returncode == 1 and "needs a CUDA GPU" in out.stderr


@pytest.mark.slow
def test_the_protocol_runs_end_to_end_on_the_cpu(tmp_path):
    out = tmp_path / "gpu.json"
    run = cli("bench", "gpu", "--device", "cpu", "--model", "resnet_tiny", "--image-size", "16",
              "--batch", "4", "--precisions", "fp32", "--seconds", "0.3", "--warmup", "1",
              "--workers", "1", "--shards", str(REPO / "data/demo-shards"), "--out", str(out),
              timeout=240)
    assert run.returncode == 0, run.stderr
    report = json.loads(out.read_text())
    assert list(report["phases"]) == ["synthetic fp32 ddp", "shards loader only", "shards fp32 ddp"]
    for phase in report["phases"].values():
        assert phase["images_per_s_per_gpu"] > 0
    assert report["phases"]["synthetic fp32 ddp"]["steps"] >= 5 and report["skipped"] == []
    assert report["targets"]["anchor"]["images_per_s"] == 2470 and report["gpus"] == 1
    assert "synthetic fp32 ddp:" in run.stdout


@pytest.mark.mpi
@pytest.mark.slow
def test_several_gpus_run_as_ranks_of_a_job_on_this_host(mpirun_argv):
    """The path of a machine with several GPUs, on the CPU: one rank each, started by the
    driver's launch plan and supervised, the same steps on every rank."""
    args = gpu.default_args(device="cpu", model="resnet_tiny", image_size=16, batch=4, precisions="fp32",
                            seconds=0.3, warmup=1, workers=1, no_horovod=True)
    settings = gpu.settings_from(args, gpus=2, shards=REPO / "data/demo-shards", budget=120)
    ranks = gpu.run_ranks(settings, 2)
    assert [r["rank"] for r in ranks] == [0, 1] and all(r["skipped"] == [] for r in ranks)
    assert ranks[0]["phases"]["synthetic fp32 ddp"]["steps"] == ranks[1]["phases"]["synthetic fp32 ddp"]["steps"]
    assert gpu.merge(ranks)["phases"]["shards fp32 ddp"]["images_per_s_all_gpus"] > 0

"""A K x D pipeline computes what one process computes: real mpirun ranks, real torch
pipelining (GPipe and 1F1B), replica averaging through torch.distributed and Horovod.

Each launch runs several configurations on 4 ranks (start-up is the expensive part on CPUs);
the tests below read their results.
"""

from __future__ import annotations

import subprocess

import pytest

from hpc_train.launch.local import free_port
from tests.conftest import REPO
from tests.runs import rank_results

pytestmark = [pytest.mark.slow, pytest.mark.mpi]

RANKS = 4
# name: stages, micro-batches, schedule, remat, precision[, balance, clip] (replicas = 4 / stages)
CONFIGS = {
    "k2d2-time-clip": (2, 4, "1f1b", False, "fp32", "time", 0.05),
    "k4-gpipe": (4, 4, "gpipe", False, "fp32"),
    "k4-1f1b": (4, 4, "1f1b", False, "fp32"),
    "k2d2-gpipe": (2, 4, "gpipe", False, "fp32"),
    "k2d2-1f1b": (2, 4, "1f1b", False, "fp32"),
    "k1d4": (1, 2, "gpipe", False, "fp32"),
    "k2d2-remat": (2, 4, "gpipe", True, "fp32"),
    "k2d2-bf16": (2, 2, "gpipe", False, "bf16"),
    "k2d2-fp16": (2, 2, "gpipe", False, "fp16"),
    "k2d2-overflow": (2, 2, "gpipe", False, "overflow"),
}
HOROVOD_CONFIGS = {"k2d2-1f1b-horovod": (2, 4, "1f1b", False, "fp32")}


def launch(mpirun_argv, python, out_dir, backend: str, configs: dict, steps: int = 3) -> dict:
    specs = [":".join([name, str(k), str(m), s, "remat" if r else "plain", *map(str, rest)])
             for name, (k, m, s, r, *rest) in configs.items()]
    argv = [*mpirun_argv(RANKS), "-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}",
            "-x", "OMP_NUM_THREADS=1", python, str(REPO / "tests/workers/pipeline_equivalence.py"),
            backend, str(steps), str(out_dir), *specs]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    assert out.returncode == 0, (out.stdout + out.stderr)[-4000:]
    results = {}
    for name in configs:
        results[name] = rank_results(out_dir / name, RANKS)
    return results


@pytest.fixture(scope="module")
def ddp_results(mpirun_argv, python, tmp_path_factory):
    return launch(mpirun_argv, python, tmp_path_factory.mktemp("pipeline-ddp"), "ddp", CONFIGS)


@pytest.fixture(scope="module")
def horovod_results(mpirun_argv, python, tmp_path_factory):
    return launch(mpirun_argv, python, tmp_path_factory.mktemp("pipeline-hvd"), "horovod",
                  HOROVOD_CONFIGS)


def assert_matches_one_process(results: list[dict], stages: int, tolerance: float = 1e-5) -> None:
    assert sorted({r["stage"] for r in results}) == list(range(stages))
    assert {r["replica"] for r in results} == set(range(RANKS // stages))
    for r in results:
        assert r["params_checked"] > 0, r
        assert r["grad_diff"] < tolerance, r   # every gradient of the first step
        assert r["loss_diff"] < tolerance, r   # the loss of every step
        assert r["param_diff"] < tolerance, r  # every parameter after the optimizer steps
    last = [r for r in results if r["stage"] == stages - 1]
    assert len(last) == RANKS // stages                 # each replica's last stage evaluated
    for r in last:
        assert r["eval_loss_diff"] < 1e-4 and r["eval_correct_diff"] <= 1, r
    assert all(r["sizes"] == results[0]["sizes"] for r in results)
    assert sum(results[0]["sizes"]) == 8 and len(results[0]["sizes"]) == stages  # 6 layers + 2


@pytest.mark.parametrize("name", ["k4-gpipe", "k4-1f1b", "k2d2-gpipe", "k2d2-1f1b", "k1d4"])
def test_pipeline_matches_one_process(name, ddp_results):
    assert_matches_one_process(ddp_results[name], CONFIGS[name][0])


def test_timed_balance_and_global_norm_clipping_match_one_process(ddp_results):
    # Rank 0 times the blocks and broadcasts the cut: every rank must cut alike. The clip
    # threshold is far below the gradient norm, so every step clips, by the norm over all stages.
    results = ddp_results["k2d2-time-clip"]
    assert_matches_one_process(results, 2)


@pytest.mark.horovod
def test_horovod_process_sets_average_the_replicas(horovod_results):
    assert_matches_one_process(horovod_results["k2d2-1f1b-horovod"], 2)


def test_remat_lowers_activation_memory_and_changes_nothing(ddp_results):
    assert_matches_one_process(ddp_results["k2d2-remat"], 2)
    for plain, remat in zip(ddp_results["k2d2-gpipe"], ddp_results["k2d2-remat"]):
        assert remat["peak_saved_bytes"] < 0.5 * plain["peak_saved_bytes"], (plain, remat)


@pytest.mark.parametrize("name", ["k2d2-bf16", "k2d2-fp16"])
def test_half_precision_stays_close_to_fp32(name, ddp_results):
    for r in ddp_results[name]:
        assert r["loss_diff"] < 2e-2, r     # against the fp32 single-process reference
        assert r["param_diff"] < 1e-2, r
        assert r["grad_diff"] > 0, r        # it did compute in half precision


def test_an_overflow_on_one_stage_skips_the_step_on_every_stage(ddp_results):
    for r in ddp_results["k2d2-overflow"]:
        assert r["applied"] == [False, True, True], r
        assert r["unchanged_after_skip"], r          # the stage without the inf skipped too
        assert r["scales"][0] == 512.0, r            # every rank halved its scale once

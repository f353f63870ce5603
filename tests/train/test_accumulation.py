"""Gradient accumulation: k micro-batches of B give the update of one batch of k x B."""

from __future__ import annotations

import subprocess

import pytest
import torch

from hpc_train.launch.local import free_port
from hpc_train.train.precision import Precision
from hpc_train.train.step import optimizer_step
from tests.conftest import REPO
from tests.runs import rank_results


def _linear_model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Linear(6, 3)


def test_single_process_accumulation_matches_the_large_batch():
    inputs, labels = torch.randn(8, 6), torch.randint(3, (8,))
    criterion = torch.nn.CrossEntropyLoss()
    results = []
    for chunks in (1, 2, 4):
        model = _linear_model()
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        micro = list(zip(inputs.chunk(chunks), labels.chunk(chunks)))
        loss, applied = optimizer_step(model, opt, micro, lambda m, x, y: criterion(m(x), y), Precision("fp32"))
        assert applied
        results.append((loss, model.weight.detach().clone()))
    for loss, weight in results[1:]:
        assert loss == pytest.approx(results[0][0], rel=1e-6)
        torch.testing.assert_close(weight, results[0][1], rtol=0, atol=1e-6)
    assert not torch.equal(results[0][1], _linear_model().weight)  # the step moved the weights


@pytest.mark.mpi
@pytest.mark.slow
@pytest.mark.parametrize("backend", [pytest.param("horovod", marks=pytest.mark.horovod), "ddp", "fsdp"])
def test_two_ranks_accumulating_match_one_process(backend, mpirun_argv, python, tmp_path):
    # PYTHONPATH: the workers import this checkout's package, not an installed one.
    env_argv = ["-x", "MASTER_ADDR=127.0.0.1", "-x", f"MASTER_PORT={free_port()}",
                "-x", f"PYTHONPATH={REPO}"]
    argv = [*mpirun_argv(2), *env_argv, python, str(REPO / "tests/workers/accumulation.py"), backend,
            str(tmp_path)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    for r in rank_results(tmp_path, 2):
        assert r["max_diff"] < 1e-5, r

"""Real Horovod over real mpirun: 2 ranks, collectives and an optimizer step."""

import subprocess

import pytest

from tests.conftest import REPO
from tests.runs import rank_results

pytestmark = [pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]


def test_two_rank_allreduce_through_horovod_torch(mpirun_argv, python, tmp_path):
    argv = [*mpirun_argv(2), python, str(REPO / "tests/workers/hvd_collectives.py"), str(tmp_path)]
    out = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert out.returncode == 0, out.stderr[-3000:]
    ranks = rank_results(tmp_path, 2)
    for r in ranks:
        assert r["size"] == 2
        assert r["sum"] == [3.0] * 4          # 1 + 2
        assert r["avg"] == [1.5] * 4
        assert r["bcast"] == 10.0             # rank 0's value everywhere
    # Same start after broadcast_parameters, same weights after the step, and the step used the
    # averaged gradient: w1 = w0 - lr * mean(x) = w0 - 0.5 * 1.5.
    assert ranks[0]["start"] == ranks[1]["start"]
    assert ranks[0]["after"] == ranks[1]["after"]
    for w0, w1 in zip(ranks[0]["start"], ranks[0]["after"]):
        assert w1 == pytest.approx(w0 - 0.75, abs=1e-3)

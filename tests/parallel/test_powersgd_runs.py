"""PowerSGD on the shipped smoke job as users run it (HDF5 JPEG shards, augmentation, two
loader workers per rank), 2 ranks under the real mpirun and DDP over Gloo:

- stopped by a signal mid-run and resumed, it ends bit-identical to the run that never stopped:
  weights, optimizer, every rank's buffers and PowerSGD's own residuals and factors;
- its validation accuracy is the uncompressed run's within 0.03.
Bytes on the wire: tests/parallel/test_ddp_hooks.py (counted) and `bench train` (docs/benchmarks.md).
"""

from __future__ import annotations

import signal

import pytest

from hpc_train.rundir import read_jsonl
from hpc_train.runtime.stop import STOP_EXIT
from tests.runs import assert_same_training, drive, events, final_checkpoint, local_run

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

POWERSGD = ("parallel.backend=ddp", "parallel.compression=powersgd", "log.every_steps=1")
TOTAL_STEPS = 92                     # jobs/smoke.yaml: 2 epochs of 46 steps


def _accuracy(paths) -> float:
    return [m["accuracy"] for m in read_jsonl(paths.metrics) if m.get("split") == "val"][-1]


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    root = tmp_path_factory.mktemp("powersgd")
    runs = {"powersgd": local_run(root, *POWERSGD, name="powersgd"),
            "none": local_run(root, "parallel.backend=ddp", "log.every_steps=1", name="none")}
    for paths in runs.values():
        assert drive(paths) == 0
    return runs


def test_a_stopped_powersgd_run_resumes_bit_identical(straight, tmp_path):
    stopped = local_run(tmp_path, *POWERSGD, name="stopped")
    assert drive(stopped, signal_at_step=30, signum=signal.SIGUSR2) == STOP_EXIT
    assert drive(stopped) == 0
    [stop] = events(stopped, "stop_saved")
    assert [e["step"] for e in events(stopped, "resumed")] == [stop["step"]] and stop["step"] > 10
    assert_same_training(stopped, straight["powersgd"], TOTAL_STEPS)   # compression state included
    for rank in (0, 1):
        _, own = final_checkpoint(stopped, rank, TOTAL_STEPS)
        assert own["compression"]["iter"] > 10 and own["compression"]["error_dict"]


def test_powersgd_trains_the_smoke_job_as_well_as_uncompressed(straight):
    compressed, plain = _accuracy(straight["powersgd"]), _accuracy(straight["none"])
    assert abs(compressed - plain) <= 0.03, (compressed, plain)

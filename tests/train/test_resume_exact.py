"""Exact resume: a run stopped twice (once mid-epoch) by real signals ends bit-identical to one
that never stopped: model, optimizer, loss scaler and every rank's BatchNorm buffers."""

from __future__ import annotations

import signal

import pytest
import torch

from hpc_train.checkpoint import layout
from hpc_train.runtime.stop import STOP_EXIT
from tests.runs import assert_identical, drive, events, local_run

pytestmark = [pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

# Synthetic data (no random augmentation), one thread per rank: the deterministic setting.
DETERMINISTIC = ["data.kind=synthetic", "data.val_samples=128",
                 "data.image_size=16", "data.workers=1", "optim.epochs=3", "optim.warmup_epochs=0.5",
                 "log.every_steps=1", "checkpoint.every_steps=null", "checkpoint.keep_last=10"]
BATCH = 64      # 32 per rank x 2 ranks


def final_state(paths, rank: int, total_steps: int):
    directory = paths.checkpoints / layout.step_dir_name(total_steps)
    replicated = torch.load(directory / layout.REPLICATED, weights_only=True)
    own = torch.load(directory / layout.rank_file_name(rank), weights_only=True)
    return replicated, own


# Both checkpoint writers: async (the default: host snapshot, background write) and sync. fp16
# autocast is about 10x slower than fp32 on a CPU: its run is half as long (4 steps an epoch).
# The fp16 run also sends its gradients in fp16 (parallel.compression: Horovod's Compression.fp16):
# CI's run of the fp16 path on real ranks (test_submit_e2e's fp16 smoke job is heavy).
# Ranks agree on a stop every 5 steps, so a signal at step s stops at the next multiple of 5:
# every stop here is in mid-epoch.
@pytest.mark.parametrize("precision, write, samples, signal_steps",
                         [("fp32", "async", 512, (7, 17)), ("fp16", "sync", 256, (3, 7))])
def test_twice_interrupted_run_matches_uninterrupted(precision, write, samples, signal_steps, tmp_path):
    overrides = [*DETERMINISTIC, f"data.train_samples={samples}", f"precision.mode={precision}",
                 f"checkpoint.write={write}", f"parallel.compression={'fp16' if precision == 'fp16' else 'none'}"]
    steps_per_epoch = samples // BATCH
    total_steps = 3 * steps_per_epoch
    straight = local_run(tmp_path, *overrides, name="straight")
    assert drive(straight) == 0

    stopped = local_run(tmp_path, *overrides, name="stopped")
    assert drive(stopped, signal_at_step=signal_steps[0], signum=signal.SIGUSR2) == STOP_EXIT
    assert drive(stopped, signal_at_step=signal_steps[1], signum=signal.SIGTERM) == STOP_EXIT
    assert drive(stopped) == 0

    assert {e["mode"] for e in events(stopped, "checkpoint_saved")} == {write}
    stops = events(stopped, "stop_saved")
    # The driver passes both on as USR2 (mpirun would abort on TERM); it records what it got.
    assert [e["reason"] for e in stops] == ["SIGUSR2", "SIGUSR2"]
    assert [e["reason"] for e in events(stopped, "stop_requested")] == ["SIGUSR2", "SIGTERM"]
    assert all(stop["step"] % steps_per_epoch != 0 for stop in stops)       # both mid-epoch
    assert all(stop["step"] < total_steps for stop in stops)
    assert [e["step"] for e in events(stopped, "resumed")] == [e["step"] for e in stops]
    for rank in (0, 1):
        expected, got = final_state(straight, rank, total_steps), final_state(stopped, rank, total_steps)
        assert_identical(expected[0]["model"], got[0]["model"], "model")
        assert_identical(expected[0]["optimizer"], got[0]["optimizer"], "optimizer")
        assert_identical(expected[0]["precision"], got[0]["precision"], "precision")
        assert_identical(expected[1]["buffers"], got[1]["buffers"], f"rank {rank} buffers")
    if precision == "fp16":
        assert got[0]["precision"]["scaler"]["scale"] > 0   # the dynamic scale was saved

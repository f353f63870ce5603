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
DETERMINISTIC = ["data.kind=synthetic", "data.train_samples=512", "data.val_samples=128",
                 "data.image_size=16", "data.workers=1", "optim.epochs=3", "optim.warmup_epochs=0.5",
                 "log.every_steps=1", "checkpoint.every_steps=null", "checkpoint.keep_last=10"]
TOTAL_STEPS = 24  # 512 samples / (32 x 2 ranks) = 8 steps per epoch, 3 epochs


def final_state(paths, rank: int):
    directory = paths.checkpoints / layout.step_dir_name(TOTAL_STEPS)
    replicated = torch.load(directory / layout.REPLICATED, weights_only=True)
    own = torch.load(directory / layout.rank_file_name(rank), weights_only=True)
    return replicated, own


# Both checkpoint writers: async (the default: host snapshot, background write) and sync.
@pytest.mark.parametrize("precision, write", [("fp32", "async"), ("fp16", "sync")])
def test_twice_interrupted_run_matches_uninterrupted(precision, write, tmp_path):
    overrides = [*DETERMINISTIC, f"precision.mode={precision}", f"checkpoint.write={write}"]
    straight = local_run(tmp_path, *overrides, name="straight")
    assert drive(straight) == 0

    stopped = local_run(tmp_path, *overrides, name="stopped")
    # Ranks agree on a stop every 5 steps: these stop at 10 and 20, both in mid-epoch.
    assert drive(stopped, signal_at_step=7, signum=signal.SIGUSR2) == STOP_EXIT
    assert drive(stopped, signal_at_step=17, signum=signal.SIGTERM) == STOP_EXIT
    assert drive(stopped) == 0

    assert {e["mode"] for e in events(stopped, "checkpoint_saved")} == {write}
    stops = events(stopped, "stop_saved")
    # The driver passes both on as USR2 (mpirun would abort on TERM); it records what it got.
    assert [e["reason"] for e in stops] == ["SIGUSR2", "SIGUSR2"]
    assert [e["reason"] for e in events(stopped, "stop_requested")] == ["SIGUSR2", "SIGTERM"]
    assert stops[0]["step"] % 8 != 0 and stops[1]["step"] % 8 != 0     # both mid-epoch
    assert [e["step"] for e in events(stopped, "resumed")] == [e["step"] for e in stops]
    for rank in (0, 1):
        expected, got = final_state(straight, rank), final_state(stopped, rank)
        assert_identical(expected[0]["model"], got[0]["model"], "model")
        assert_identical(expected[0]["optimizer"], got[0]["optimizer"], "optimizer")
        assert_identical(expected[0]["precision"], got[0]["precision"], "precision")
        assert_identical(expected[1]["buffers"], got[1]["buffers"], f"rank {rank} buffers")
    if precision == "fp16":
        assert got[0]["precision"]["scaler"]["scale"] > 0   # the dynamic scale was saved

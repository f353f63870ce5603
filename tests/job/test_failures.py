"""A rank that raises: the run ends failed (not requeued), names that rank, and does not hang.
A kill during a checkpoint save leaves the previous checkpoint loadable."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import threading

import pytest

from hpc_train.checkpoint import layout
from hpc_train.checkpoint.manager import CheckpointManager
from hpc_train.runtime.heartbeat import Phase
from tests.conftest import REPO
from tests.runs import (await_beat, describe_failure, drive, events, heartbeat_step, known_beat, local_run,
                        logged_step, wait_for)

SMALL = ["data.kind=synthetic", "data.train_samples=1024", "data.val_samples=0", "data.image_size=16",
         "data.workers=1", "log.every_steps=1", "launch.restarts_in_job=0"]   # failures end the run


@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["horovod", "ddp"])
def test_raising_rank_fails_the_run_named_and_bounded(backend, tmp_path):
    paths = local_run(tmp_path, *SMALL, f"parallel.backend={backend}",
                      "launch.env={OMP_NUM_THREADS: '1', HPC_TRAIN_FAULT: 'raise:1:5'}")
    assert drive(paths) == 1
    failed = events(paths, "rank_failed")
    # The first failure is the cause; others may follow it (Horovod shuts down on every rank).
    assert failed[0]["rank"] == 1
    assert "injected failure on rank 1 at step 5" in failed[0]["error"]
    assert "InjectedFault" in failed[0]["traceback"]
    # Torn down by that failure, not hung in a collective until the watchdog found the others
    # silent (launch.stall_seconds): the run ended as failed ranks, and no stall is on record.
    finished = events(paths, "finished")[-1]
    assert finished["status"] == "failed" and finished["reason"].startswith("ranks failed"), finished
    assert not events(paths, "ranks_stalled")
    assert not events(paths, "requeued")


# Saves a complete checkpoint, then another that it holds at its n-th fsync or rename (argv: the
# checkpoint directory and n), saying where, and waits there to be SIGKILLed; "done" once the
# second save had no n-th one left. Each run goes on from what the kill before it left.
_SAVER = """
import os, signal, sys
import torch
from hpc_train.checkpoint.manager import CheckpointManager
root, hold_at = sys.argv[1], int(sys.argv[2])
manager = CheckpointManager(root, 0, 1, lambda: None, keep_last=2)
step = (manager.latest() or 0) + 1

def held(name, real, where):
    def call(*args):
        if calls is not None:
            calls.append(name)
            if len(calls) - 1 == hold_at:
                print(step + 1, name, where(*args), flush=True)
                signal.pause()
        return real(*args)
    return call

os.fsync = held("fsync", os.fsync, lambda fd: os.readlink(f"/proc/self/fd/{fd}"))
os.replace = held("rename", os.replace, lambda source, target: f"{source} -> {target}")

def save(step):
    manager.save(step, {"w": torch.full((1_000_000,), float(step))}, {"r": step}, {})

calls = None                    # not counted: the previous checkpoint, whole
save(step)
calls = []
save(step + 1)
print("done", flush=True)
signal.pause()
"""


def _held_saver(root, hold_at: int) -> str:
    """Where the saver holds its second save ("STEP fsync|rename PATH"), or "done"; it is
    SIGKILLed there. Its reply comes within 120 s, or it is killed unheard (a hang)."""
    saver = subprocess.Popen([sys.executable, "-c", _SAVER, str(root), str(hold_at)], cwd=REPO,
                             stdout=subprocess.PIPE, text=True)
    unheard = threading.Timer(120, saver.kill)
    unheard.start()
    try:
        return saver.stdout.readline().strip()
    finally:
        unheard.cancel()
        saver.kill()
        saver.wait(timeout=60)


@pytest.mark.slow
def test_sigkill_at_every_point_of_a_save_never_leaves_an_unloadable_latest(tmp_path):
    """The save is SIGKILLed at each of its fsyncs and renames in turn (the points where what is
    on disk changes state), each time after a complete save: before its marker, it leaves its
    temporary directory, never counted, and the previous checkpoint is the latest and loads;
    from the marker on, it is the latest and loads."""
    root = tmp_path / "ckpt"
    before_marker, after_marker = [], []
    for hold_at in itertools.count():
        where = _held_saver(root, hold_at)
        assert where, f"the saver ended or hung before its point {hold_at}"
        if where == "done":
            break
        step = int(where.split()[0])
        manager = CheckpointManager(root, 0, 1, lambda: None)
        latest = manager.latest()
        replicated, own, meta = manager.load()
        assert float(replicated["w"][0]) == latest and own == {"r": latest} and meta["step"] == latest
        if (root / layout.step_dir_name(step) / layout.MARKER).is_file():
            assert latest == step, where
            after_marker.append(where)
        else:
            # The kill landed inside the save: its part is on disk, unfinished, and not counted.
            assert latest == step - 1, where
            assert (root / layout.tmp_dir_name(step)).is_dir(), (where, sorted(os.listdir(root)))
            before_marker.append(where)
        # Whatever the kill left (a temporary directory, a step without its marker) is ignored.
        leftovers = [p.name for p in root.iterdir() if not (p / layout.MARKER).is_file()]
        assert all(name.startswith(".step-") or name.startswith("step-") for name in leftovers)
    # The walk held the files' and the directory's renames (before the marker) and the marker's
    # fsync (after it), among the rest.
    assert any(".partial ->" in where for where in before_marker), before_marker
    assert any(".tmp ->" in where for where in before_marker), before_marker
    assert any(where.endswith(layout.MARKER) for where in after_marker), after_marker


@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.slow
def test_run_killed_while_saving_resumes_from_the_previous_checkpoint(tmp_path):
    """Rank 0 is SIGKILLed while its save of step 8 is in flight: rank 0's background write is
    held (HPC_TRAIN_FAULT slow_write, in this start only) between its own file and the shared
    state, so the kill lands after the temporary directory is made and before the checkpoint can
    be complete. The next run, without the fault, resumes from step 4 and finishes (step 12)."""
    # 12 steps: the save of 8 cut, the resume from 4 to the end (two epochs of 32 before).
    paths = local_run(tmp_path, *SMALL, "model.name=resnet18", "optim.epochs=2", "optim.max_steps=12",
                      "checkpoint.every_steps=4", "checkpoint.keep_last=5", "launch.env={OMP_NUM_THREADS: '1'}")
    environ = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "SUBMITIT_"))}
    paths.submitit.mkdir(parents=True, exist_ok=True)
    with open(paths.submitit / "local_0_log.err", "ab") as output:
        driver = subprocess.Popen([sys.executable, "-m", "hpc_train.job.driver", str(paths.root)], cwd=REPO,
                                  env={**environ, "HPC_TRAIN_FAULT": "slow_write:0:8:240"},
                                  stdout=output, stderr=subprocess.STDOUT)
    saving = paths.checkpoints / layout.tmp_dir_name(8)
    try:
        wait_for(lambda: driver.poll() is not None or saving.is_dir(), 240, f"{saving} to be made")
        assert driver.poll() is None, f"the run ended before its save of step 8\n{describe_failure(paths)}"
        os.kill(await_beat(paths, 0)["pid"], signal.SIGKILL)   # rank 0 writes the shared state
    finally:
        try:
            driver.wait(timeout=240)     # mpirun ends rank 1 once rank 0 is gone
        except subprocess.TimeoutExpired:
            driver.kill()
            raise
    # The kill landed inside the save: its temporary directory is left without the shared state
    # rank 0 writes last, step 8 never became a checkpoint, and step 4 is the latest.
    assert saving.is_dir() and not (saving / layout.REPLICATED).exists(), sorted(os.listdir(saving))
    assert not (paths.checkpoints / layout.step_dir_name(8)).exists()
    assert layout.list_complete(paths.checkpoints) == [4]
    assert drive(paths) == 0, describe_failure(paths)    # the next run resumes and finishes
    assert events(paths, "resumed")[0]["from_checkpoint"] == 4
    assert heartbeat_step(paths) == 12
    assert not list(paths.checkpoints.glob(".step-*.tmp"))   # the cut save's part cleared away


@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.slow
def test_a_stop_the_ranks_do_not_obey_is_a_stall_named_and_bounded(tmp_path):
    """Rank 1 sleeps 120 s inside step 12; the driver's USR2, sent once rank 0 waits for it in
    step 12's logging collective (rank 1 is then past its step's gradients, in or on its way to
    the sleep), cannot be agreed on. After the grace period (signal_seconds - 15, at least 15 s)
    the driver names rank 1 and tears the ranks down, long before the sleep ends. (A USR2 sent
    at an earlier step was agreed on before rank 1 slept when steps were slow: a clean stop.)"""
    paths = local_run(tmp_path, *SMALL, "slurm.signal_seconds=25",
                      "launch.env.HPC_TRAIN_FAULT=sleep:1:12:120")

    def rank_0_waits_in_step_12() -> bool:
        beat = known_beat(paths, 0)
        return beat is not None and beat["step"] == 12 and beat["phase"] == Phase.SYNC

    assert drive(paths, signum=signal.SIGUSR2, signal_when=rank_0_waits_in_step_12) == 1
    # Torn down while rank 1 still slept: no step after its 12th was trained (rank 0 waits for
    # it in step 13's all-reduce) and the stop was never saved, as both would be once it woke.
    assert logged_step(paths) <= 12 and not events(paths, "stop_saved")
    stalled = events(paths, "ranks_stalled")
    assert len(stalled) == 1 and "did not stop within 15 s" in stalled[0]["why"]
    assert [r["rank"] for r in stalled[0]["ranks"]] == [1], stalled
    finished = events(paths, "finished")[-1]
    assert finished["status"] == "failed" and finished["reason"].startswith("stall:")

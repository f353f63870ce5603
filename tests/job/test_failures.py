"""A rank that raises: the run ends failed (not requeued), names that rank, and does not hang.
A kill during a checkpoint save leaves the previous checkpoint loadable."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from hpc_train.checkpoint import layout
from hpc_train.checkpoint.manager import CheckpointManager
from tests.conftest import REPO
from tests.runs import drive, events, heartbeat_step, known_beat, local_run

SMALL = ["data.kind=synthetic", "data.train_samples=1024", "data.val_samples=0", "data.image_size=16",
         "data.workers=1", "log.every_steps=1", "launch.restarts_in_job=0"]   # failures end the run


@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.slow
@pytest.mark.parametrize("backend", ["horovod", "ddp"])
def test_raising_rank_fails_the_run_named_and_bounded(backend, tmp_path):
    paths = local_run(tmp_path, *SMALL, f"parallel.backend={backend}",
                      "launch.env={OMP_NUM_THREADS: '1', HPC_TRAIN_FAULT: 'raise:1:5'}")
    started = time.monotonic()
    assert drive(paths, timeout=180) == 1
    assert time.monotonic() - started < 120             # torn down, not hung in a collective
    failed = events(paths, "rank_failed")
    # The first failure is the cause; others may follow it (Horovod shuts down on every rank).
    assert failed[0]["rank"] == 1
    assert "injected failure on rank 1 at step 5" in failed[0]["error"]
    assert "InjectedFault" in failed[0]["traceback"]
    assert events(paths, "finished")[-1]["status"] == "failed"
    assert not events(paths, "requeued")


def _saver_script(root) -> str:
    # Saves ever larger states in a loop; the test SIGKILLs it at random moments.
    return f"""
import torch
from hpc_train.checkpoint.manager import CheckpointManager
from hpc_train.runtime.heartbeat import read_beats
m = CheckpointManager({str(root)!r}, 0, 1, lambda: None, keep_last=2)
step = m.latest() or 0
while True:
    step += 1
    m.save(step, {{"w": torch.full((4_000_000,), float(step))}}, {{"r": step}}, {{}})
    print(step, flush=True)
"""


@pytest.mark.slow
def test_sigkill_during_saves_never_leaves_an_unloadable_latest(tmp_path):
    root = tmp_path / "ckpt"
    script = _saver_script(root)
    for attempt in range(8):
        saver = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
        saver.stdout.readline()                        # at least one save of this round finished
        time.sleep(0.05 + 0.037 * attempt)             # then kill somewhere inside a later save
        os.kill(saver.pid, signal.SIGKILL)
        saver.wait()
        manager = CheckpointManager(root, 0, 1, lambda: None)
        latest = manager.latest()
        replicated, own, meta = manager.load()
        assert float(replicated["w"][0]) == latest and own == {"r": latest} and meta["step"] == latest
        # Whatever the kill left (a temporary directory, a step without its marker) is ignored.
        leftovers = [p.name for p in root.iterdir() if not (p / layout.MARKER).is_file()]
        assert all(name.startswith(".step-") or name.startswith("step-") for name in leftovers)


@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.slow
def test_run_killed_while_saving_resumes_from_the_previous_checkpoint(tmp_path):
    paths = local_run(tmp_path, *SMALL, "model.name=resnet18", "optim.epochs=2",
                      "checkpoint.every_steps=4", "checkpoint.keep_last=5", "launch.env={OMP_NUM_THREADS: '1'}")
    driver = subprocess.Popen([sys.executable, "-m", "hpc_train.job.driver", str(paths.root)], cwd=REPO,
                              env={k: v for k, v in os.environ.items() if not k.startswith("SLURM_")},
                              stderr=subprocess.DEVNULL)
    killed_during = None
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and driver.poll() is None and killed_during is None:
        saving = [p for p in paths.checkpoints.glob(".step-*.tmp")]
        # The node's file gains a rank that started after its first write within an interval.
        if saving and layout.list_complete(paths.checkpoints) and (beat := known_beat(paths, 0)):
            os.kill(beat["pid"], signal.SIGKILL)       # rank 0 is the one writing the shared state
            killed_during = saving[0].name
        time.sleep(0.002)
    driver.wait(timeout=120)
    assert killed_during, "never caught a save in progress"
    before = layout.latest_complete(paths.checkpoints)
    assert f"step-{before:08d}" not in killed_during   # the interrupted save did not count
    assert drive(paths) == 0                            # the next run resumes and finishes
    assert events(paths, "resumed")[0]["from_checkpoint"] == before
    assert heartbeat_step(paths) == 32


@pytest.mark.mpi
@pytest.mark.horovod
@pytest.mark.slow
def test_a_stop_the_ranks_do_not_obey_is_a_stall_named_and_bounded(tmp_path):
    """Rank 1 sleeps 120 s inside step 12; the driver's USR2 at step 10 cannot be agreed on
    (the others wait for rank 1 in a collective). After the grace period (signal_seconds - 15,
    at least 15 s) the driver names rank 1 and tears the ranks down, long before the sleep ends."""
    paths = local_run(tmp_path, *SMALL, "slurm.signal_seconds=25",
                      "launch.env.HPC_TRAIN_FAULT=sleep:1:12:120")
    started = time.monotonic()
    assert drive(paths, signal_at_step=10, signum=signal.SIGUSR2, timeout=180) == 1
    assert time.monotonic() - started < 90
    stalled = events(paths, "ranks_stalled")
    assert len(stalled) == 1 and "did not stop within 15 s" in stalled[0]["why"]
    assert [r["rank"] for r in stalled[0]["ranks"]] == [1], stalled
    finished = events(paths, "finished")[-1]
    assert finished["status"] == "failed" and finished["reason"].startswith("stall:")

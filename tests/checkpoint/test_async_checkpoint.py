"""Asynchronous checkpoints: the host snapshot, the one-at-a-time background writer, the fork
guard, and the save protocol without collectives (rank 0 waits for the other ranks' files)."""

from __future__ import annotations

import os
import threading
import time
from collections import OrderedDict
from types import SimpleNamespace

import pytest
import torch

from hpc_train.checkpoint import layout, manager
from hpc_train.checkpoint.manager import CheckpointManager
from hpc_train.checkpoint.snapshot import HostSnapshot
from hpc_train.checkpoint.writer import BackgroundWriter, guard_forks
from hpc_train.errors import CheckpointError
from tests.runs import assert_identical, wait_for


def _state():
    model = torch.nn.Linear(4, 3)
    return {"model": model.state_dict(), "optimizer": {"state": {0: {"momentum": torch.ones(3, 4)}},
                                                       "param_groups": [{"lr": 0.1, "params": [0, 1]}]},
            "rng": {"python": (3, (1, 2, 3), None), "torch": torch.get_rng_state()}, "step": 7}, model


def test_snapshot_is_equal_and_independent_of_the_live_state():
    state, model = _state()
    snapshot = HostSnapshot()
    copy = snapshot.take(state)
    assert_identical(state, copy)
    assert isinstance(copy["model"], OrderedDict) and copy["rng"]["python"] == (3, (1, 2, 3), None)
    with torch.no_grad():                        # training goes on: the live tensors change
        model.weight.add_(1.0)
        state["optimizer"]["state"][0]["momentum"].mul_(5)
    state["optimizer"]["param_groups"][0]["lr"] = 0.5
    assert not torch.equal(copy["model"]["weight"], model.weight)
    assert torch.equal(copy["optimizer"]["state"][0]["momentum"], torch.ones(3, 4))
    assert copy["optimizer"]["param_groups"][0]["lr"] == 0.1


def test_snapshot_reuses_its_buffers():
    state, model = _state()
    snapshot = HostSnapshot()
    first = snapshot.take(state)["model"]["weight"]
    with torch.no_grad():
        model.weight.add_(1.0)
    second = snapshot.take({"model": model.state_dict()})["model"]["weight"]
    assert second is first and torch.equal(second, model.weight)     # copied into, not allocated


def test_writer_runs_in_the_background_one_write_at_a_time():
    writer, order, release = BackgroundWriter(timeout=10), [], threading.Event()

    def slow():
        release.wait(5)
        order.append("first")

    writer.submit(slow)
    assert writer.busy                           # submit returned while the write waits
    threading.Timer(0.3, release.set).start()
    writer.submit(lambda: order.append("second"))    # waits for the first one
    writer.wait()
    assert order == ["first", "second"] and not writer.busy


def test_writer_wait_is_bounded_and_errors_reach_the_training_thread():
    writer, release = BackgroundWriter(timeout=0.2), threading.Event()
    writer.submit(lambda: release.wait(60))      # held until released: past the writer's bound
    with pytest.raises(CheckpointError, match="still running after 0 s"):
        writer.wait()
    release.set()
    writer.wait(60)

    def full_disk():
        raise OSError(28, "No space left on device")

    writer.submit(full_disk)
    wait_for(lambda: not writer.busy, 60, "the failing write to end")
    with pytest.raises(OSError, match="No space left"):
        writer.raise_if_failed()
    writer.raise_if_failed()                     # raised once


def test_a_fork_waits_for_the_pending_write():
    writer, done = BackgroundWriter(timeout=10), []
    guard_forks(writer)
    writer.submit(lambda: (time.sleep(0.5), done.append(True)))
    pid = os.fork()
    if pid == 0:                                 # the child: exit at once, whatever happened
        os._exit(0 if done else 1)
    assert done, "fork() returned before the write finished"
    assert os.waitpid(pid, 0)[1] == 0


def _manager(root, rank, world=2):
    return CheckpointManager(root, rank, world, barrier=lambda: None, keep_last=2)


def test_background_protocol_rank0_waits_for_every_rank_file(tmp_path, monkeypatch):
    """Rank 1 writes its file only once rank 0 polls for it and pauses (its first pause between
    two looks at the directory): rank 0 finishes the step after that, never before."""
    ranks = [_manager(tmp_path, r) for r in range(2)]
    for step in (10, 20):
        ranks[0].prepare(step)
        seen_while_waiting = []

        def rank1_writes_now(_seconds, step=step):
            if not seen_while_waiting:           # rank 0 found rank 1's file missing
                seen_while_waiting.append(ranks[0].complete_steps())
                ranks[1].write(step, {}, {"rank": 1}, {}, peers_done=lambda: None)

        monkeypatch.setattr(manager, "time", SimpleNamespace(time=time.time, monotonic=time.monotonic,
                                                             sleep=rank1_writes_now))
        ranks[0].write(step, {"w": torch.full((2,), float(step))}, {"rank": 0}, {"spec_hash": "x"},
                       peers_done=lambda s=step: ranks[0].wait_for_rank_files(s, timeout=60))
        # Rank 0 waited (paused) with the step not yet complete, and completed it once rank 1's
        # file was there.
        assert seen_while_waiting and step not in seen_while_waiting[0]
        assert step in ranks[0].complete_steps()
    assert ranks[0].complete_steps() == [10, 20]
    replicated, own, meta = ranks[1].load()
    assert replicated["w"].tolist() == [20.0, 20.0] and own == {"rank": 1} and meta["step"] == 20
    assert not list(tmp_path.glob("**/*.partial"))


def test_a_rank_that_never_writes_leaves_the_previous_checkpoint(tmp_path):
    ranks = [_manager(tmp_path, r) for r in range(2)]
    ranks[0].prepare(10)
    ranks[1].write(10, {}, {"rank": 1}, {}, peers_done=lambda: None)
    ranks[0].write(10, {"w": torch.ones(1)}, {"rank": 0}, {},
                   peers_done=lambda: ranks[0].wait_for_rank_files(10, timeout=5))
    ranks[0].prepare(20)                         # rank 1 is killed before it writes step 20
    with pytest.raises(CheckpointError, match=r"rank-00001\.pt: those ranks did not finish"):
        ranks[0].write(20, {"w": torch.zeros(1)}, {"rank": 0}, {},
                       peers_done=lambda: ranks[0].wait_for_rank_files(20, timeout=0.3))
    assert ranks[0].latest() == 10 and ranks[0].load()[0]["w"].tolist() == [1.0]
    assert not (tmp_path / layout.step_dir_name(20)).exists()

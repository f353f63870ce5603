"""A rank's data workers: forked from the forkserver (not from the MPI rank), and asked for their
stacks when the rank's heartbeat finds it stuck (a rank waiting for a batch is stuck where its
worker is)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from torch.utils.data import DataLoader, Dataset

from hpc_train.job.watchdog import process_state
from hpc_train.spec import load_spec
from hpc_train.train.data import (build_loaders, dump_worker_stacks, init_worker, shutdown_workers,
                                  start_worker_server, worker_pids)
from tests.conftest import REPO
from tests.runs import wait_for


def _spec(*overrides: str):
    return load_spec(REPO / "jobs/smoke.yaml", ["data.kind=synthetic", "data.train_samples=64",
                                                "data.val_samples=16", *overrides])


def _parent_of(pid: int) -> int:
    with open(f"/proc/{pid}/stat") as stat:
        return int(stat.read().rsplit(")", 1)[1].split()[1])


def test_the_default_workers_fork_from_the_server_not_from_the_rank():
    spec = _spec()
    assert spec.data.start_method == "forkserver" and spec.data.workers == 2
    start_worker_server(spec)
    train, val = build_loaders(spec, 0, 1, pin=False)
    try:
        assert next(iter(train))[0].shape[0] == spec.data.batch_size
        next(iter(val))
        pids = worker_pids(train, val)
        assert len(pids) == 4
        parents = {_parent_of(pid) for pid in pids}
        assert os.getpid() not in parents and len(parents) == 1      # one server for both
    finally:
        shutdown_workers(train)
        shutdown_workers(val)


_HOLDER = """
import sys
from hpc_train.runtime.stop import StopFlag
from hpc_train.job.watchdog import process_state
from hpc_train.spec import load_spec
from hpc_train.train.data import build_loaders, start_worker_server, worker_pids
stop = StopFlag()                      # a rank's handlers: the stop signals are noted, not fatal
spec = load_spec("jobs/smoke.yaml", ["data.kind=synthetic", "data.train_samples=64", "data.val_samples=16"])
start_worker_server(spec)
train, val = build_loaders(spec, 0, 1, pin=False)
next(iter(train))
print(" ".join(map(str, worker_pids(train))), flush=True)
sys.stdin.readline()
print(len(list(train)), stop.signalled, flush=True)
sys.stdin.readline()
"""


def _children(pid: int) -> list[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as children:
        return [int(child) for child in children.read().split()]


@pytest.mark.slow
def test_the_rank_s_helpers_outlive_stop_signals_and_not_the_rank():
    holder = subprocess.Popen([sys.executable, "-c", _HOLDER], cwd=REPO, text=True,
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    try:
        workers = [int(pid) for pid in holder.stdout.readline().split()]
        assert len(workers) == 2
        server = _parent_of(workers[0])
        helpers = _children(holder.pid)       # the server and multiprocessing's resource tracker
        assert server in helpers and len(helpers) == 2
        # Slurm signals every process of the job: USR2 before the time limit, TERM on preemption.
        for pid in (*helpers, *workers):
            for sig in (signal.SIGUSR2, signal.SIGTERM):
                os.kill(pid, sig)
        os.kill(holder.pid, signal.SIGUSR2)
        holder.stdin.write("\n")
        holder.stdin.flush()
        assert holder.stdout.readline().split() == ["2", "SIGUSR2"]   # a whole epoch, still served
        assert all(_running(pid) for pid in (*helpers, *workers))
    finally:
        # A forkserver worker holds the server's liveness pipe and watches the server, not the
        # rank: without parent_death.py both would live on after a SIGKILL of the rank.
        holder.kill()
        holder.wait(timeout=30)
    deadline = time.monotonic() + 20
    while (left := [pid for pid in (*helpers, *workers) if _running(pid)]) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not left, f"left running after the rank was killed: {left}"


def _running(pid: int) -> bool:
    state = process_state(pid)            # None: gone; a zombie has ended too
    return state is not None and not state.startswith("Z")


class _StuckDataset(Dataset):
    def __init__(self, entered):
        self.entered = entered

    def __len__(self):
        return 8

    def __getitem__(self, index):
        stuck_reading_a_sample(self.entered)
        return index


def stuck_reading_a_sample(entered):
    # Stuck until the test kills this worker (or, should the test end first, this process is
    # handed to another parent): never done by itself while the test looks at it. `entered` is
    # touched in here, so that a stack dumped once it exists has this frame in it.
    entered.touch()
    parent = os.getppid()
    while os.getppid() == parent:
        time.sleep(0.5)


@pytest.mark.slow
def test_a_stuck_worker_writes_its_stack_when_asked(tmp_path, monkeypatch):
    # fork: the worker's sys.stderr, which init_worker hands faulthandler, is this process's,
    # here a file in append mode. (Not capfd: its read truncates the capture file, and a dump
    # written between that read and the truncation was lost, so the wait timed out.)
    entered, stderr = tmp_path / "entered", tmp_path / "stderr"
    monkeypatch.setattr(sys, "stderr", open(stderr, "a", buffering=1))
    loader = DataLoader(_StuckDataset(entered), batch_size=2, num_workers=1, worker_init_fn=init_worker,
                        multiprocessing_context="fork", persistent_workers=True)
    raised: list[str] = []

    def fetch_one():
        try:
            next(iter(loader))
        except RuntimeError as error:    # the kill below
            raised.append(str(error))

    fetch = threading.Thread(target=fetch_one, daemon=True)
    fetch.start()
    pids: list[int] = []
    try:
        wait_for(entered.exists, 60, "the worker to read a sample")   # past init_worker
        pids = worker_pids(loader)
        assert len(pids) == 1
        dump_worker_stacks(pids)

        def stacks_written() -> str:
            text = stderr.read_text()
            return text if "stuck_reading_a_sample" in text and "__getitem__" in text else ""

        wait_for(stacks_written, 300, "the worker's stacks on stderr")   # catches a hang only
        os.kill(pids[0], 0)              # it wrote its stacks and goes on
    finally:
        for pid in pids:
            os.kill(pid, signal.SIGKILL)
        fetch.join(timeout=60)           # the loader sees its worker gone and raises there
    assert not fetch.is_alive() and len(raised) == 1 and "exited unexpectedly" in raised[0], raised
    dump_worker_stacks(pids)             # a worker that is gone: nothing to do, no error

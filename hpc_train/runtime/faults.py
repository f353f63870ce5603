"""Fault injection for tests of failure handling: make one rank raise or stall at a step.

Set HPC_TRAIN_FAULT in the ranks' environment (e.g. through launch.env of a test spec):
    raise:RANK:STEP            rank RANK raises RuntimeError after finishing step STEP
    sleep:RANK:STEP:SECONDS    rank RANK sleeps SECONDS inside step STEP (a stalled rank)
    slow:RANK:STEP:FACTOR      rank RANK runs FACTOR times slower from step STEP on (a straggler):
                               after each step it sleeps FACTOR-1 times its own time since the
                               last one (the slowest rank waits for nobody, so that is its work)
    slow_write:RANK:STEP:SECONDS  rank RANK's background write of the checkpoint of step STEP
                               sleeps SECONDS after its own files and before the marker (rank
                               0: before it finishes the checkpoint), while training goes on
    kill_in_save:RANK:STEP     rank RANK sends itself SIGKILL in the middle of writing its part of
                               the sharded checkpoint of step STEP: after its first files (DCP:
                               its data file, before the .metadata; DeepSpeed: its first state
                               file), before its part is complete and durable
    oom:RANK:STEP              rank RANK asks torch's allocator for 2**50 bytes: the real
                               out-of-memory error ("can't allocate memory") is raised
    exit:RANK:STEP             rank RANK ends at once with os._exit(1): no traceback, no event
    kill:RANK:STEP             rank RANK sends itself SIGKILL, as the kernel's OOM killer does
    segv:RANK:STEP             rank RANK reads address 0 through ctypes: a real segfault
    pace:SECONDS               every rank sleeps SECONDS in every step: a run whose length is set
                               by the test, not by the CPU (a time-limit test then needs the same
                               number of segments on a slow machine as on a fast one)
    freeze:RANK:STEP           rank RANK sends itself SIGSTOP at every step from STEP on (once
                               continued, it freezes again): a rank that hangs on every run, with
                               every thread stopped, heartbeat included, as on a hung node
                               (exit, kill and segv are how a hard exit, an OOM kill and a crash
                               in native code look to the peers and to mpirun)
Set HPC_TRAIN_FAULT_EVENTS (to anything) in a process, and every event it writes fails with an
OSError, as on a full disk (events.record): decisions must not depend on the event log.
Unset (always, outside tests) they do nothing. They never read files or run anything.
"""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass

FAULT_ENV = "HPC_TRAIN_FAULT"
EVENTS_FAULT_ENV = "HPC_TRAIN_FAULT_EVENTS"


# Faults of a checkpoint's write, not of a step: `at_step` leaves them to the writers' hooks.
WRITE_FAULTS = ("slow_write", "kill_in_save")


class InjectedFault(RuntimeError):
    pass


@dataclass(frozen=True)
class Fault:
    kind: str
    rank: int
    step: int
    seconds: float = 0.0
    factor: float = 1.0


FORMS = ("raise|oom|exit|kill|segv|freeze|kill_in_save:RANK:STEP, sleep|slow_write:RANK:STEP:SECONDS, "
         "slow:RANK:STEP:FACTOR (FACTOR >= 1) or pace:SECONDS")


def parse_fault(text: str | None) -> Fault | None:
    if not text:
        return None
    try:
        fault = _fault_of(text.split(":"))
    except ValueError:          # a number that is not one
        fault = None
    if fault is None:
        raise ValueError(f"{FAULT_ENV}={text!r}: expected {FORMS}")
    return fault


def _fault_of(parts: list[str]) -> Fault | None:
    if parts[0] in ("raise", "oom", "exit", "kill", "segv", "freeze", "kill_in_save") and len(parts) == 3:
        return Fault(parts[0], int(parts[1]), int(parts[2]))
    if parts[0] in ("sleep", "slow_write") and len(parts) == 4:
        return Fault(parts[0], int(parts[1]), int(parts[2]), float(parts[3]))
    if parts[0] == "slow" and len(parts) == 4 and float(parts[3]) >= 1:
        return Fault("slow", int(parts[1]), int(parts[2]), factor=float(parts[3]))
    if parts[0] == "pace" and len(parts) == 2 and float(parts[1]) >= 0:
        return Fault("pace", rank=-1, step=0, seconds=float(parts[1]))
    return None


class FaultInjector:
    def __init__(self, rank: int, environ=os.environ):
        self.rank = rank
        self.fault = parse_fault(environ.get(FAULT_ENV))
        self.last_step_end: float | None = None    # slow: when this rank's previous step ended

    def during_write(self, step: int) -> None:
        """Called by the checkpoint writer between this rank's files and the marker."""
        fault = self.fault
        if fault is not None and fault.kind == "slow_write" and (fault.rank, fault.step) == (self.rank, step):
            time.sleep(fault.seconds)

    def in_sharded_save(self, step: int) -> None:
        """Called by a sharded save each time this rank has written a file of its part of the
        checkpoint of `step`, before the part is complete."""
        fault = self.fault
        if fault is not None and fault.kind == "kill_in_save" and (fault.rank, fault.step) == (self.rank, step):
            os.kill(os.getpid(), signal.SIGKILL)

    def _slow_down(self, step: int, fault: Fault) -> None:
        now = time.perf_counter()
        if step >= fault.step and self.last_step_end is not None:
            time.sleep((fault.factor - 1) * (now - self.last_step_end))
        self.last_step_end = time.perf_counter()

    def at_step(self, step: int) -> None:
        fault = self.fault
        if fault is not None and fault.kind == "pace":     # every rank, every step
            time.sleep(fault.seconds)
            return
        if fault is None or fault.rank != self.rank or fault.kind in WRITE_FAULTS:
            return
        if fault.kind == "freeze" and step >= fault.step:
            os.kill(os.getpid(), signal.SIGSTOP)
            return
        if fault.kind == "slow":
            self._slow_down(step, fault)
            return
        if fault.step != step:
            return
        if fault.kind == "sleep":
            time.sleep(fault.seconds)
        elif fault.kind == "oom":
            import torch

            torch.empty(2**50, dtype=torch.uint8)       # 1 PiB: no host has it
        elif fault.kind == "exit":
            os._exit(1)
        elif fault.kind == "kill":
            os.kill(os.getpid(), signal.SIGKILL)
        elif fault.kind == "segv":
            import ctypes

            ctypes.string_at(0)
        else:
            raise InjectedFault(f"injected failure on rank {self.rank} at step {step} ({FAULT_ENV})")

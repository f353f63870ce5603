"""Processes that must not outlive their parent: the data workers' forkserver and its workers.

A forkserver worker holds the server's liveness pipe open (the server exits when the last holder
closes it), and torch's worker watchdog compares getppid() with the server's pid, not the rank's.
When a rank is killed (SIGKILL by the driver's watchdog, by Slurm, by the OOM killer) the server
and its workers would keep each other alive for ever, holding memory and shard files beside the
next start of the ranks. Linux's PR_SET_PDEATHSIG has the kernel SIGKILL a process when the
thread that started it ends: the rank's main thread for the server (train/data.py starts it
there), the server's for each worker.
"""

from __future__ import annotations

import ctypes
import os
import signal

# The pid of the process the forkserver serves (the rank): set by train/data.py before it starts
# the server, read by the server (forkserver_preload.py) and its workers.
PARENT_ENV = "HPC_TRAIN_WORKER_PARENT"
_PR_SET_PDEATHSIG = 1


def die_with_parent(served: int | None = None) -> bool:
    """Have the kernel SIGKILL this process when its parent ends; exit now if `served` (the
    pid of the rank this process works for) is already gone. False where prctl is missing."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
            return False
    except (OSError, AttributeError):
        return False              # not Linux: torch's own worker watchdog is all there is
    if served is not None and not _alive(served):
        os._exit(1)               # it ended before the binding: nobody is left to serve
    return True


def served_pid(environ=os.environ) -> int | None:
    value = environ.get(PARENT_ENV, "")
    return int(value) if value.isdigit() else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:       # alive, another user's: not ours to signal
        pass
    return True

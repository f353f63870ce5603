"""When to stop: a signal (SIGUSR2 before the time limit, SIGTERM on preemption or requeue) or
the job's own deadline, which works even where signals through mpirun get lost.

Each rank only notes a local reason; the ranks agree on one stop step through one tiny
collective every `AGREE_EVERY` steps (a Horovod collective costs milliseconds on CPU, so not
every step), then all save at that same step and exit with STOP_EXIT.
"""

from __future__ import annotations

import os
import signal
import time

STOP_EXIT = 75  # EX_TEMPFAIL: "stopped on purpose, saved, resume me"
AGREE_EVERY = 5
DEADLINE_ENV = "HPC_TRAIN_DEADLINE"   # UNIX time by which the ranks must have saved
STALL_ENV = "HPC_TRAIN_STALL_SECONDS"  # launch.stall_seconds, for the ranks' heartbeat
START_ENV = "HPC_TRAIN_START_SECONDS"  # launch.start_seconds, likewise
NODES_ENV = "HPC_TRAIN_NODES"   # the nodes of this start, within slurm.nodes' range (job/worker.py)

# Larger code wins when ranks saw different reasons; 0 = keep going.
REASONS = {0: None, 1: "deadline", 2: "SIGUSR2", 3: "SIGTERM"}
_CODES = {reason: code for code, reason in REASONS.items()}
# Slurm sends them to every process of the job (preemption, scancel, the time limit's --signal).
STOP_SIGNALS = (signal.SIGUSR2, signal.SIGTERM)


def ignore_stop_signals() -> None:
    """For the rank's helper processes (its data workers and their forkserver): the rank decides
    when to stop. One killed by a stop signal would crash its rank before it saves; the rank
    shuts its helpers down itself, and Slurm's final SIGKILL still applies."""
    for sig in STOP_SIGNALS:
        signal.signal(sig, signal.SIG_IGN)


def should_agree(step: int) -> bool:
    return step % AGREE_EVERY == 0


class StopFlag:
    def __init__(self, deadline: float | None = None, clock=time.time, install_handlers: bool = True):
        self.deadline, self.clock = deadline, clock
        self.signalled: str | None = None
        if install_handlers:
            for sig in STOP_SIGNALS:
                signal.signal(sig, self._on_signal)

    @classmethod
    def from_env(cls, environ=os.environ) -> StopFlag:
        value = environ.get(DEADLINE_ENV)
        return cls(float(value) if value else None)

    def _on_signal(self, signum, _frame) -> None:
        name = signal.Signals(signum).name
        if self.signalled is None or _CODES[name] > _CODES[self.signalled]:
            self.signalled = name

    def local_code(self) -> int:
        """This rank's reason to stop, as a number the ranks can reduce with max (or sum)."""
        if self.signalled:
            return _CODES[self.signalled]
        if self.deadline is not None and self.clock() >= self.deadline:
            return _CODES["deadline"]
        return 0


def one_hot(code: int) -> list[float]:
    """A rank's code as a vector whose sum over ranks says which reasons anyone saw."""
    return [1.0 if i == code else 0.0 for i in range(len(REASONS))]


def agreed_reason(summed: list[float]) -> str | None:
    """The strongest reason any rank saw, from the summed one-hot vectors; None = go on."""
    for code in sorted(REASONS, reverse=True):
        if code and summed[code] > 0:
            return REASONS[code]
    return None

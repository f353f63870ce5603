"""The preemption sentinel: a one-task Slurm step that hears the start of a preemption's grace.

At the start of a preemption's grace (`PreemptMode=REQUEUE` or `CANCEL` with a partition's
`GraceTime`), Slurm sends SIGCONT and SIGTERM to the job's *steps* only; the batch step, where the
driver and the ranks `mpirun` starts from it live, hears nothing until the grace has ended, and is
then killed `KillWait` seconds after its own SIGTERM. Under `srun` the ranks are a step and hear it
themselves; under `mpirun` nothing of ours would. So the driver starts this program as a step of
its own (`srun --overlap`, one task, one CPU shared with the job's) and watches it: the line it
prints on SIGTERM is the grace's start, which the driver turns into the same agreed stop as the
time-limit signal, with the reason "preempted" (job/driver.py, job/supervise.py: `Sentinel`).

The step program imports nothing of ours beyond this file and nothing heavy: it costs a Python
start and a sleeping process.
"""

from __future__ import annotations

import logging
import signal
import subprocess
import sys
import threading
import time
from typing import Callable

log = logging.getLogger("hpc_train.driver")

HEARD = "hpc_train-sentinel: SIGTERM"      # the line the driver waits for
READY = "hpc_train-sentinel: ready"        # printed once the handler is in place
# A signal to the whole job (`scontrol requeue`, `scancel --signal=TERM --full`, the grace's end)
# reaches the steps and the batch step together: the driver then has its own SIGTERM within this
# long, and that is the stop's reason. Only a SIGTERM to the steps alone is a grace's start.
SETTLE_SECONDS = 2.0


def sentinel_argv(python: str, host: str | None) -> list[str]:
    """The step's command: one task on the batch host (`host`), overlapping the job's resources
    (the ranks hold them all), no memory of its own (`--mem=0`: the job's, shared)."""
    where = [f"--nodelist={host}"] if host else []
    return ["srun", "--overlap", "--nodes=1", "--ntasks=1", "--cpus-per-task=1", "--mem=0", *where,
            "--job-name=hpc_train-sentinel", "--kill-on-bad-exit=0", "--unbuffered",
            python, "-u", "-m", "hpc_train.job.sentinel"]


class Sentinel:
    """The driver's side: the step started, its output read in a thread; `on_heard` is called
    once when the step heard SIGTERM (unless `close` came first: then it is our own doing)."""

    def __init__(self, argv: list[str], on_heard: Callable[[], None], env=None):
        self.on_heard = on_heard
        self.closing = False
        self.ready = threading.Event()
        self.process = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                        stdin=subprocess.DEVNULL, text=True, errors="replace", env=env)
        self.thread = threading.Thread(target=self._read, name="sentinel", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.process.stdout:
            line = line.strip()
            if line == READY:
                self.ready.set()
            elif line == HEARD and not self.closing:
                time.sleep(SETTLE_SECONDS)
                if not self.closing:
                    log.info("the preemption sentinel heard SIGTERM: the job's steps were signalled")
                    self.on_heard()
            elif line:
                log.info("sentinel: %s", line)
        returncode = self.process.wait()
        if not self.closing and returncode != 0:
            log.warning("the preemption sentinel step ended (srun exit %d): a preemption's grace "
                        "is heard at its end only, when Slurm signals the batch step", returncode)

    def close(self, wait: float = 5.0) -> None:
        """End the step (srun passes our SIGTERM on to it: the line it prints is ignored now)."""
        self.closing = True
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(wait)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(wait)
        self.thread.join(wait)


def _heard(signum, _frame) -> None:
    print(HEARD, flush=True)
    sys.exit(0)


def main() -> int:
    signal.signal(signal.SIGTERM, _heard)
    # The time-limit signal (--signal=B:USR2) is the batch shell's; were a site to send it to the
    # steps too, the driver hears it there.
    signal.signal(signal.SIGUSR2, signal.SIG_IGN)
    print(READY, flush=True)
    while True:
        signal.pause()


if __name__ == "__main__":
    sys.exit(main())

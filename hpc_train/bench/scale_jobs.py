"""`bench scale`'s jobs: submitted as `submit` does, waited for with a bound, all cancelled at the end.

`Jobs` is a context manager: every job it submitted, and every job id it was told of (the
doctor's), is cancelled when the block ends, by an error, Ctrl-C or SIGTERM included.
"""

from __future__ import annotations

import re
import signal
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from hpc_train import events, scheduler
from hpc_train.errors import LaunchError
from hpc_train.rundir import RunPaths, read_jsonl

T = TypeVar("T")
POLL_SECONDS = 0.5


def wait_until(predicate: Callable[[], T | None], timeout: float, what: str) -> T:
    """Poll `predicate` until it returns something other than None (or False); LaunchError
    after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value is not None and value is not False:
            return value
        time.sleep(POLL_SECONDS)
    raise LaunchError(f"bench scale: no {what} after {timeout:g} s")


class Run:
    """One submitted run: its job id and what its run directory holds now."""

    def __init__(self, job_id: str, paths: RunPaths):
        self.job_id, self.paths = job_id, paths

    def history(self) -> list[dict]:
        return events.read(self.paths)

    def metrics(self) -> list[dict]:
        return read_jsonl(self.paths.metrics)


def _terminate(signum, frame):
    raise KeyboardInterrupt(f"signal {signum}")


class Jobs:
    """Submits runs of one spec file with overrides, and cancels them all on exit."""

    def __init__(self, spec_file: str, root: Path):
        self.spec_file, self.root = spec_file, root
        self.job_ids: list[str] = []
        self._previous_term = None

    def __enter__(self) -> Jobs:
        self._previous_term = signal.signal(signal.SIGTERM, _terminate)
        return self

    def __exit__(self, *exc) -> None:
        try:
            if problem := scheduler.cancel(self.job_ids):
                print(f"bench scale: scancel {' '.join(self.job_ids)}: {problem}")
        finally:
            signal.signal(signal.SIGTERM, self._previous_term)

    def submit(self, name: str, overrides: list[str]) -> Run:
        """A new run named `name` under the bench's root, through the API `submit` uses (the
        same checks before the queue, the same run directory)."""
        from hpc_train import api

        if not scheduler.installed():      # else the API would run it here (the local executor)
            raise LaunchError("bench scale needs Slurm: sbatch is not on PATH")
        run = api.submit(self.spec_file, [f"run.root={self.root}", f"run.name={name}", *overrides])
        self.job_ids.append(run.job_id)
        return Run(run.job_id, RunPaths(run.path))

    def adopt_from(self, text: str) -> None:
        """Remember the job ids that a command's output names ("job 123 ...")."""
        self.job_ids += [j for j in re.findall(r"\bjob (\d+)\b", text) if j not in self.job_ids]

    def cancel(self, run: Run) -> None:
        scheduler.cancel([run.job_id])

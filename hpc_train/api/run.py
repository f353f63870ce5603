"""`Run`: one run directory as a Python object, for notebooks and scripts (the CLI's twin).

Everything a Run answers comes from the run directory and Slurm, through the same code as the
commands: `status()` is `status --json`'s RunStatus (inspection/cli.py build_status), `logs()`
is `logs` (inspection/logs.py), `resume()` is `resume` (slurm/resume.py), `cancel()` goes through
the one Slurm client (scheduler.cancel). A Run keeps no state of its own but its directory (and,
for a job submitted through submitit's local executor in this process, submitit's job object),
so `open_run` in another process, days later, gives the same answers.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hpc_train import events, scheduler
from hpc_train.errors import SubmitError, UsageError, WaitTimeout
from hpc_train.inspection.cli import build_status, find_run
from hpc_train.inspection.summary import RunStatus
from hpc_train.rundir import RunPaths, read_jsonl
from hpc_train.scheduler.parse import JobState, job_state
from hpc_train.slurm.run_code import CODE_KEEP
from hpc_train.spec import JobSpec, load_spec

POLL_SECONDS = 5.0         # Run.wait: between two looks (squeue, then sacct once it ended)
# The states the run's events imply while it is not over (events.state).
_EVENTS_ACTIVE = frozenset({"PENDING", "RUNNING", "UNKNOWN"})


def is_final(status: RunStatus) -> bool:
    """Whether the run is over: Slurm no longer holds its job, or (a local run, or a job Slurm
    has forgotten) its events say it ended."""
    if status.state_source == "events":
        return status.state not in _EVENTS_ACTIVE
    state = job_state(status.state)
    return state is not JobState.UNKNOWN and not state.active


def wait_for(look: Callable[[], RunStatus], timeout: float, poll: float = POLL_SECONDS,
             clock: Callable[[], float] = time.monotonic,
             sleep: Callable[[float], None] = time.sleep) -> RunStatus:
    """Call `look` until its status is final (is_final) and return that one; WaitTimeout with
    the last status when `timeout` seconds pass first. Looks at least once, and once more at
    the deadline, so a run that ends during the last pause is not reported as still going."""
    deadline = clock() + timeout
    while True:
        status = look()
        if is_final(status):
            return status
        left = deadline - clock()
        if left <= 0:
            raise WaitTimeout(f"run {status.name} (job {status.job_id}) is still {status.state} after "
                              f"{timeout:g} s; it goes on. Fix: wait longer, or cancel it "
                              "(Run.cancel(), or scancel the job)", status)
        sleep(min(poll, left))


class Run:
    """A run directory: its job, its state, metrics and logs; cancel it or resume it.

    `path` is the run directory; `job_id` and `executor` are those of its latest submission
    (a resume submits a new job into the same directory)."""

    def __init__(self, path: str | Path, job: Any = None):
        self.path = Path(path).resolve()
        self._job = job          # submitit's job object of a local run submitted here, else None

    @property
    def paths(self) -> RunPaths:
        return RunPaths(self.path)

    @property
    def name(self) -> str:
        return self.path.name

    def _submission(self) -> tuple[str, str] | None:
        return events.last_submission(events.read(self.paths))

    @property
    def job_id(self) -> str | None:
        """The latest submission's job id (Slurm's; a process id for the local executor)."""
        submission = self._submission()
        return submission[0] if submission else None

    @property
    def executor(self) -> str | None:
        """"slurm" or "local" (submitit's local executor), of the latest submission."""
        submission = self._submission()
        return submission[1] if submission else None

    def spec(self) -> JobSpec:
        """The run's resolved spec, as its job reads it (spec.yaml)."""
        return load_spec(self.paths.spec)

    def __repr__(self) -> str:
        return f"<Run {self.name} job {self.job_id} ({self.executor}) at {self.path}>"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Run) and other.path == self.path

    def __hash__(self) -> int:
        return hash(self.path)

    def status(self, slurm: bool = True) -> RunStatus:
        """State, progress, throughput, ETA, health (and a diagnosis when it failed or stalls):
        what `status --json` prints (docs/status-schema.json). `slurm=False`: the events alone."""
        return build_status(self.path, slurm)

    def wait(self, timeout: float, poll: float = POLL_SECONDS, slurm: bool = True) -> RunStatus:
        """Block until the run is over (COMPLETED, FAILED, CANCELLED, TIMEOUT, ...) and return
        its final status; WaitTimeout (a TimeoutError; `.status` holds the last one) after
        `timeout` seconds. Requeues are not the end: a requeued job is still Slurm's."""
        return wait_for(lambda: self.status(slurm), timeout, poll)

    def metrics(self, split: str | None = None) -> list[dict]:
        """metrics.jsonl's lines in order, across requeues and resumes; split="train" keeps
        the training steps, split="val" the validation lines."""
        lines = read_jsonl(self.paths.metrics)
        if split is None:
            return lines
        return [m for m in lines if m.get("split") == (None if split == "train" else split)]

    def logs(self, rank: int | None = 0, run: int | None = None, grep: str | None = None) -> str:
        """Rank `rank`'s log (None: every rank merged by time, "[rank N] " before each line) as
        `logs` prints it; `run` the K-th start (0 first, -1 last), `grep` a regex filter."""
        from hpc_train.inspection import logs

        lines = logs.select(self.paths, None if rank is None else [rank], run, grep)
        return "".join(logs.format_line(line, rank is None) + "\n" for line in lines)

    def cancel(self) -> None:
        """Cancel the run's job: scancel for Slurm (an ended job: nothing happens), or the local
        executor's job when this process submitted it. SubmitError when scancel fails."""
        submission = self._submission()
        if submission is None:
            raise UsageError(f"{self.path}: no submission recorded in its events: no job to cancel")
        job_id, executor = submission
        if executor == "slurm":
            if problem := scheduler.cancel([job_id]):
                raise SubmitError(f"scancel {job_id} failed: {problem}")
        elif self._job is not None and str(self._job.job_id) == job_id:
            self._job.cancel()
        else:
            # Its job id is a process id that may belong to another process by now.
            raise UsageError(f"{self.name} runs through submitit's local executor from another "
                             f"process (pid {job_id}): cancel it from there")

    def resume(self, overrides: tuple[str, ...] | list[str] = (), allow_spec_change: bool = False,
               local: bool = False, code: str = CODE_KEEP) -> Run:
        """Submit the run again; it continues from its latest complete checkpoint (as `resume`).
        code: CODE_KEEP ("keep"), CODE_NEW ("new") or CODE_NONE ("none"), what the job imports
        (slurm/run_code.py). Returns the Run of the new job, in this same directory (this Run
        follows it too)."""
        from hpc_train.api.submission import resume

        return resume(self.path, overrides, allow_spec_change, local, code)


def open_run(path_or_job_id: str | Path, root: str | Path = "runs") -> Run:
    """The Run of a run directory, or of a Slurm job id looked up under the run root `root`
    (as `status JOBID --root ROOT`); InspectError when there is none."""
    return Run(find_run(str(path_or_job_id), Path(root)))

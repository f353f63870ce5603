"""Every Slurm command hpc_train runs: argv lists, each bounded by a timeout, with one retry policy.

The retry policy (RETRY) is for a controller that is briefly unreachable (restarting, failing
over, rate-limiting): a call is tried up to RETRY.attempts times, with growing pauses, all within
the call's own timeout. What may be tried again depends on what Slurm's error says happened:
- "connect failure", a rate limit, a controller in standby: the request never got through, so
  any call may be sent again;
- a send/receive failure, a socket timeout, our own timeout: the controller may have carried it
  out; only calls that can safely happen twice are repeated (queries, scancel). sbatch is not
  (a second job), nor `scontrol requeue` (a second requeue; `requeue` checks Slurm's view
  between its own tries instead).
"""

from __future__ import annotations

import os
import shutil
import time
from dataclasses import dataclass

from hpc_train import _proc
from hpc_train.errors import SubmitError
from hpc_train.scheduler import accounting
from hpc_train.scheduler.parse import (SACCT_FIELDS, SQUEUE_FORMAT, Job, controller_up, parse_sacct,
                                       parse_show_job, parse_squeue, parse_submitted,
                                       smallest_node_memory)

# scontrol's words (ESLURM_JOB_PENDING) for a job that Slurm has put back in the queue already.
ALREADY_PENDING = "Job is pending execution"
NOT_SENT = ("(connect failure)", "Rate limit exceeded, please retry momentarily", "standby mode",
            "Connection timed out establishing")
MAYBE_DONE = ("Unable to contact slurm controller", "Socket timed out", "Zero Bytes were transmitted",
              "Connection timed out")


@dataclass(frozen=True)
class Retry:
    attempts: int = 3
    pause: float = 1.0          # seconds before the second try; n times that before the (n+1)th


RETRY = Retry()


def _again(out: _proc.Result, repeatable: bool) -> bool:
    """Whether a failed call may be sent again (see the module's docstring)."""
    said = out.stderr + out.stdout
    if any(words in said for words in NOT_SENT):
        return True
    return repeatable and (out.returncode == 124 or any(words in said for words in MAYBE_DONE))


def call(argv: list[str], timeout: float, repeatable: bool = True) -> _proc.Result:
    """Run a Slurm command, retried by RETRY within `timeout` seconds in all."""
    env = {**os.environ, "SLURM_TIME_FORMAT": "standard"}     # the timestamps parse_time reads
    deadline = time.monotonic() + timeout

    def once() -> _proc.Result:
        return _proc.run(argv, timeout=max(deadline - time.monotonic(), 1.0), env=env)

    out = once()
    for attempt in range(1, RETRY.attempts):
        pause = RETRY.pause * attempt
        if out.ok or time.monotonic() + pause >= deadline or not _again(out, repeatable):
            break
        time.sleep(pause)
        out = once()
    return out


def _said(out: _proc.Result) -> str:
    return (out.stderr or out.stdout).strip() or f"exit {out.returncode}"


def installed() -> bool:
    """Whether Slurm's commands are here at all (else the local executor runs jobs)."""
    return shutil.which("sbatch") is not None


def controller_problem(environ=None, timeout: float = 15) -> str | None:
    """None when Slurm's controller answers `scontrol ping`; else why not, in one line: a
    stopped slurmctld, no configuration at all (Slurm then tries DNS SRV records), or a
    SLURM_CONF that names no file (which Slurm's clients would retry for a minute)."""
    environ = os.environ if environ is None else environ
    conf = environ.get("SLURM_CONF")
    if conf and not os.path.isfile(conf):
        return f"SLURM_CONF={conf} is not a file"
    out = call(["scontrol", "ping"], timeout)
    if out.ok and controller_up(out.stdout):
        return None
    lines = [line.strip() for line in (out.stdout + out.stderr).splitlines()
             if line.strip() and not line.startswith("*")]
    return lines[0] if lines else f"scontrol ping exited {out.returncode}"


def show_job(job_id: str, timeout: float = 20) -> Job | None:
    """`scontrol show job`: state, reason, restarts, nodes; None when it does not answer."""
    out = call(["scontrol", "show", "job", "-o", job_id], timeout)
    return parse_show_job(out.stdout) if out.ok else None


def queue(job_ids: list[str], timeout: float = 20) -> list[Job] | None:
    """squeue's rows for the jobs, one per array task; [] when Slurm no longer lists them;
    None when squeue fails."""
    out = call(["squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", SQUEUE_FORMAT], timeout)
    if not out.ok:
        # squeue exits non-zero for an id that has left the controller's memory.
        return [] if "Invalid job id" in out.stderr else None
    return parse_squeue(out.stdout)


def accounted(job_ids: list[str], timeout: float = 20) -> list[Job] | None:
    """sacct's record of each job's latest run (also ended jobs); None when sacct fails."""
    out = call(["sacct", "-X", "-n", "-P", "-o", ",".join(SACCT_FIELDS), "-j", ",".join(job_ids)],
               timeout)
    return parse_sacct(out.stdout) if out.ok else None


def live_state(job_id: str, timeout: float = 5.0) -> Job | None:
    """squeue first (live, cheap); sacct for ended jobs; None when neither knows the job."""
    if live := queue([job_id], timeout):
        return live[0]
    return (accounted([job_id], timeout) or [None])[-1]


def job_end_time(job_id: str, environ) -> float | None:
    """When Slurm will end this job: SLURM_JOB_END_TIME where set, else squeue."""
    if value := environ.get("SLURM_JOB_END_TIME"):
        return float(value)
    return next((job.end_time for job in queue([job_id]) or []), None)


def segments(job_ids: list[str], timeout: float = 20.0) -> tuple[list[accounting.Segment], str | None]:
    """Every run of the jobs (sacct -D) with its steps: (segments, None), or ([], why none)."""
    if not job_ids:
        return [], "no Slurm job id in the run's events"
    out = call(["sacct", "-D", "-P", "-n", "-o", ",".join(accounting.FIELDS), "-j", ",".join(job_ids)],
               timeout)
    if not out.ok:
        return [], f"sacct failed ({(out.stderr.strip().splitlines() or ['no output'])[0]})"
    found = accounting.parse_segments(out.stdout)
    if not found:
        return [], f"sacct has no record of job {', '.join(job_ids)} (accounting off, or purged)"
    return found, None


def accounting_problem(timeout: float = 20) -> str | None:
    """None when Slurm's accounting answers (slurmdbd); else what sacct said."""
    out = call(["sacct", "-n", "-X", "-S", "now-1hours", "-o", "JobID"], timeout)
    return None if out.ok else out.stderr


def partitions(timeout: float = 20) -> tuple[list[str], str | None]:
    """sinfo's partitions ('debug* up 1 idle': name, availability, nodes, state): (lines, None),
    or ([], what went wrong)."""
    out = call(["sinfo", "-h", "-o", "%P %a %D %T"], timeout)
    if not out.ok:
        return [], "sinfo not on PATH" if out.returncode == 127 else out.stderr
    return [line.strip() for line in out.stdout.strip().splitlines()], None


def smallest_memory(partition: str | None = None, timeout: float = 20) -> int | None:
    """The smallest node's memory in MB (of `partition`, else of every node); None unknown."""
    out = call(["sinfo", "-h", "-o", "%m", *([f"--partition={partition}"] if partition else [])],
               timeout)
    return smallest_node_memory(out.stdout) if out.ok else None


def cancel(job_ids: list[str], timeout: float = 30.0) -> str | None:
    """scancel the jobs (an array's id cancels every task); the error, or None. Safe to repeat:
    scancel of an ended job succeeds."""
    if not job_ids:
        return None
    out = call(["scancel", *job_ids], timeout)
    return None if out.ok else _said(out)


def submit(args: list[str], what: str, timeout: float = 60) -> str:
    """`sbatch --parsable ARGS` (options, then the script); the job id, or SubmitError with
    sbatch's own words. Never sent twice once it may have reached Slurm (see the docstring)."""
    out = call(["sbatch", "--parsable", *args], timeout, repeatable=False)
    job_id = parse_submitted(out.stdout) if out.ok else None
    if job_id is None:
        maybe = "; it may have been submitted all the same: look with squeue before submitting " \
                "again" if _again(out, True) else ""
        raise SubmitError(f"sbatch refused {what}: {_said(out)}{maybe}")
    return job_id


def requeue(job_id: str, restart: int, attempts: int = RETRY.attempts) -> tuple[str | None, str]:
    """`scontrol requeue`, tried `attempts` times: (who requeued the job, what happened); who is
    "driver" (our scontrol was accepted), "slurm" (refused because Slurm requeued the job
    meanwhile: its restart count went up, or scontrol says it is pending), or None.
    restart: this run's SLURM_RESTART_COUNT."""
    detail = ""
    for attempt in range(1, attempts + 1):
        out = call(["scontrol", "requeue", job_id], 30, repeatable=False)
        if out.ok:
            return "driver", "scontrol requeue accepted"
        detail = (out.stderr or out.stdout).strip() or f"scontrol requeue exit {out.returncode}"
        job = show_job(job_id)
        if (job is not None and job.restarts > restart) or ALREADY_PENDING in detail:
            return "slurm", f"requeued already; scontrol said: {detail}"
        if attempt < attempts:
            time.sleep(RETRY.pause * attempt)
    return None, detail

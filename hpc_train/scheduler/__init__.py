"""The one Slurm client: the only code that runs sbatch, squeue, sacct, scontrol, scancel or sinfo
(here: argv lists, each call bounded by its timeout) or reads what they print (parse.py and
accounting.py, pure); tests/test_slurm_boundary.py holds every other module to that.

One retry policy, for a controller briefly unreachable (restarting, failing over, rate-limiting):
up to ATTEMPTS tries with growing pauses, within the call's timeout. Slurm's error says whether
the request got through: after "connect failure", a rate limit or a controller in standby it did
not, and any call is sent again; after a send/receive failure or a timeout it may have been
carried out, and only what may happen twice is repeated (queries, scancel): never sbatch (a
second job) nor `scontrol requeue` (`requeue` checks Slurm's view between its own tries).
"""

from __future__ import annotations

import os
import re
import shutil
import socket
import time
from concurrent.futures import ThreadPoolExecutor

from hpc_train import _proc
from hpc_train.errors import SubmitError
from hpc_train.scheduler.accounting import FIELDS, Segment, parse_segments
from hpc_train.scheduler.parse import (ACTIVE_STATES, FAILED_STATES, NODE_SHAPE_FORMAT, RUNNING_STATES,
                                       SACCT_FIELDS, SQUEUE_FORMAT, Job, JobState, NodeShape, array_tasks,
                                       expand_hostlist, job_ref, node_lost, parse_node_shapes, parse_sacct,
                                       parse_show_job, parse_show_nodes, parse_squeue)
from hpc_train.scheduler.policy import Preemption, parse_preemption

ATTEMPTS, PAUSE = 3, 1.0        # tries of a call; seconds before the 2nd, twice that before the 3rd
ALREADY_PENDING = "Job is pending execution"     # scontrol's ESLURM_JOB_PENDING: requeued already
NOT_SENT = ("(connect failure)", "Rate limit exceeded, please retry momentarily", "standby mode",
            "Connection timed out establishing")
MAYBE_DONE = ("Unable to contact slurm controller", "Socket timed out", "Zero Bytes were transmitted",
              "Connection timed out")


def _again(out: _proc.Result, repeatable: bool) -> bool:
    """Whether a failed call may be sent again."""
    said = out.stderr + out.stdout
    return any(w in said for w in NOT_SENT) or repeatable and (out.returncode == 124 or
                                                               any(w in said for w in MAYBE_DONE))


def call(argv: list[str], timeout: float, repeatable: bool = True) -> _proc.Result:
    """Run a Slurm command, tried again as the module's docstring says, in `timeout` s in all."""
    env = {**os.environ, "SLURM_TIME_FORMAT": "standard"}     # the timestamps parse_time reads
    deadline = time.monotonic() + timeout
    for attempt in range(ATTEMPTS):
        time.sleep(PAUSE * attempt)
        out = _proc.run(argv, timeout=max(deadline - time.monotonic(), 1.0), env=env)
        if out.ok or time.monotonic() + PAUSE * (attempt + 1) >= deadline or not _again(out, repeatable):
            break
    return out


def _said(out: _proc.Result) -> str:
    return (out.stderr or out.stdout).strip() or f"exit {out.returncode}"


def _first_line(text: str) -> str:
    return (text.strip().splitlines() or ["no output"])[0][:160]


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
    if out.ok and " is UP" in out.stdout:        # Slurmctld(primary) at vm is UP
        return None
    lines = [line.strip() for line in (out.stdout + out.stderr).splitlines()
             if line.strip() and not line.startswith("*")]
    return lines[0] if lines else f"scontrol ping exited {out.returncode}"


def show_job(job_id: str, timeout: float = 20) -> Job | None:
    """`scontrol show job`: state, reason, restarts, nodes; None when it does not answer."""
    out = call(["scontrol", "show", "job", "-o", job_id], timeout)
    return parse_show_job(out.stdout) if out.ok else None


def node_states(nodes: list[str], timeout: float = 10) -> dict[str, str] | None:
    """`scontrol show node`: {node: its State word} of those Slurm knows; None when it does not
    answer (a crashed node is shown not responding once slurmctld has noticed)."""
    out = call(["scontrol", "show", "node", "-o", ",".join(nodes)], timeout)
    return parse_show_nodes(out.stdout) if out.ok or out.stdout else None


def unreachable_nodes(nodes: list[str], timeout: float = 3.0) -> list[str]:
    """The nodes whose slurmd accepts no connection within `timeout` (refused, unreachable, no
    answer): a machine that crashed or was cut off, known at once, where slurmctld marks it only
    after its SlurmdTimeout (minutes at most sites). [] when Slurm does not say its slurmd port."""
    out = call(["scontrol", "show", "config"], 10)
    port = re.search(r"^SlurmdPort\s*=\s*(\d+)", out.stdout, re.M) if out.ok else None
    if port is None or not nodes:
        return []

    def refused(node: str) -> bool:
        try:
            with socket.create_connection((node, int(port.group(1))), timeout=timeout):
                return False
        except OSError:
            return True

    with ThreadPoolExecutor(max_workers=min(len(nodes), 16)) as pool:
        return [node for node, gone in zip(nodes, pool.map(refused, nodes)) if gone]


def exclude_nodes(job_id: str, nodes: list[str], timeout: float = 20) -> str | None:
    """Keep a pending (requeued) job off `nodes` (`scontrol update ExcNodeList`): the error, or None."""
    out = call(["scontrol", "update", f"jobid={job_id}", f"ExcNodeList={','.join(nodes)}"], timeout)
    return None if out.ok else _said(out)


def queue(job_ids: list[str], timeout: float = 20) -> list[Job] | None:
    """squeue's rows for the jobs, one per array task; [] when Slurm no longer lists them;
    None when squeue fails."""
    out = call(["squeue", "-h", "-r", "-j", ",".join(job_ids), "-o", SQUEUE_FORMAT], timeout)
    if not out.ok:     # as for an id that has left the controller's memory: "Invalid job id"
        return [] if "Invalid job id" in out.stderr else None
    return parse_squeue(out.stdout)


def accounted(job_ids: list[str], timeout: float = 20) -> list[Job] | None:
    """sacct's record of each job's latest run (also ended jobs); None when sacct fails."""
    out = call(["sacct", "-X", "-n", "-P", "-o", ",".join(SACCT_FIELDS), "-j", ",".join(job_ids)], timeout)
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


def segments(job_ids: list[str], timeout: float = 20.0) -> tuple[list[Segment], str | None]:
    """Every run of the jobs (sacct -D) with its steps: (segments, None), or ([], why none)."""
    if not job_ids:
        return [], "no Slurm job id in the run's events"
    out = call(["sacct", "-D", "-P", "-n", "-o", ",".join(FIELDS), "-j", ",".join(job_ids)], timeout)
    if not out.ok:
        return [], f"sacct failed ({_first_line(out.stderr)})"
    found = parse_segments(out.stdout)
    if not found:
        return [], f"sacct has no record of job {', '.join(job_ids)} (accounting off, or purged)"
    return found, None


def accounting_problem(timeout: float = 20) -> str | None:
    """None when Slurm's accounting answers (slurmdbd); else sacct's first line of complaint."""
    out = call(["sacct", "-n", "-X", "-S", "now-1hours", "-o", "JobID"], timeout)
    return None if out.ok else _first_line(out.stderr)


def partitions(timeout: float = 20) -> tuple[list[str], str | None]:
    """sinfo's partitions ('debug* up 1 idle': name, availability, nodes, state): (lines, None),
    or ([], what went wrong, in one line)."""
    out = call(["sinfo", "-h", "-o", "%P %a %D %T"], timeout)
    if not out.ok:
        return [], "sinfo not on PATH" if out.returncode == 127 else _first_line(out.stderr)
    return [line.strip() for line in out.stdout.strip().splitlines()], None


def preemption(timeout: float = 20) -> tuple[list[Preemption], str | None]:
    """What a preemption does to a job of each partition (policy.py): (policies, None), or
    ([], why not, in one line)."""
    config = call(["scontrol", "show", "config"], timeout)
    if not config.ok:
        return [], "scontrol not on PATH" if config.returncode == 127 else _first_line(config.stderr)
    parts = call(["scontrol", "show", "partition", "-o"], timeout)
    if not parts.ok:
        return [], _first_line(parts.stderr)
    return parse_preemption(config.stdout, parts.stdout), None


def node_shapes(timeout: float = 10) -> tuple[list[NodeShape], str | None]:
    """Every node of every partition with its CPUs, memory and GPUs: (nodes, None), or
    ([], why not, in one line: no sinfo, no answer)."""
    out = call(["sinfo", "-h", "-N", "-o", NODE_SHAPE_FORMAT], timeout)
    if not out.ok:
        return [], "sinfo not on PATH" if out.returncode == 127 else _first_line(out.stderr)
    return parse_node_shapes(out.stdout), None


def smallest_memory(partition: str | None = None, timeout: float = 20) -> int | None:
    """The smallest node's memory in MB (of `partition`, else of all; '3000+': at least 3000)."""
    out = call(["sinfo", "-h", "-o", "%m", *([f"--partition={partition}"] if partition else [])], timeout)
    return min((int(m.rstrip("+")) for m in out.stdout.split() if m.rstrip("+").isdigit()), default=None)


def cancel(job_ids: list[str], timeout: float = 30.0) -> str | None:
    """scancel the jobs (an array's id: every task); the error, or None. An ended job's succeeds."""
    if not job_ids:
        return None
    out = call(["scancel", *job_ids], timeout)
    return None if out.ok else _said(out)


def signal_batch(job_id: str, signal: str, timeout: float = 30.0) -> str | None:
    """`scancel --batch --signal=SIGNAL`: the batch step only (the driver, which forwards it to
    the ranks), as Slurm does before a time limit with `--signal=B:`; the error, or None."""
    out = call(["scancel", "--batch", f"--signal={signal}", job_id], timeout, repeatable=False)
    return None if out.ok else _said(out)


def submit(args: list[str], what: str, timeout: float = 60) -> str:
    """`sbatch --parsable ARGS` (options, then the script); the job id, or SubmitError with
    sbatch's own words. Never sent twice once it may have reached Slurm."""
    out = call(["sbatch", "--parsable", *args], timeout, repeatable=False)
    job_id = out.stdout.strip().split(";")[0] if out.ok else ""      # 123, or 123;cluster
    if not job_id.isdigit():
        maybe = "; it may have been submitted all the same: look with squeue before submitting " \
                "again" if _again(out, True) else ""
        raise SubmitError(f"sbatch refused {what}: {_said(out)}{maybe}")
    return job_id


def requeue(job_id: str, restart: int, attempts: int = ATTEMPTS) -> tuple[str | None, str]:
    """`scontrol requeue`, tried `attempts` times: (who requeued the job, what happened); who is
    "driver" (our scontrol was accepted), "slurm" (refused because Slurm requeued the job
    meanwhile: its restart count went up, or scontrol says it is pending), or None.
    restart: this run's SLURM_RESTART_COUNT."""
    detail = ""
    for attempt in range(1, attempts + 1):
        out = call(["scontrol", "requeue", job_id], 30, repeatable=False)
        if out.ok:
            return "driver", "scontrol requeue accepted"
        detail = _said(out)
        job = show_job(job_id)
        requeued = job is not None and job.restarts > restart
        if requeued and out.returncode < 0:
            # scontrol runs among the job's processes, which the requeue it asked for signals:
            # ended by a signal, its requeue was accepted (CI15: "exit -15", recorded as Slurm's).
            return "driver", f"scontrol requeue accepted (scontrol itself ended by the requeue's signal, exit {out.returncode})"
        if requeued or ALREADY_PENDING in detail:
            return "slurm", f"requeued already; scontrol said: {detail}"
        if attempt < attempts:
            time.sleep(PAUSE * attempt)
    return None, detail

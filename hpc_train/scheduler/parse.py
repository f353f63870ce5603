"""What Slurm's commands print, as typed values (pure): job states, times, job ids, and the rows
of the queries client.py makes.

Tolerant by design, from Slurm 22.05 to current releases: we ask for our own fields (`-o`,
`--parsable2`) so a new default column changes nothing; `Key=Value` fields we do not know are
ignored; a state word we do not know becomes JobState.UNKNOWN with Slurm's word kept for people;
a value we cannot read becomes None. No parser raises on Slurm's text.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import Enum


class JobState(str, Enum):
    """A job's state as squeue, sacct and scontrol print it (Slurm's job_state_string: base states
    and the flags shown instead). A str, so it compares with and prints as Slurm's own word."""
    BOOT_FAIL = "BOOT_FAIL"
    CANCELLED = "CANCELLED"
    COMPLETED = "COMPLETED"
    COMPLETING = "COMPLETING"
    CONFIGURING = "CONFIGURING"
    DEADLINE = "DEADLINE"
    EXPEDITING = "EXPEDITING"            # 25.05+: requeued with the highest priority
    FAILED = "FAILED"
    NODE_FAIL = "NODE_FAIL"
    OUT_OF_MEMORY = "OUT_OF_MEMORY"
    PENDING = "PENDING"
    PREEMPTED = "PREEMPTED"
    REQUEUED = "REQUEUED"
    REQUEUE_FED = "REQUEUE_FED"
    REQUEUE_HOLD = "REQUEUE_HOLD"
    RESIZING = "RESIZING"
    RESV_DEL_HOLD = "RESV_DEL_HOLD"
    REVOKED = "REVOKED"
    RUNNING = "RUNNING"
    SIGNALING = "SIGNALING"
    SPECIAL_EXIT = "SPECIAL_EXIT"
    STAGE_OUT = "STAGE_OUT"
    STOPPED = "STOPPED"
    SUSPENDED = "SUSPENDED"
    TIMEOUT = "TIMEOUT"
    UNKNOWN = "UNKNOWN"                  # a word this version of hpc_train does not know

    def __str__(self) -> str:
        return self.value

    @property
    def active(self) -> bool:
        """Still Slurm's to run: a second writer of the run must not be started."""
        return self in ACTIVE_STATES


# Job states in which the job is still Slurm's to run.
ACTIVE_STATES = frozenset(JobState[name] for name in (
    "PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "REQUEUED", "REQUEUE_HOLD", "REQUEUE_FED",
    "RESIZING", "SUSPENDED", "STAGE_OUT", "SIGNALING", "STOPPED", "RESV_DEL_HOLD", "SPECIAL_EXIT",
    "EXPEDITING"))
# Ended without success, worst first (a stage's state names the first of these it has).
FAILED_STATES = tuple(JobState[name] for name in (
    "FAILED", "OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL", "BOOT_FAIL", "DEADLINE", "PREEMPTED"))
# Has its allocation and is, or was just, running.
RUNNING_STATES = frozenset(JobState[name] for name in (
    "RUNNING", "COMPLETING", "CONFIGURING", "SIGNALING", "STAGE_OUT", "RESIZING"))


def job_state(word: str) -> JobState:
    """A state word -> JobState: 'CANCELLED by 0' (sacct names who) and 'CANCELLED+' (sacct's
    truncation mark) are CANCELLED; an unknown or empty word is UNKNOWN."""
    first = (word.split() or [""])[0].rstrip("+").upper()
    return JobState.__members__.get(first, JobState.UNKNOWN)


@dataclass(frozen=True)
class Job:
    """What Slurm says of one job or array task, from squeue, sacct or scontrol."""
    job_id: str                 # 123, 123_4 (an array task), 123_[5-7%2] (tasks not split yet)
    state: JobState
    word: str = ""              # Slurm's own state word, shown when the state is UNKNOWN
    reason: str = ""            # why it pends or ended ("" for None)
    exit_code: str = ""         # "exit status:signal", e.g. 3:0
    elapsed: float | None = None    # seconds
    restarts: int = 0           # requeues so far (scontrol; 0 elsewhere)
    node_count: int | None = None
    nodes: str = ""             # Slurm's node list: hpcn[1-2]
    end_time: float | None = None   # UNIX time; Slurm's estimate while it runs
    source: str = ""            # "squeue", "sacct" or "scontrol"

    @property
    def label(self) -> str:
        """The state for people: Slurm's word, flagged when we do not know it."""
        if self.state is JobState.UNKNOWN and self.word:
            return f"UNKNOWN ({self.word}: a state this hpc_train does not know)"
        return self.state.value


def _state_fields(word: str) -> dict:
    return {"state": job_state(word), "word": (word.split() or [""])[0]}


def _reason(text: str) -> str:
    return "" if text.strip() in ("None", "(null)") else text.strip()


def _count(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


# --- times and durations ---------------------------------------------------------------------

_DURATION = re.compile(r"(?:(?:(\d+)-)?(?:(\d+):)?(\d+):)?(\d+(?:\.\d+)?)")


def parse_time(text: str) -> float | None:
    """A Slurm timestamp (2026-11-29T17:05:00, local time) -> UNIX time; None for N/A, Unknown,
    None and anything else."""
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def parse_duration(text: str) -> float | None:
    """A duration Slurm prints ([D-][HH:]MM:SS[.mmm] or SS[.mmm]: sacct's Elapsed and TotalCPU,
    squeue's %M, scontrol's RunTime) -> seconds; None for UNLIMITED, INVALID, N/A and the like."""
    match = _DURATION.fullmatch(text.strip())
    if not match:
        return None
    days, hours, minutes, seconds = match.groups()
    return int(days or 0) * 86400 + int(hours or 0) * 3600 + int(minutes or 0) * 60 + float(seconds)


# --- job ids ---------------------------------------------------------------------------------


def array_tasks(job_id: str) -> list[str]:
    """`123_[0-2,5%2]` (or `123_[0-2,5]%2`) -> 123_0, 123_1, 123_2, 123_5 (array tasks listed as
    one row: not split off yet, or cancelled while pending); any other id -> itself."""
    head, bracket, rest = job_id.partition("_[")
    if not bracket:
        return [job_id]
    tasks = []
    for part in rest.split("%")[0].rstrip("]").split(","):
        low, _, high = part.partition("-")
        if low.isdigit() and (not high or high.isdigit()):
            tasks += [f"{head}_{t}" for t in range(int(low), int(high or low) + 1)]
    return tasks


def job_ref(environ) -> str | None:
    """How Slurm commands must name the job this process runs in: `<array job>_<task>` for a task
    of a job array, else SLURM_JOB_ID; None outside Slurm.

    An array task has a job id of its own (SLURM_JOB_ID), but one task's id is the array's id
    itself, and `scontrol requeue <array id>` requeues every task of the array: a member of a
    sweep must only ever requeue itself.
    """
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return environ.get("SLURM_JOB_ID") or None


# --- the queries' output ---------------------------------------------------------------------

# `scontrol show job -o`: Key=Value words; values have no spaces (Reason's are made underscores).
_FIELD = re.compile(r"(?:^|\s)([A-Za-z][A-Za-z0-9:/_]*)=(\S*)")
SQUEUE_FORMAT = "%i|%T|%r|%M|%e|%D|%N"
SACCT_FIELDS = ("JobID", "State", "Reason", "ElapsedRaw", "ExitCode", "NNodes", "NodeList")


def parse_show_job(text: str) -> Job | None:
    """`scontrol show job [-o] ID` (Key=Value words; the first record of an array's) -> its job;
    None when there is no JobState (an error message instead)."""
    fields: dict[str, str] = {}
    for key, value in _FIELD.findall(re.split(r"\n(?=JobId=)", text.strip())[0]):
        fields.setdefault(key, value)       # the first: SubmitLine= or Comment= may hold more
    if "JobState" not in fields:
        return None
    job_id = fields.get("JobId", "")
    if fields.get("ArrayTaskId", "").isdigit():
        job_id = f"{fields.get('ArrayJobId', job_id)}_{fields['ArrayTaskId']}"
    return Job(job_id, **_state_fields(fields["JobState"]), reason=_reason(fields.get("Reason", "")),
               exit_code=fields.get("ExitCode", ""), elapsed=parse_duration(fields.get("RunTime", "")),
               restarts=_count(fields.get("Restarts", "")) or 0, node_count=_count(fields.get("NumNodes", "")),
               nodes=fields.get("NodeList", ""), end_time=parse_time(fields.get("EndTime", "")),
               source="scontrol")


def parse_squeue(text: str) -> list[Job]:
    """`squeue -h -o SQUEUE_FORMAT` rows, in squeue's order (cells past ours are ignored, shorter
    rows skipped)."""
    jobs = []
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) < 7:
            continue
        job_id, state, reason, elapsed, end, count, nodes = (c.strip() for c in cells[:7])
        jobs.append(Job(job_id, **_state_fields(state), reason=_reason(reason),
                        elapsed=parse_duration(elapsed), node_count=_count(count), nodes=nodes,
                        end_time=parse_time(end), source="squeue"))
    return jobs


def parse_sacct(text: str) -> list[Job]:
    """`sacct -X -n -P -o SACCT_FIELDS` rows, in sacct's order (the last row of a job is its latest
    run; cells past ours are ignored, shorter rows skipped)."""
    jobs = []
    for line in text.splitlines():
        cells = line.split("|")
        if len(cells) < len(SACCT_FIELDS):
            continue
        job_id, state, reason, elapsed, exit_code, count, nodes = (c.strip() for c in cells[:7])
        jobs.append(Job(job_id, **_state_fields(state), reason=_reason(reason), exit_code=exit_code,
                        elapsed=float(elapsed) if elapsed.isdigit() else None, node_count=_count(count),
                        nodes="" if nodes == "None assigned" else nodes, source="sacct"))
    return jobs


def parse_submitted(text: str) -> str | None:
    """`sbatch --parsable` -> the job id ('123', or '123;cluster' on a multi-cluster site)."""
    words = text.strip().splitlines()
    job_id = words[-1].split(";")[0].strip() if words else ""
    return job_id if job_id.isdigit() else None


def smallest_node_memory(text: str) -> int | None:
    """`sinfo -h -o %m` lines ('10244', '3000+': at least 3000 MB) -> the smallest, in MB."""
    sizes = [int(line.strip().rstrip("+")) for line in text.splitlines()
             if line.strip().rstrip("+").isdigit()]
    return min(sizes) if sizes else None


def controller_up(text: str) -> bool:
    """`scontrol ping`: 'Slurmctld(primary) at vm is UP' (one line per controller): one is up."""
    return any(line.rstrip().endswith(" is UP") for line in text.splitlines())

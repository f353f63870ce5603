"""What Slurm's commands print, as typed values (pure): states, times, ids, the client's rows.

Tolerant from Slurm 22.05 to current releases: the client asks for its own fields, so a new
default column changes nothing; unknown `Key=Value` fields and extra cells are ignored; an
unknown state word is JobState.UNKNOWN, its word kept for people; an unreadable value is None.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime
from enum import Enum


class _State(str, Enum):
    def __str__(self) -> str:
        return self.value

    @property
    def active(self) -> bool:
        """Still Slurm's to run: a second writer of the run must not be started."""
        return self in ACTIVE_STATES


# What squeue, sacct and scontrol print (Slurm's job_state_string, 22.05 to 25.11; EXPEDITING is
# 25.05's), and UNKNOWN for a word we do not know. A str: it compares as Slurm's own word.
JobState = _State("JobState", [(w, w) for w in (
    "BOOT_FAIL CANCELLED COMPLETED COMPLETING CONFIGURING DEADLINE EXPEDITING FAILED NODE_FAIL "
    "OUT_OF_MEMORY PENDING PREEMPTED REQUEUED REQUEUE_FED REQUEUE_HOLD RESIZING RESV_DEL_HOLD "
    "REVOKED RUNNING SIGNALING SPECIAL_EXIT STAGE_OUT STOPPED SUSPENDED TIMEOUT UNKNOWN").split()])
ACTIVE_STATES = frozenset(JobState[w] for w in (
    "PENDING CONFIGURING RUNNING COMPLETING REQUEUED REQUEUE_HOLD REQUEUE_FED RESIZING SUSPENDED "
    "STAGE_OUT SIGNALING STOPPED RESV_DEL_HOLD SPECIAL_EXIT EXPEDITING").split())
# Ended without success, worst first (a stage's state names the first of these it has).
FAILED_STATES = tuple(JobState[w] for w in
                      "FAILED OUT_OF_MEMORY TIMEOUT NODE_FAIL BOOT_FAIL DEADLINE PREEMPTED".split())
RUNNING_STATES = frozenset(JobState[w] for w in
                           "RUNNING COMPLETING CONFIGURING SIGNALING STAGE_OUT RESIZING".split())


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
        unknown = self.state is JobState.UNKNOWN and self.word
        return f"UNKNOWN ({self.word}: a state this hpc_train does not know)" if unknown else self.state.value


def _state_fields(word: str) -> dict:
    return {"state": job_state(word), "word": (word.split() or [""])[0]}


def _reason(text: str) -> str:
    return "" if text.strip() in ("None", "(null)") else text.strip()


def parse_count(text: str) -> int | None:
    return int(text) if text.strip().isdigit() else None


DURATION_FORMATS = "MM, MM:SS, HH:MM:SS, D-HH, D-HH:MM or D-HH:MM:SS"
_DURATION = re.compile(r"(?:(\d+)-)?(\d+)(?::(\d+))?(?::(\d+))?(\.\d+)?", re.ASCII)


def parse_time(text: str) -> float | None:
    """A Slurm timestamp (2026-11-29T17:05:00, local time) -> UNIX time; None for N/A, Unknown,
    None and anything else."""
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def parse_duration(text: str) -> float | None:
    """Seconds in a Slurm duration, as Slurm reads a time limit (DURATION_FORMATS: one number is
    minutes, D-HH hours; a field after the first < 60, hours < 24 after days) or prints one (sacct's
    Elapsed, TotalCPU's 00:00.002, squeue's %M, RunTime); None for UNLIMITED, INVALID, N/A, ..."""
    match = _DURATION.fullmatch(text)
    if not match:
        return None
    days, *numbers, fraction = match.groups()
    given = [int(n) for n in numbers if n is not None]
    if any(n >= 60 for n in given[1:]) or (days is not None and given[0] >= 24):
        return None
    if days is not None:
        hours, minutes, seconds = given + [0] * (3 - len(given))
    else:
        hours, minutes, seconds = [0, given[0], 0] if len(given) == 1 else [0] * (3 - len(given)) + given
    if fraction and len(given) < (3 if days is not None else 2):
        return None                          # a fraction of a second, after something else
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds + float(fraction or 0)



def expand_hostlist(nodelist: str) -> list[str]:
    """Slurm's compressed host list: 'gpu[01-03,07],login1' -> gpu01, gpu02, gpu03, gpu07, login1
    (zero padding as the range's own width, as `scontrol show hostnames` does)."""
    hosts = []
    for item in re.findall(r"(?:[^,\[]|\[[^\]]*\])+", nodelist.strip()):   # commas outside [...]
        m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\](.*)", item)
        if not m:
            hosts.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            for number in range(int(lo), int(hi or lo) + 1):
                hosts.extend(expand_hostlist(f"{prefix}{number:0{width}d}{suffix}"))
    return hosts


def array_tasks(job_id: str) -> list[str]:
    """`123_[0-2,5%2]` (or `123_[0-2,5]%2`) -> 123_0, 123_1, 123_2, 123_5 (array tasks listed as
    one row: not split off yet, or cancelled while pending); any other id -> itself."""
    head = job_id.split("%")[0]
    return expand_hostlist(head + "]" if "[" in head and not head.endswith("]") else head)


def job_ref(environ) -> str | None:
    """How Slurm commands must name the job this process runs in: `<array job>_<task>` in a job
    array (one task's SLURM_JOB_ID is the array's own, and `scontrol requeue <array>` requeues
    every task: a sweep member must requeue only itself), else SLURM_JOB_ID; None outside Slurm."""
    array, task = environ.get("SLURM_ARRAY_JOB_ID"), environ.get("SLURM_ARRAY_TASK_ID")
    if array and task:
        return f"{array}_{task}"
    return environ.get("SLURM_JOB_ID") or None


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
               restarts=parse_count(fields.get("Restarts", "")) or 0, nodes=fields.get("NodeList", ""),
               node_count=parse_count(fields.get("NumNodes", "")), end_time=parse_time(fields.get("EndTime", "")),
               source="scontrol")


def _rows(text: str, width: int):
    """The cells of each `|`-separated row: cells past ours ignored, shorter rows skipped."""
    for line in text.splitlines():
        if len(cells := line.split("|")) >= width:
            yield [c.strip() for c in cells[:width]]


def parse_squeue(text: str) -> list[Job]:
    """`squeue -h -o SQUEUE_FORMAT` rows, in squeue's order."""
    return [Job(job_id, **_state_fields(state), reason=_reason(reason), elapsed=parse_duration(elapsed),
                node_count=parse_count(count), nodes=nodes, end_time=parse_time(end), source="squeue")
            for job_id, state, reason, elapsed, end, count, nodes in _rows(text, 7)]


def parse_sacct(text: str) -> list[Job]:
    """`sacct -X -n -P -o SACCT_FIELDS` rows, in sacct's order (a job's last row: its latest run)."""
    return [Job(job_id, **_state_fields(state), reason=_reason(reason), exit_code=exit_code,
                elapsed=parse_count(elapsed), node_count=parse_count(count),
                nodes="" if nodes == "None assigned" else nodes, source="sacct")
            for job_id, state, reason, elapsed, exit_code, count, nodes in _rows(text, len(SACCT_FIELDS))]


# A node's state flags that mean its slurmd is gone or the node out of service (scontrol prints
# `State=IDLE*` or `State=ALLOCATED+NOT_RESPONDING` for one that stopped answering).
_NODE_LOST = ("NOT_RESPONDING", "DOWN", "FAIL", "FAILING")


def show_fields(line: str) -> dict[str, str]:
    """One record of `scontrol show <node|partition|job> -o`: its Key=Value words."""
    return dict(_FIELD.findall(line))


def parse_show_nodes(text: str) -> dict[str, str]:
    """`scontrol show node -o NAMES` -> {node name: its State word}; lines without one (a name
    Slurm does not know) are left out."""
    states = {}
    for line in text.splitlines():
        fields = show_fields(line)
        if "NodeName" in fields and "State" in fields:
            states[fields["NodeName"]] = fields["State"]
    return states


def node_lost(state: str) -> bool:
    """Whether a node's State word says it is not responding, down or failed."""
    return "*" in state or any(flag in _NODE_LOST for flag in state.split("+"))


@dataclass(frozen=True)
class NodeShape:
    """One node of one partition as sinfo describes it: what a job's per-node request must fit."""
    name: str
    partition: str
    default: bool       # of the default partition (sinfo marks it with '*')
    cpus: int
    memory_mb: int
    gpus: int
    state: str


NODE_SHAPE_FORMAT = "%N|%P|%c|%m|%G|%T"     # sinfo -N: one line per node and partition


def parse_node_shapes(text: str) -> list[NodeShape]:
    """sinfo -h -N -o NODE_SHAPE_FORMAT -> every node of every partition; lines it cannot read
    are left out."""
    shapes = []
    for line in text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 6 or not fields[2].isdigit():
            continue
        name, partition, cpus, memory, gres, state = fields
        memory = memory.rstrip("+")
        shapes.append(NodeShape(name, partition.rstrip("*"), partition.endswith("*"), int(cpus),
                                int(memory) if memory.isdigit() else 0, gres_gpus(gres),
                                state.rstrip("*~#!%$@^-")))
    return shapes


def gres_gpus(gres: str) -> int:
    """GPUs in a node's GRES ('gpu:8', 'gpu:a100:4(S:0-1),nic:1', '(null)')."""
    total = 0
    for item in gres.split(","):
        parts = item.split("(")[0].split(":")
        if parts[0] == "gpu" and len(parts) >= 2 and parts[-1].isdigit():
            total += int(parts[-1])
    return total

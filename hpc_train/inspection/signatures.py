"""Known failure signatures: a table of pure data and a pure matcher over log lines.

Each signature names what went wrong and the fix. Patterns are matched line by line against
rank logs, the driver's output (submitit logs, slurm-*.out), the errors of `checkpoint_skipped`
events and a `sacct: State=...` line. A traceback's source line (the one under `File "...",
line N`) is code, not a message, and is never matched. Order matters only for display: the
matcher reports every signature that matched, first occurrence each. A signature with a `file`
pattern also names the file its line is about (the shard of a corrupt_shard).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class Signature:
    id: str
    title: str
    patterns: tuple[str, ...]
    fix: str
    file: str | None = None       # a regex whose group 1 is the file the matched line names


# A stall: what the driver did, and where to look. diagnose words the first part after what the
# run's events say really happened (restarted, requeued, or ended for good); the table's entry
# matches the driver's own log line when the event is missing.
STALL_DONE = ("the driver tore the ranks down and started them again from the last checkpoint: "
              "in the job (launch.restarts_in_job), else by a requeue (counts toward "
              "checkpoint.retries_on_failure)")
STALL_LIVE = ("the driver's watchdog tears the ranks down after launch.stall_seconds without "
              "progress and starts them again: in the job (launch.restarts_in_job), else by a "
              "requeue (counts toward checkpoint.retries_on_failure)")
STALL_ADVICE = ("the stalled rank's stacks and process state tell where it hung: a deadlock, slow "
                "or hung I/O, a collective waiting for a dead peer; state T (stopped) = stopped "
                "from outside (SIGSTOP, a debugger), D = stuck in the kernel (a file system). If a "
                "step, an evaluation or a save legitimately takes that long, raise "
                "launch.stall_seconds")


SIGNATURES: tuple[Signature, ...] = (
    Signature("cuda_oom", "GPU out of memory",
              (r"CUDA out of memory", r"torch\.(cuda\.)?OutOfMemoryError", r"CUBLAS_STATUS_ALLOC_FAILED"),
              "lower data.batch_size (raise parallel.accumulation to keep the global batch), use "
              "precision.mode=bf16/fp16, or a smaller model; for gpt, parallel.pipeline.remat: "
              "true, more micro-batches (1F1B) or more stages"),
    Signature("cpu_oom", "host out of memory",
              (r"can't allocate memory", r"^\s*MemoryError\b", r"\bMemoryError:", r"oom[-_]kill",
               r"Out of memory: Kill", r"State=OUT_OF_MEMORY"),
              "raise slurm.mem, lower data.workers or data.batch_size; an oom-kill by Slurm "
              "kills a rank without a traceback"),
    Signature("collective_timeout", "NCCL/Gloo collective timed out",
              (r"NCCL.*(timed out|[Tt]imeout)", r"Watchdog caught collective operation timeout",
               r"[Gg]loo.*(Timed out|timed out|[Tt]imeout)"),
              "one rank did not reach the collective: see the first failed or stalled rank; check "
              "the network (NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME) if every rank was alive"),
    Signature("connection_closed", "a peer rank went away (connection closed)",
              (r"Connection closed by peer", r"Connection reset by peer"),
              "a consequence: another rank died first. Look at the first failed rank, or a rank "
              "whose log ends without a traceback (killed, os._exit, OOM killer)"),
    Signature("rank_stalled", "a rank stopped progressing",
              (r"driver ERROR watchdog: .*; stalled: rank",),
              f"{STALL_DONE}; {STALL_ADVICE}"),
    Signature("stalled_collective", "ranks waiting at a collective for a stalled rank",
              (r"waiting for remainder of ranks", r"^Missing ranks:"),
              "the missing ranks are stuck outside the collective (slow I/O, a hang, a deadlock); "
              "see their logs and heartbeats"),
    Signature("native_crash", "a crash in native code (segfault, abort)",
              (r"^Fatal Python error: (Segmentation fault|Aborted|Bus error|Floating point exception|Illegal)",
               r"exited on signal (11|6|7) \("),
              "the Python stack under 'Fatal Python error' in the rank log shows the call that crashed: "
              "a C extension, a GPU driver or a corrupt input; update or rebuild that library, check "
              "data with python -m hpc_train data verify"),
    Signature("mpi_launch", "mpirun could not start the ranks",
              (r"There are not enough slots available", r"mpirun was unable to launch",
               r"prterun was unable to launch", r"\bORTE\b.*(unable|failed|ERROR)",
               r"\bPRTE\b.*(unable|failed|ERROR)", r"An ORTE daemon has unexpectedly failed",
               r"mpirun was unable to find the specified executable"),
              "slurm.tasks_per_node must fit the allocation; check the hosts in the `started` "
              "event's argv and that the venv's python exists on every node"),
    Signature("slurm_time_limit", "Slurm time limit reached",
              (r"DUE TO TIME LIMIT", r"State=TIMEOUT"),
              "raise slurm.time, or slurm.signal_seconds so the ranks checkpoint and requeue before "
              "the limit"),
    Signature("slurm_preemption", "preempted by Slurm",
              (r"DUE TO PREEMPTION", r"State=PREEMPTED"),
              "nothing to fix in the job: it resumes from its latest complete checkpoint when "
              "requeued; checkpoint more often (checkpoint.every_steps) to lose less"),
    Signature("node_failure", "a node of the job died",
              (r"DUE TO NODE FAILURE", r"State=NODE_FAIL", r"^node_lost: ",
               r"\b(ORTE|PRTE) has lost communication with a remote daemon",
               r"srun: error: Node failure on"),
              "not a fault of the code: the driver goes on without the node, in the job on a "
              "spare (slurm.spare_nodes) or the survivors (slurm.nodes a range, as 1-2), else "
              "by a requeue that excludes it (checkpoint.retries_on_node_failure; "
              "checkpoint.retries_on_failure is untouched); if all are spent, resume (python -m "
              "hpc_train resume RUN_DIR); tell the admins the node name"),
    Signature("corrupt_shard", "corrupt or unreadable data shard",
              (r"cannot open as a shard", r"DataError: .* is unreadable",
               r"record \d+ \(global index \d+, key", r"cannot read token shard",
               r"the shard is truncated", r"DataError: \S+: tokens \d+\.\.\d+: "),
              "python -m hpc_train data verify the shard directory, then re-convert the bad shard "
              "(a truncated file: an interrupted copy or conversion, or a full disk when it was "
              "written)",
              file=r"([^\s:'\"()]+\.(?:h5|hdf5|json))\b"),
    Signature("disk_full", "disk full (ENOSPC)",
              (r"\[Errno 28\]", r"No space left on device", r"\bENOSPC\b"),
              "free space on the file system of run.root (checkpoints, logs), lower "
              "checkpoint.keep_last so fewer checkpoints are kept, or put run.root on another "
              "file system (python -m hpc_train resume RUN_DIR continues from the last complete "
              "checkpoint)"),
    Signature("spec_mismatch", "spec changed since the checkpoint",
              (r"the run's spec changed since its checkpoint",),
              "python -m hpc_train resume RUN_DIR --allow-spec-change to accept, or restore spec.yaml"),
)

BY_ID = {sig.id: sig for sig in SIGNATURES}
_COMPILED = tuple((sig, tuple(re.compile(p) for p in sig.patterns)) for sig in SIGNATURES)
_MISSING_RANK = re.compile(r"^\s*(\d+): \[")
_FRAME = re.compile(r'^\s+File ".*", line \d+')     # a traceback frame; the next line is code


@dataclass(frozen=True)
class Match:
    signature: Signature
    source: str        # where the line is: a log file name, or "sacct"
    line: str

    @property
    def file(self) -> str | None:
        """The file the line names, for signatures that say which (a shard), else None."""
        if self.signature.file is None:
            return None
        found = re.search(self.signature.file, self.line)
        return found.group(1) if found else None


def match_signatures(lines: Iterable[tuple[str, str]]) -> list[Match]:
    """(source, line) pairs -> the first match of each signature, in the order they occurred."""
    found: dict[str, Match] = {}
    frame_in = None               # the source whose last line was a traceback frame
    for source, line in lines:
        if frame_in != source:    # not the code line under a frame
            for sig, patterns in _COMPILED:
                if sig.id not in found and any(p.search(line) for p in patterns):
                    found[sig.id] = Match(sig, source, line.strip())
            if len(found) == len(_COMPILED):
                break
        frame_in = source if _FRAME.match(line) else None
    return list(found.values())


def missing_ranks(lines: Iterable[str]) -> list[int]:
    """Ranks listed under Horovod's last stall warning ("Missing ranks:" then "1: [tensor...]").
    Horovod repeats the warning while a stall lasts: an earlier one is history (on a loaded node
    a rank can be a few seconds late at a collective, past HOROVOD_STALL_CHECK_TIME_SECONDS)."""
    ranks: set[int] = set()
    listing = False
    for line in lines:
        if line.startswith("Missing ranks:"):
            listing = True
            ranks = set()
            continue
        match = _MISSING_RANK.match(line) if listing else None
        if match:
            ranks.add(int(match.group(1)))
        else:
            listing = False
    return sorted(ranks)

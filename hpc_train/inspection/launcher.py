"""What the launcher (mpirun or srun) said about the rank that ended the job: the one witness
when a rank dies without a traceback (os._exit, SIGKILL from the OOM killer, a segfault in
native code).

Open MPI writes one of two reports to the driver's stderr, which submitit or slurm-*.out keeps:

    mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).

    mpirun detected that one or more processes exited with non-zero status, thus causing
    the job to be terminated. The first process to do so was:

      Process name: [[335,1],1]
      Exit code:    1

srun writes one line per task (or range of tasks) that ended badly, naming the node:

    srun: error: hpcn2: task 1: Exited with exit code 1
    srun: error: hpcn2: task 1: Killed

Open MPI 5 should say "prterun" and name a process [prterun-host-123@1,1]; both forms parse
(only Open MPI 4.1 was run here: tests/inspection/test_inspect_launcher.py holds its real output).
Pure functions of text.

Ranks that stop on purpose (a stop agreed and saved: time limit, USR2, a deadline) exit with
STOP_EXIT (75), which mpirun reports like any non-zero status: such a report is a stop, not a
failure (`RankExit.stopped`).
"""

from __future__ import annotations

import re
import signal
from collections.abc import Iterable
from dataclasses import dataclass

from hpc_train.inspection.logparse import stamp_time
from hpc_train.runtime.stop import STOP_EXIT

STOPPED_ON_PURPOSE = f"exit code {STOP_EXIT}"

_SIGNAL = re.compile(r"\b(?:mpirun|prterun) noticed that process rank (\d+) with PID \d+ on node (\S+) "
                     r"exited on signal (\d+)(?: \(([^)]*)\))?")
_PROCESS = re.compile(r"^\s*Process name:\s*\[.*,(\d+)\]\s*$")
_EXIT_CODE = re.compile(r"^\s*Exit code:\s*(-?\d+)")
_SRUN = re.compile(r"^srun: error: (\S+): tasks? (\d+)(?:-\d+)?: (.+?)\s*$")
_SRUN_EXIT = re.compile(r"Exited with exit code (\d+)")
# srun names a signal by strsignal(3)'s words: "Killed", "Segmentation fault (core dumped)".
_SIGNAL_NUMBERS = {signal.strsignal(s): s.value for s in signal.Signals if signal.strsignal(s)}
LAUNCHERS = ("mpirun", "srun")
_STARTING = re.compile(r" driver INFO starting \d+ ranks")


@dataclass(frozen=True)
class RankExit:
    rank: int
    how: str                 # "exit code 1" or "signal 9 (Killed) on node vm"
    source: str              # the driver log's file name
    line: str
    started: float | None    # when the driver started these ranks (its log line), if it said
    launcher: str = "mpirun"
    node: str | None = None  # where the rank ran, when the report says

    @property
    def stopped(self) -> bool:
        """The rank exited with STOP_EXIT: it saved and stopped on purpose."""
        return self.how == STOPPED_ON_PURPOSE


def rank_exits(lines: Iterable[tuple[str, str]]) -> list[RankExit]:
    """(source, line) pairs of driver logs -> every rank exit mpirun reported, in order."""
    found: list[RankExit] = []
    source_now, started, process = None, None, None
    for source, text in lines:
        if source != source_now:
            source_now, started, process = source, None, None
        if _STARTING.search(text):
            started = stamp_time(text)
        if match := _SIGNAL.search(text):
            name = f" ({match.group(4)})" if match.group(4) else ""
            how = f"signal {match.group(3)}{name} on node {match.group(2)}"
            found.append(RankExit(int(match.group(1)), how, source, text.strip(), started,
                                  node=match.group(2)))
        elif match := _SRUN.match(text):
            node, words = match.group(1), match.group(3)
            found.append(RankExit(int(match.group(2)), _srun_how(words, node), source,
                                  text.strip(), started, "srun", node))
        elif match := _PROCESS.match(text):
            process = (int(match.group(1)), text.strip())
            continue
        elif process and (match := _EXIT_CODE.match(text)):
            found.append(RankExit(process[0], f"exit code {match.group(1)}", source,
                                  f"{process[1]} {text.strip()}", started))
        if text.strip():
            process = None
    return found


def _srun_how(words: str, node: str) -> str:
    """srun's words for a task's end, in the form mpirun's reports take."""
    if match := _SRUN_EXIT.search(words):
        return f"exit code {match.group(1)}"
    name = words.removesuffix(" (core dumped)")
    if name in _SIGNAL_NUMBERS:
        return f"signal {_SIGNAL_NUMBERS[name]} ({name}) on node {node}"
    return f"{words} on node {node}"


def exit_hint(how: str) -> str:
    """What a rank that died this way without a traceback usually means, and where to look."""
    if how == STOPPED_ON_PURPOSE:
        return (f"exit code {STOP_EXIT} is STOP_EXIT: the ranks agreed on a stop (time limit, "
                "SIGUSR2, deadline), saved a checkpoint and exited on purpose; not a failure")
    if how.startswith("signal 9 "):
        return ("SIGKILL: most often the kernel's OOM killer or Slurm's memory limit (sacct -j JOB "
                "-o MaxRSS,ReqMem,State; dmesg on the node); raise slurm.mem or lower data.workers / "
                "data.batch_size")
    if how.startswith(("signal 11 ", "signal 6 ", "signal 7 ", "signal 4 ", "signal 8 ")):
        return ("a crash in native code (a C extension, a driver, corrupt input): the rank log ends "
                "with faulthandler's 'Fatal Python error' and the Python stack at the crash")
    if how.startswith("signal "):
        return "the rank was killed by a signal from outside (a user, an admin, Slurm)"
    return ("the rank exited without raising (os._exit / sys.exit in user code, or a C library "
            "called exit): its log's last lines show what it was doing")

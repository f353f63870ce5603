"""Live Slurm state of a job: squeue while it is queued or running, `sacct --parsable2` after.

Both may fail (no Slurm on this host, accounting off: sacct needs slurmdbd); the caller then
falls back on the run directory's events. The parsers are pure and take the commands' text.
"""

from __future__ import annotations

from dataclasses import dataclass

from hpc_train import _proc


@dataclass(frozen=True)
class SlurmInfo:
    state: str            # RUNNING, PENDING, COMPLETED, TIMEOUT, ... (first word of sacct's State)
    reason: str           # squeue's %r (why pending), or sacct's ExitCode
    source: str           # "squeue" or "sacct"


def parse_squeue(text: str) -> SlurmInfo | None:
    """`squeue -h -j ID -o %T|%r` -> state and reason; None when the job is not listed."""
    for line in text.splitlines():
        if "|" in line:
            state, reason = line.split("|", 1)
            return SlurmInfo(state.strip(), reason.strip(), "squeue")
    return None


def parse_sacct(text: str) -> SlurmInfo | None:
    """`sacct -X -n --parsable2 -o JobID,State,ExitCode -j ID` -> the job's last record.

    sacct lists one line per requeue with -D; without it the last line is the current record.
    State may read "CANCELLED by 0": the first word is the state.
    """
    rows = [line.split("|") for line in text.splitlines() if line.count("|") >= 2]
    if not rows:
        return None
    _, state, exit_code = rows[-1][:3]
    return SlurmInfo(state.split()[0] if state.strip() else "UNKNOWN", exit_code, "sacct")


def query(job_id: str, timeout: float = 5.0) -> SlurmInfo | None:
    """squeue first (live, cheap); sacct for ended jobs; None when neither answers."""
    out = _proc.run(["squeue", "-h", "-j", job_id, "-o", "%T|%r"], timeout=timeout)
    if out.ok and (info := parse_squeue(out.stdout)):
        return info
    out = _proc.run(["sacct", "-X", "-n", "--parsable2", "-o", "JobID,State,ExitCode", "-j", job_id],
                    timeout=timeout)
    return parse_sacct(out.stdout) if out.ok else None

"""`doctor --nodes N`: from a login node, one small batch job over N nodes (one task each) that
runs `doctor --allocation --json`; wait for it, bounded, and show the report it printed.

The job itself (script, sbatch, the bounded wait) is slurm/batch.py's, as `bench train
--submit`'s is.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

from hpc_train import scheduler
from hpc_train.doctor.allocation import DEFAULT_TIMEOUT
from hpc_train.errors import LaunchError, SubmitError
from hpc_train.scheduler.parse import parse_duration
from hpc_train.slurm import batch
from hpc_train.slurm.options import JobShape, sbatch_options
from hpc_train.spec import Resources

DEFAULT_TIME = "5"          # minutes: imports and an MPI start-up, many times over
DEFAULT_MEM_MB = 2048       # torch + Horovod + mpi4py in one process, with room to spare
DEFAULT_WAIT = 600.0        # queue wait included
JOB_NAME = "hpc-doctor"
OUTPUT, ERRORS, SCRIPT = "job.out", "job.err", "doctor.sbatch"


def job_memory_mb(smallest: int | None) -> int:
    """What the job asks per node: DEFAULT_MEM_MB, or less on nodes that are smaller. Some
    memory is asked for at all because without --mem a job may be given the whole node."""
    return max(1, min(DEFAULT_MEM_MB, smallest // 2)) if smallest else DEFAULT_MEM_MB


def inner_timeout(time_limit: str) -> float:
    """The probes' launch timeout inside the job: leave 30 s of the limit to report."""
    seconds = parse_duration(time_limit)
    if not seconds:
        raise SubmitError(f"--time {time_limit!r}: not a Slurm time limit (e.g. 5, 10:00, 0:05:00)")
    return max(20.0, min(DEFAULT_TIMEOUT, seconds - 30.0))


def batch_script(python: str, method: str, out_dir: Path, timeout: float) -> str:
    command = [python, "-m", "hpc_train", "doctor", "--allocation", "--json", "--launcher", method,
               "--out", str(out_dir), "--timeout", f"{timeout:g}"]
    return batch.script_text(command, comment="Written by `python -m hpc_train doctor --nodes`: "
                                              "one probe per node of this job.")


def sbatch_args(nodes: int, time_limit: str, mem_mb: int, out_dir: Path, script: Path,
                partition: str | None) -> list[str]:
    resources = Resources(partition=partition, mem=f"{mem_mb}M", time=time_limit)
    options = sbatch_options(resources, JobShape(JOB_NAME, str(out_dir / OUTPUT), nodes))
    return batch.sbatch_args({**options, "error": str(out_dir / ERRORS), "chdir": str(Path.cwd())}, script)


def parse_job_output(text: str) -> dict | None:
    """The last JSON report in the job's output (anything a site's prologue prints may come
    before it), or None."""
    decoder, found, start = json.JSONDecoder(), None, 0
    while (start := text.find("{", start)) != -1:
        try:
            value, end = decoder.raw_decode(text, start)
        except json.JSONDecodeError:
            start += 1
            continue
        if isinstance(value, dict) and "verdict" in value:
            found = value
        start = end
    return found


def failure(what: str, **extra) -> dict:
    """A report for a job that printed none."""
    problem = {"node": "", "rank": None, "what": what}
    return {"ok": False, "verdict": f"FAIL: {what}", "problems": [problem], "majority": {},
            "nodes": [], "reports": {}, **extra}


def _tail(path: Path, lines: int = 5) -> str:
    try:
        return " | ".join(path.read_text(errors="replace").strip().splitlines()[-lines:])
    except OSError:
        return ""


def check_nodes(nodes: int, method: str, partition: str | None, time_limit: str, wait: float,
                out_dir: Path | None) -> dict:
    out_dir = (out_dir or Path("runs") / f"doctor-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}").resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    script = out_dir / SCRIPT
    script.write_text(batch_script(sys.executable, method, out_dir, inner_timeout(time_limit)))
    mem = job_memory_mb(scheduler.smallest_memory(partition))
    job_id = scheduler.submit(sbatch_args(nodes, time_limit, mem, out_dir, script, partition),
                              "the doctor's job")
    print(f"doctor: job {job_id} on {nodes} node{'s' * (nodes > 1)} ({method}); waiting up to "
          f"{wait:g} s; output in {out_dir}", file=sys.stderr, flush=True)
    ended, state = batch.wait_for(job_id, wait)
    if not ended:
        scheduler.cancel([job_id])
        raise LaunchError(f"doctor job {job_id} still {state or 'unknown'} after {wait:g} s: cancelled "
                          "it. A busy queue: raise --timeout, or pick an idle --partition")
    record = scheduler.show_job(job_id)
    state = record.label if record else state or "unknown"
    output = out_dir / OUTPUT
    report = parse_job_output(output.read_text(errors="replace")) if output.is_file() else None
    if report is None:
        return failure(f"job {job_id} ended {state} without a report: "
                       f"{_tail(out_dir / ERRORS) or 'no output'}", job_id=job_id, out_dir=str(out_dir))
    report["job_id"] = job_id
    return report

"""Shared fixtures: the real single-node Slurm, and an mpirun command line for this host.

The Slurm fixture uses a cluster that already answers (`sinfo`), or starts the project's own
(env/slurm/start.sh) for the session and stops it afterwards. Under CI=true a missing cluster is
a failure, never a skip: the end-to-end tests are the point.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from hpc_train.launch.local import find_local_mpirun

REPO = Path(__file__).resolve().parents[1]
IN_CI = os.environ.get("CI", "").lower() == "true"


def _unavailable(reason: str):
    if IN_CI:
        pytest.fail(f"{reason} (CI=true: the real component is required)")
    pytest.skip(reason)


def _slurm_answers() -> bool:
    try:
        return subprocess.run(["sinfo", "-h"], capture_output=True, timeout=10).returncode == 0
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return False


@dataclass
class SlurmCluster:
    started_here: bool
    job_ids: list[str] = field(default_factory=list)

    def sbatch(self, *args: str) -> str:
        """Submit with --parsable; remember the id so teardown can cancel leftovers."""
        out = subprocess.run(["sbatch", "--parsable", *args], capture_output=True, text=True,
                             timeout=30, check=True).stdout.strip()
        job_id = out.split(";")[0]
        self.job_ids.append(job_id)
        return job_id

    def wait_state(self, job_id: str, states: set[str], timeout: float = 120) -> str:
        """Poll sacct until the job reaches one of `states`; return the state."""
        deadline = time.monotonic() + timeout
        state = ""
        while time.monotonic() < deadline:
            out = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "State"],
                                 capture_output=True, text=True, timeout=20).stdout.split()
            state = out[0] if out else ""
            if state in states:
                return state
            time.sleep(1)
        raise AssertionError(f"job {job_id} still {state or 'unknown'} after {timeout} s")


@pytest.fixture(scope="session")
def slurm_cluster():
    if _slurm_answers():
        cluster = SlurmCluster(started_here=False)
    else:
        if os.geteuid() != 0:
            _unavailable("no Slurm answers and env/slurm/start.sh needs root")
        start = subprocess.run(["bash", str(REPO / "env/slurm/start.sh")], capture_output=True,
                               text=True, timeout=300)
        if start.returncode != 0:
            _unavailable(f"env/slurm/start.sh failed:\n{start.stdout}\n{start.stderr}")
        cluster = SlurmCluster(started_here=True)
    yield cluster
    if cluster.job_ids:
        subprocess.run(["scancel", *cluster.job_ids], capture_output=True, timeout=30)
    if cluster.started_here:
        subprocess.run(["bash", str(REPO / "env/slurm/stop.sh")], capture_output=True, timeout=120)


@pytest.fixture(scope="session")
def mpirun_argv():
    """`mpirun_argv(n)` -> the argv prefix that starts n ranks on this host."""
    mpirun = find_local_mpirun()
    if mpirun is None:
        _unavailable("mpirun not on PATH (bash env/setup.sh installs OpenMPI)")
    return mpirun.argv


@pytest.fixture(scope="session")
def python() -> str:
    return sys.executable

"""The 2-node Slurm on one machine (env/slurm/start.sh --nodes 2): a job spans both nodes, and MPI
ranks on the two nodes reduce together, started by mpirun inside the job or by srun --mpi=pmix."""

import os
import shutil
import subprocess

import pytest

pytestmark = [pytest.mark.multinode, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}

# Rank 0 prints the world size, the allreduce of rank+1 over all ranks, and every rank's hostname.
MPI_CHECK = """\
import socket
from mpi4py import MPI
comm = MPI.COMM_WORLD
total = comm.allreduce(comm.rank + 1)
hosts = comm.gather(socket.gethostname())
if comm.rank == 0:
    print(f"size={comm.size} sum={total} hosts={','.join(hosts)}", flush=True)
"""


def _expected(nodes: list[str]) -> str:
    return f"size=2 sum=3 hosts={','.join(nodes[:2])}"


def _run_job(cluster, tmp_path, name: str, command: str) -> str:
    """One task on each of 2 nodes with 2G each; returns the job's output once it completed."""
    out = tmp_path / f"{name}.out"
    job_id = cluster.sbatch("-N", "2", "--ntasks-per-node=1", "--mem=2G", "--time=2", "-J", name,
                            "-o", str(out), "--wrap", command)
    state = cluster.wait_state(job_id, ENDED, timeout=60)
    text = out.read_text() if out.exists() else "(no output file)"
    assert state == "COMPLETED", f"job {job_id} {state}:\n{text}"
    return text


@pytest.fixture
def mpi_check(tmp_path, python):
    script = tmp_path / "mpi_check.py"
    script.write_text(MPI_CHECK)
    return f"{python} {script}"


def test_job_spans_both_nodes(slurm_nodes, tmp_path):
    text = _run_job(slurm_nodes, tmp_path, "mn-hostname", "srun hostname")
    assert sorted(text.split()) == slurm_nodes.nodes[:2]


def test_mpirun_in_allocation_reduces_across_nodes(slurm_nodes, tmp_path, mpi_check):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not on PATH (bash env/setup.sh installs OpenMPI)")
    root = "--allow-run-as-root " if os.geteuid() == 0 else ""
    # Open MPI starts the remote orted through srun (plm slurm), one rank per allocated node.
    text = _run_job(slurm_nodes, tmp_path, "mn-mpirun", f"{mpirun} {root}{mpi_check}")
    assert _expected(slurm_nodes.nodes) in text


def test_srun_pmix_reduces_across_nodes(slurm_nodes, mpi_check):
    run = subprocess.run(["srun", "-N", "2", "--ntasks-per-node=1", "--mem=2G", "--time=2", "--mpi=pmix",
                          "-J", "mn-pmix", *mpi_check.split()],
                         capture_output=True, text=True, timeout=90, env=slurm_nodes.env)
    assert run.returncode == 0, run.stderr
    assert _expected(slurm_nodes.nodes) in run.stdout

"""The 8-node Slurm on one machine (env/slurm/start.sh --nodes 8): every node answers and one step
spans all eight; a job spans two nodes, and MPI ranks on the two reduce together, started by
mpirun inside the job or by srun --mpi=pmix; and what the cluster's stop must remove is found
by env/slurm/leftovers.sh (.ci/run runs it after the stop)."""

import os
import re
import shutil
import subprocess

from tests.conftest import CLUSTER_NODES, REPO

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


def _assert_reduced_on_two(text: str, nodes: list[str]) -> None:
    """Rank 0's line: 2 ranks, their sum, on two distinct nodes of the cluster."""
    found = re.search(r"size=2 sum=3 hosts=(\S+),(\S+)", text)
    assert found, text
    assert found[1] != found[2] and {found[1], found[2]} <= set(nodes), text


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


def test_every_node_answers_and_one_step_spans_all(slurm_nodes):
    assert len(slurm_nodes.nodes) == CLUSTER_NODES
    states = subprocess.run(["sinfo", "-h", "-N", "-o", "%N %T"], capture_output=True, text=True,
                            timeout=30, env=slurm_nodes.env).stdout.split("\n")
    answering = {line.split()[0] for line in states if line.strip() and "*" not in line.split()[1]
                 and line.split()[1].rstrip("~#!%$@^-") not in ("down", "drained", "fail")}
    assert answering == set(slurm_nodes.nodes), states
    run = subprocess.run(["srun", "-N", str(CLUSTER_NODES), "--ntasks-per-node=1", "--mem=100M", "--time=2",
                          "-J", "mn-all", "hostname"], capture_output=True, text=True, timeout=180,
                         env=slurm_nodes.env)
    assert run.returncode == 0, run.stderr
    assert sorted(run.stdout.split()) == sorted(slurm_nodes.nodes)


def test_leftovers_lists_what_a_running_cluster_holds(slurm_nodes):
    """While the cluster runs, each thing its stop must remove is there to be found."""
    check = subprocess.run(["bash", str(REPO / "env/slurm/leftovers.sh"), "--nodes", str(CLUSTER_NODES)],
                           capture_output=True, text=True, timeout=60)
    found = set(check.stdout.splitlines())
    assert check.returncode == 1, check.stdout + check.stderr
    assert "bridge hpcnbr0" in found
    for node in slurm_nodes.nodes:
        assert {f"netns {node}", f"link {node}-br"} <= found, found
        assert any(line.startswith(f"process slurmd-{node} ") for line in found), found


def test_job_spans_two_nodes(slurm_nodes, tmp_path):
    text = _run_job(slurm_nodes, tmp_path, "mn-hostname", "srun hostname")
    hosts = text.split()
    assert len(set(hosts)) == 2 and set(hosts) <= set(slurm_nodes.nodes), text


def test_mpirun_in_allocation_reduces_across_nodes(slurm_nodes, tmp_path, mpi_check):
    mpirun = shutil.which("mpirun")
    if mpirun is None:
        pytest.skip("mpirun not on PATH (bash env/setup.sh installs OpenMPI)")
    root = "--allow-run-as-root " if os.geteuid() == 0 else ""
    # Open MPI starts the remote orted through srun (plm slurm), one rank per allocated node.
    text = _run_job(slurm_nodes, tmp_path, "mn-mpirun", f"{mpirun} {root}{mpi_check}")
    _assert_reduced_on_two(text, slurm_nodes.nodes)


def test_srun_pmix_reduces_across_nodes(slurm_nodes, mpi_check):
    run = subprocess.run(["srun", "-N", "2", "--ntasks-per-node=1", "--mem=2G", "--time=2", "--mpi=pmix",
                          "-J", "mn-pmix", *mpi_check.split()],
                         capture_output=True, text=True, timeout=90, env=slurm_nodes.env)
    assert run.returncode == 0, run.stderr
    _assert_reduced_on_two(run.stdout, slurm_nodes.nodes)

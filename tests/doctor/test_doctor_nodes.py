"""`doctor --nodes N` end to end: a real batch job whose probes start with mpirun or srun on the
single-node and the 2-node Slurm of this machine, and a faulty node that must be named."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from hpc_train.doctor.faults import DOCTOR_FAULT_ENV
from tests.conftest import REPO

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def doctor_nodes(cluster, tmp_path, nodes: int, *args: str, env_extra=None) -> tuple[int, dict, str]:
    """Run `doctor --nodes N --json`; (exit status, the report, stderr). The job's id goes to the
    fixture, whose teardown cancels it should the doctor be stopped before it ends."""
    env = {**(cluster.env or os.environ), **(env_extra or {})}
    run = subprocess.run([sys.executable, "-m", "hpc_train", "doctor", "--nodes", str(nodes), "--json",
                          "--out", str(tmp_path / "doctor"), "--timeout", "120", *args],
                         capture_output=True, text=True, timeout=180, cwd=REPO, env=env)
    if m := re.search(r"doctor: job (\d+)", run.stderr):
        cluster.job_ids.append(m.group(1))
    assert run.stdout.strip(), run.stderr
    return run.returncode, json.loads(run.stdout), run.stderr


def _failing(report: dict) -> str:
    return json.dumps({k: report.get(k) for k in ("verdict", "problems", "launcher")}, indent=1)


@pytest.mark.multinode
@pytest.mark.parametrize("launcher", ["mpirun", "srun"])
def test_two_nodes_agree(slurm_nodes, tmp_path, launcher):
    code, report, stderr = doctor_nodes(slurm_nodes, tmp_path, 2, "--launcher", launcher)
    assert code == 0 and report["ok"], _failing(report)
    assert [n["node"] for n in report["nodes"]] == slurm_nodes.nodes[:2]
    assert all(node in report["verdict"] for node in slurm_nodes.nodes[:2])
    assert report["launcher"]["method"] == launcher
    assert {r["allreduce"]["mpi_size"] for r in report["reports"].values()} == {2}
    assert f"job {report['job_id']}" in stderr


@pytest.mark.multinode
def test_a_node_with_another_version_is_named(slurm_nodes, tmp_path):
    faulty, good = slurm_nodes.nodes[1], slurm_nodes.nodes[0]
    code, report, _ = doctor_nodes(slurm_nodes, tmp_path, 2,
                                   env_extra={DOCTOR_FAULT_ENV: f"version@{faulty}"})
    assert code == 1 and not report["ok"]
    assert [p["node"] for p in report["problems"]] == [faulty], _failing(report)
    what = report["problems"][0]["what"]
    assert "hpc_train" in what and good in what
    assert faulty in report["verdict"] and report["verdict"].startswith("FAIL")


def test_one_node(slurm_cluster, tmp_path):
    code, report, _ = doctor_nodes(slurm_cluster, tmp_path, 1)
    assert code == 0 and report["ok"], _failing(report)
    assert len(report["nodes"]) == 1 and report["nodes"][0]["node"] in report["verdict"]
    assert report["reports"]["0"]["master"]["ok"] and report["reports"]["0"]["allreduce"]["ok"]

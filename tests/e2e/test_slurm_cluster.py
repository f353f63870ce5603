"""The Slurm fixture gives a real cluster: a batch job runs and accounting records it."""

import subprocess

import pytest

from tests.runs import wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_sbatch_job_runs_and_sacct_sees_it(slurm_cluster, tmp_path):
    out = tmp_path / "job.out"
    job_id = slurm_cluster.sbatch("--time=1", "--mem=100", "-o", str(out), "-J", "hpc-train-fixture",
                                  "--wrap", 'echo "ran on $(hostname -s) as job $SLURM_JOB_ID"')
    # Timeouts catch hangs only: on a shared cluster the job may queue behind others' for minutes.
    assert slurm_cluster.wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED"}, timeout=900) == "COMPLETED"
    assert f"as job {job_id}" in out.read_text()
    # slurmdbd records a job in several messages; the name can lag the final state briefly
    # (seen here: 'allocation' for a moment): wait for accounting to agree (the timeout: a hang).
    wait_for(lambda: subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "JobName"],
                                    capture_output=True, text=True, timeout=20).stdout.strip()
             == "hpc-train-fixture", 300, f"sacct to name job {job_id} hpc-train-fixture")


def test_failing_job_is_recorded_as_failed(slurm_cluster, tmp_path):
    job_id = slurm_cluster.sbatch("--time=1", "--mem=100", "-o", str(tmp_path / "fail.out"),
                                  "--wrap", "exit 3")
    assert slurm_cluster.wait_state(job_id, {"COMPLETED", "FAILED"}, timeout=900) == "FAILED"
    code = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "ExitCode"],
                          capture_output=True, text=True, timeout=20).stdout.strip()
    assert code == "3:0"

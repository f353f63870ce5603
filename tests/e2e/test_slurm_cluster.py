"""The Slurm fixture gives a real cluster: a batch job runs and accounting records it."""

import subprocess
import time

import pytest

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def test_sbatch_job_runs_and_sacct_sees_it(slurm_cluster, tmp_path):
    out = tmp_path / "job.out"
    job_id = slurm_cluster.sbatch("--time=1", "--mem=100", "-o", str(out), "-J", "hpc-train-fixture",
                                  "--wrap", 'echo "ran on $(hostname -s) as job $SLURM_JOB_ID"')
    assert slurm_cluster.wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED"}) == "COMPLETED"
    assert f"as job {job_id}" in out.read_text()
    # slurmdbd records a job in several messages; the name can lag the final state briefly
    # (seen here: 'allocation' for a moment), so give accounting a few seconds to agree.
    deadline, name = time.monotonic() + 20, ""
    while time.monotonic() < deadline and name != "hpc-train-fixture":
        name = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "JobName"],
                              capture_output=True, text=True, timeout=20).stdout.strip()
        time.sleep(0.5)
    assert name == "hpc-train-fixture"


def test_failing_job_is_recorded_as_failed(slurm_cluster, tmp_path):
    job_id = slurm_cluster.sbatch("--time=1", "--mem=100", "-o", str(tmp_path / "fail.out"),
                                  "--wrap", "exit 3")
    assert slurm_cluster.wait_state(job_id, {"COMPLETED", "FAILED"}) == "FAILED"
    code = subprocess.run(["sacct", "-n", "-X", "-P", "-j", job_id, "-o", "ExitCode"],
                          capture_output=True, text=True, timeout=20).stdout.strip()
    assert code == "3:0"

"""`submit jobs/smoke.yaml` on the real Slurm: Horovod ranks under mpirun, end to end.

Variants (DDP, FP16, accumulation) are submitted together and then awaited, so the single
node runs them side by side.
"""

from __future__ import annotations

import os
import subprocess
import time

import pytest

from hpc_train.rundir import RunPaths, read_jsonl
from tests.conftest import heavy_params, selected_plan
from tests.runs import assert_trained, cli, describe_failure, events, path_without, submit

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

HALF_PRECISION_SHORT = ["optim.max_steps=12", "optim.warmup_epochs=0.05", "log.every_steps=3"]
VARIANTS = {
    "horovod-fp32": [],
    "ddp": ["parallel.backend=ddp", "optim.epochs=1", "log.every_steps=4"],
    # Half-precision autocast is about 10x slower than fp32 on this CPU: a short run.
    "horovod-fp16": ["precision.mode=fp16", "parallel.compression=fp16", *HALF_PRECISION_SHORT],
    "horovod-bf16": ["precision.mode=bf16", *HALF_PRECISION_SHORT],
    "horovod-accumulation-2": ["parallel.accumulation=2", "data.batch_size=16", "optim.epochs=1", "log.every_steps=4"],
}


# With --heavy, each beside the CI test that trains its path on real ranks:
# - ddp: DDP's smoke job (DDP trains on Slurm in test_node_writes_e2e, test_sharded_e2e and
#   test_multinode_e2e);
# - horovod-fp16: fp16 autocast, the loss scaler and fp16 compression under Horovod
#   (tests/train/test_resume_exact.py's fp16 run, resumed bit-identical under mpirun);
# - horovod-bf16: the same autocast path as fp16, without its loss scaler;
# - horovod-accumulation-2: accumulation across ranks (tests/train/test_accumulation.py, two
#   ranks under mpirun against one process, both backends).
# A rendered script run with plain sbatch: test_requeue_e2e.py's `nosignal` job.
HEAVY = {"ddp", "horovod-fp16", "horovod-bf16", "horovod-accumulation-2"}


@pytest.fixture(scope="module")
def submitted(slurm_cluster, tmp_path_factory, request):
    root = tmp_path_factory.mktemp("runs")
    jobs = {}
    for name, overrides in selected_plan(request.config, VARIANTS, HEAVY).items():
        job_id, paths = submit("jobs/smoke.yaml", root, f"run.name={name}", *overrides)
        slurm_cluster.job_ids.append(job_id)
        jobs[name] = (job_id, paths)
    return jobs


@pytest.mark.parametrize("variant", heavy_params(VARIANTS, HEAVY))
def test_smoke_job_trains_to_completion(variant, submitted, slurm_cluster):
    job_id, paths = submitted[variant]
    state = slurm_cluster.wait_state(job_id, {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT"}, timeout=400)
    assert state == "COMPLETED", describe_failure(paths)
    assert_trained(paths, loss_factor=0.8 if "16" in variant else 0.5)
    assert paths.sbatch.is_file() and "#SBATCH --signal=B:USR2@60" in paths.sbatch.read_text()
    started = events(paths, "started")[0]
    assert started["ranks"] == 2 and started["job_id"] == job_id
    assert "mpirun" in started["argv"][0]


def test_submitted_script_follows_the_one_driver_pattern(submitted):
    _, paths = submitted["horovod-fp32"]
    script = paths.sbatch.read_text()
    for line in ("#SBATCH --ntasks-per-node=2", "#SBATCH --requeue", "#SBATCH --open-mode=append",
                 "#SBATCH --signal=B:USR2@60"):
        assert line in script.splitlines(), line
    assert "srun" not in script                     # one driver, not N copies through srun
    assert "\nexec " in script                      # USR2 reaches Python, not a bash that dies


def test_without_sbatch_submit_runs_locally(tmp_path):
    # This machine's PATH minus the Slurm client commands: a login node without Slurm.
    env = {**os.environ, "PATH": path_without(tmp_path / "bin")}
    assert subprocess.run(["which", "sbatch"], env=env, capture_output=True).returncode != 0
    out = cli("submit", "jobs/smoke.yaml", "--set", f"run.root={tmp_path}/runs",
              "--set", "optim.max_steps=4", "--set", "log.every_steps=2", env=env)
    assert out.returncode == 0, out.stderr
    assert "local executor" in out.stderr
    run_dir = next((tmp_path / "runs").glob("smoke-*"))
    paths = RunPaths(run_dir)
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and not events(paths, "finished"):
        time.sleep(1)
    assert events(paths, "finished")[-1]["status"] == "completed", describe_failure(paths)
    assert [m["step"] for m in read_jsonl(paths.metrics) if "split" not in m] == [2, 4]
    # submitit's local task imported the run's code snapshot too (set in its setup lines).
    submitted, job = read_jsonl(paths.environment)
    assert (submitted["where"], job["where"]) == ("submit", "job")
    assert job["code"] == str(paths.code / "hpc_train") and submitted["snapshot"]["files"] > 100

"""The user's own model and dataset on the real Slurm: jobs/user_cnn.yaml as shipped (a lab's
package outside ours, examples/user_cnn/lab_cnn, named by reference) submitted with `submit`.

Both runs below also take the lab's own loss and metrics (task.name lab_cnn.steps:train_step,
task.eval lab_cnn.steps:eval_step): the classification loss they replace is every other job's.

- Uninterrupted, it trains (the loss halves), logs the step's own metrics in its metrics lines
  (training and validation) and its code snapshot holds the user's package.
- Under FSDP (one unit per block, the model's own `fsdp_units` hint), stopped by USR2 to the batch
  shell at step 8, it saves, requeues itself and ends COMPLETED with every rank's shards,
  optimizer and buffers bit-identical to the uninterrupted FSDP run, the loss of every step
  equal: exact resume holds for the user's model, map-style dataset and step as for ours. With
  --heavy the same under Horovod (the shipped backend, trained above in CI) and DDP.
- A model that does not build fails the job with the user's traceback (their file and line) in
  the rank's log and in `diagnose`.
"""

from __future__ import annotations

import subprocess

import pytest

from hpc_train.rundir import read_jsonl
from tests.conftest import heavy_params, selected_plan
from tests.runs import (assert_same_training, assert_trained, cli, describe_failure, events,
                        logged_step, submit, wait_for)

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
SPEC = "jobs/user_cnn.yaml"
TOTAL_STEPS = 46           # 1 epoch of 3,000 demo images at 64 per step, the tail dropped
WATCH = ["log.every_steps=1", "optim.epochs=1",
         "task.name=lab_cnn.steps:train_step", "task.eval=lab_cnn.steps:eval_step"]
BROKEN = """
def build():
    return make_layers()      # the user's bug: make_layers is not defined
"""


BACKENDS = {"horovod": [], "ddp": ["parallel.backend=ddp"], "fsdp": ["parallel.backend=fsdp"]}
# CI: the shipped (Horovod) run straight, and the exact resume under FSDP (a sharded user model);
# the exact resume under Horovod and DDP with --heavy (lifecycle covers it for our smoke job).
HEAVY = {"stopped-horovod", "straight-ddp", "stopped-ddp"}


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory, request):
    root = tmp_path_factory.mktemp("usercode")
    broken = root / "broken_lab"
    broken.mkdir()
    (broken / "__init__.py").write_text("")
    (broken / "nets.py").write_text(BROKEN)
    plan = {f"{kind}-{backend}": [*WATCH, *overrides] for backend, overrides in BACKENDS.items()
            for kind in ("straight", "stopped")}
    plan["broken"] = [f"run.code=[examples/user_cnn, {root}]", "model.name=broken_lab.nets:build",
                      "model.options={}", "checkpoint.retries_on_failure=0", "launch.restarts_in_job=0"]
    submitted = {}
    for name, overrides in selected_plan(request.config, plan, HEAVY).items():
        job_id, paths = submit(SPEC, root, f"run.name={name}", *overrides)
        slurm_cluster.job_ids.append(job_id)
        submitted[name] = (job_id, paths)
    for name in [n for n in submitted if n.startswith("stopped-")]:
        job_id, paths = submitted[name]
        wait_for(lambda: logged_step(paths) >= 8, 900, f"step 8 of {name}")
        subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], check=True, timeout=30)
    return submitted


def test_the_users_model_and_data_train_and_travel_with_the_run(jobs, slurm_cluster):
    job_id, paths = jobs["straight-horovod"]
    assert slurm_cluster.wait_state(job_id, ENDED, timeout=1200) == "COMPLETED", describe_failure(paths)
    assert_trained(paths)
    lines = read_jsonl(paths.metrics)
    steps = [m for m in lines if m.get("split") is None]
    assert len(steps) == TOTAL_STEPS and all(0 <= m["top1"] <= 1 for m in steps), steps[-1]
    (val,) = [m for m in lines if m.get("split") == "val"]
    assert set(val) >= {"loss", "top1", "confidence"} and "accuracy" not in val, val
    code = paths.code.resolve()
    assert (code / "lab_cnn" / "model.py").is_file() and (code / "hpc_train").is_dir()
    assert events(paths, "started")[0]["ranks"] == 2


@pytest.mark.parametrize("backend", heavy_params(["fsdp", "horovod", "ddp"], {"horovod", "ddp"}))
def test_stopped_and_requeued_it_ends_bit_identical(backend, jobs, slurm_cluster):
    job_id, paths = jobs[f"stopped-{backend}"]
    assert slurm_cluster.wait_state(job_id, ENDED, timeout=1200) == "COMPLETED", describe_failure(paths)
    straight_id, straight = jobs[f"straight-{backend}"]
    assert slurm_cluster.wait_state(straight_id, ENDED, timeout=1200) == "COMPLETED"
    requeued = events(paths, "requeued")
    assert [(e["cause"], e["by"]) for e in requeued] == [("stop", "driver")], requeued
    assert events(paths, "resumed")[0]["step"] == events(paths, "stop_saved")[0]["step"]
    assert_same_training(paths, straight, TOTAL_STEPS)


def test_a_model_that_does_not_build_shows_the_users_traceback(jobs, slurm_cluster):
    job_id, paths = jobs["broken"]
    assert slurm_cluster.wait_state(job_id, ENDED, timeout=900) == "FAILED", describe_failure(paths)
    log = paths.rank_log(0).read_text()
    assert "broken_lab/nets.py\", line 3, in build" in log and "NameError" in log, log[-3000:]
    diagnosis = cli("diagnose", str(paths.root)).stdout
    assert "nets.py" in diagnosis and "make_layers" in diagnosis, diagnosis

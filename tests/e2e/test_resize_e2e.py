"""A run stopped mid-epoch and resumed on another world size, on the real Slurm: every sample of
every epoch trained exactly once, in the epoch's order, at the uninterrupted run's LR.

`jobs/smoke.yaml` as shipped (2 ranks, 2 epochs of 3000 HDF5 JPEGs, 64 samples per step) is
stopped by USR2 near step 15 and `resume`d with `--set slurm.tasks_per_node=N
--allow-spec-change` on 1 and on 4 ranks, under Horovod and under DDP (on 1 rank with Horovod,
`parallel.keep_global_batch: true` keeps the 64 samples per step by accumulating 2 passes);
`jobs/transformer_pipeline_cpu.yaml` goes from 2 replicas (4 ranks) to 1 (2 ranks). Every rank
appends what it trained to the test-only sample ledger (train/ledger.py).

What "exactly once" means: tests/ledger.py. The LR of a step is the schedule at the position it
reaches (train/schedule.py) times the linear rule's scale for its samples per step: where a
resumed step reaches the same position as one of the uninterrupted run, their LRs are equal
after that scale (exactly equal where the global batch was kept).
"""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor

import pytest

from hpc_train.spec import load_spec
from tests.conftest import heavy_params, selected_plan
from tests.ledger import assert_every_sample_once_in_order, read_ledger
from tests.runs import cli, describe_failure, events, heartbeat_step, submit, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
SMOKE, PIPELINE = "jobs/smoke.yaml", "jobs/transformer_pipeline_cpu.yaml"
# The stop ends the job (no requeue) so that `resume` submits it again on other ranks.
STOPPED = ["log.every_steps=1", "checkpoint.max_requeues=0"]
STOP_AT = 12                # the ranks agree on a stop every 5 steps: it saves at step 15
# name: (spec file, backend, ranks resumed on, extra overrides of the resume)
PLAN = {
    "horovod-to-1": (SMOKE, "horovod", 1, ["parallel.keep_global_batch=true"]),
    "horovod-to-4": (SMOKE, "horovod", 4, []),
    "ddp-to-1": (SMOKE, "ddp", 1, []),
    "ddp-to-4": (SMOKE, "ddp", 4, []),
    "pipeline-to-1-replica": (PIPELINE, "ddp", 2, []),
}
# CI's reduced form (the rest with --heavy): Horovod to fewer ranks (keeping the global batch) and
# to more ranks; DDP's are the same sample arithmetic, the pipeline's its own.
HEAVY = {"ddp-to-1", "ddp-to-4", "pipeline-to-1-replica"}


def _stop_then_resume(slurm_cluster, root, name: str) -> dict:
    """Submit `name` on its shipped ranks, stop it mid-epoch, resume it on others, wait."""
    spec_file, backend, ranks, extra = PLAN[name]
    ledger = root / f"{name}.ledger"
    job_id, paths = submit(spec_file, root, f"run.name={name}", f"parallel.backend={backend}",
                           f"launch.env.HPC_TRAIN_SAMPLE_LEDGER={ledger}", *STOPPED)
    slurm_cluster.job_ids.append(job_id)
    wait_for(lambda: heartbeat_step(paths) >= STOP_AT, 2400, f"step {STOP_AT} of {name}")
    subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], check=True, timeout=30)
    first = slurm_cluster.wait_state(job_id, ENDED, timeout=900)
    wait_for(lambda: events(paths, "finished"), 60, f"{name}'s driver to record the stop")
    args = ["resume", str(paths.root), "--allow-spec-change", "--set", f"slurm.tasks_per_node={ranks}"]
    for override in extra:
        args += ["--set", override]
    resumed = cli(*args)
    assert resumed.returncode == 0, resumed.stderr
    again = re.search(r"^job id:\s+(\S+)$", resumed.stdout, re.M).group(1)
    slurm_cluster.job_ids.append(again)
    last = slurm_cluster.wait_state(again, ENDED, timeout=2400)
    return {"paths": paths, "ledger": ledger, "states": (first, last), "said": resumed.stderr}


def _straight(slurm_cluster, root, spec_file: str) -> dict:
    name = "straight-" + spec_file.split("/")[-1].removesuffix(".yaml")
    ledger = root / f"{name}.ledger"
    job_id, paths = submit(spec_file, root, f"run.name={name}",
                           f"launch.env.HPC_TRAIN_SAMPLE_LEDGER={ledger}", "log.every_steps=1")
    slurm_cluster.job_ids.append(job_id)
    return {"paths": paths, "ledger": ledger,
            "states": (slurm_cluster.wait_state(job_id, ENDED, timeout=2400),)}


@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory, request):
    """Every selected run at once (the node runs what fits), with the uninterrupted run of each
    spec they use; each waits in a thread of its own."""
    root = tmp_path_factory.mktemp("resize")
    plan = selected_plan(request.config, PLAN, HEAVY)
    specs = {spec for spec, *_ in plan.values()}
    with ThreadPoolExecutor(max_workers=len(plan) + len(specs)) as pool:
        futures = {name: pool.submit(_stop_then_resume, slurm_cluster, root, name) for name in plan}
        futures.update({spec: pool.submit(_straight, slurm_cluster, root, spec) for spec in specs})
        return {name: future.result(timeout=5400) for name, future in futures.items()}


def _lr_by_position(rows: list[dict]) -> dict[int, tuple[float, int]]:
    return {row["position"]: (row["lr"], row["samples_per_step"]) for row in rows}


@pytest.mark.parametrize("name", heavy_params(PLAN, HEAVY))
def test_a_run_resumed_on_another_world_size_trains_every_sample_once_at_its_lr(runs, name):
    run, spec_file = runs[name], PLAN[name][0]
    straight = runs[spec_file]
    paths = run["paths"]
    assert run["states"][1] == "COMPLETED", describe_failure(paths)
    assert straight["states"][0] == "COMPLETED", describe_failure(straight["paths"])
    spec = load_spec(paths.spec)
    assert spec.world_size == PLAN[name][2]
    assert "world size" in run["said"] and "samples per step" in run["said"], run["said"]

    stop = events(paths, "stop_saved")[0]["step"]
    resumed = events(paths, "resumed")[-1]
    assert resumed["from_checkpoint"] == stop and resumed["consumed"] > 0      # mid-epoch
    started = events(paths, "training_started")[-1]
    assert started["world_size"] == spec.world_size
    assert events(paths, "finished")[-1]["status"] == "completed"

    rows, reference = read_ledger(run["ledger"]), read_ledger(straight["ledger"])
    size = started["epoch_samples"]
    trained = assert_every_sample_once_in_order(rows, spec, size)
    assert_every_sample_once_in_order(reference, load_spec(straight["paths"].spec), size)
    # Steps derived from the samples: the final step is the stop's plus the rest at the new batch.
    assert max(e["step"] for e in events(paths, "rank_finished")) == started["total_steps"]

    expected = _lr_by_position(reference)
    got = _lr_by_position(rows)
    shared = sorted(expected.keys() & got.keys())
    assert len(shared) >= min(len(got), len(expected)) // 2, "too few common step ends to compare"
    for position in shared:
        (lr, per_step), (lr0, per_step0) = got[position], expected[position]
        assert lr * per_step0 / per_step == pytest.approx(lr0, rel=1e-9), position
    kept = spec.samples_per_step == load_spec(straight["paths"].spec).samples_per_step
    if kept:
        assert shared == sorted(expected) and all(got[p][0] == expected[p][0] for p in shared)
    print(f"[resize] {name}: stopped at step {stop}, resumed on {spec.world_size} rank(s), "
          f"{spec.samples_per_step} samples per step, {started['total_steps']} steps in all; "
          f"samples trained per epoch {trained}; {len(shared)} step ends shared with the "
          f"uninterrupted run, LR equal at each after the linear rule's scale"
          + (" (and exactly: global batch kept)" if kept else ""))

"""A run stopped mid-epoch and resumed on other world sizes, on the real Slurm: every sample of
every epoch trained exactly once, in the epoch's order, at the uninterrupted run's LR.

CI's chain: `jobs/smoke.yaml` as shipped (2 ranks, 2 epochs of 3000 HDF5 JPEGs, 64 samples per
step) under Horovod is stopped by USR2 near step 15 and `resume`d with `--set
slurm.tasks_per_node=4 --allow-spec-change` (128 samples per step, the peak LR scaled by the
linear rule); stopped again a few steps into the second epoch, and resumed on 1 rank with
`parallel.keep_global_batch: true`, which keeps the last checkpoint's 128 samples per step by
accumulating 4 passes (and with them its peak LR). One sample ledger covers the three segments.
With --heavy, the same chain under DDP, and `jobs/transformer_pipeline_cpu.yaml` from 2 replicas
(4 ranks) to 1 (2 ranks). Every rank appends what it trained to the test-only sample ledger
(train/ledger.py).

What "exactly once" means: tests/ledger.py. The LR of a step is the schedule at the position it
reaches (train/schedule.py) times the linear rule's scale for its samples per step: where a
resumed step reaches the same position as one of the uninterrupted run, their LRs are equal
after that scale (exactly equal where the segment has the uninterrupted run's samples per step).
"""

from __future__ import annotations

import re
import subprocess
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

import pytest

from hpc_train.spec import load_spec
from tests.conftest import heavy_params, selected_plan
from tests.ledger import assert_every_sample_once_in_order, read_ledger
from tests.runs import cli, describe_failure, events, heartbeat_step, metrics_after, submit, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
SMOKE, PIPELINE, USER = "jobs/smoke.yaml", "jobs/transformer_pipeline_cpu.yaml", "jobs/user_cnn.yaml"
# A stop ends the job (no requeue) so that `resume` submits it again on other ranks.
STOPPED = ["log.every_steps=1", "checkpoint.max_requeues=0"]
STOP_AT = 12                # the ranks agree on a stop every 5 steps: it saves at step 15
KEEP = "parallel.keep_global_batch=true"


class Resume(NamedTuple):
    """One `resume` of the chain: on `ranks`, with `extra` overrides. Every resume but the last
    is stopped again once it has trained into the next epoch (mid-epoch there)."""
    ranks: int
    extra: tuple[str, ...] = ()


# name: (spec file, backend, the resumes after the first stop, in order)
PLAN = {
    "horovod-2-4-1": (SMOKE, "horovod", (Resume(4), Resume(1, (KEEP,)))),
    "ddp-2-4-1": (SMOKE, "ddp", (Resume(4), Resume(1))),
    "pipeline-to-1-replica": (PIPELINE, "ddp", (Resume(2),)),
    "user-cnn-2-4-1": (USER, "horovod", (Resume(4), Resume(1))),     # the user's own dataset
}
# CI's reduced form (the rest with --heavy): the Horovod chain, to more ranks (the linear rule)
# and then to fewer keeping the global batch; DDP's chain is the same sample arithmetic, the
# pipeline's its own; the user's dataset goes through the same sampler and ledger as the shards.
HEAVY = {"ddp-2-4-1", "pipeline-to-1-replica", "user-cnn-2-4-1"}


def _stop(cluster, job_id: str, paths, when, what: str, stops: int) -> str:
    """USR2 to the batch shell once `when()`; the job's end state once the driver recorded it."""
    wait_for(when, 2400, what)
    subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], check=True, timeout=30)
    state = cluster.wait_state(job_id, ENDED, timeout=900)
    wait_for(lambda: len(events(paths, "finished")) >= stops, 60, f"the driver to record stop {stops}")
    return state


def _into_next_epoch(paths, index: int):
    """Whether the segment that the `index`-th resume started has logged a step of the epoch
    after the one it resumed in (False until it has resumed)."""
    def when() -> bool:
        resumed = events(paths, "resumed")
        if len(resumed) <= index:
            return False
        return any(m["epoch"] > resumed[index]["epoch"] for m in metrics_after(paths, resumed[index]["time"]))
    return when


def _chain(slurm_cluster, root, name: str) -> dict:
    """Submit `name` on its shipped ranks, stop it mid-epoch, resume it on others (and stop and
    resume again, as its plan says), wait for the end."""
    spec_file, backend, resumes = PLAN[name]
    ledger = root / f"{name}.ledger"
    job_id, paths = submit(spec_file, root, f"run.name={name}", f"parallel.backend={backend}",
                           f"launch.env.HPC_TRAIN_SAMPLE_LEDGER={ledger}", *STOPPED)
    slurm_cluster.job_ids.append(job_id)
    states, said = [], []
    when, what = (lambda: heartbeat_step(paths) >= STOP_AT), f"step {STOP_AT} of {name}"
    for index, resume in enumerate(resumes):
        states.append(_stop(slurm_cluster, job_id, paths, when, what, index + 1))
        args = ["resume", str(paths.root), "--allow-spec-change", "--set",
                f"slurm.tasks_per_node={resume.ranks}"]
        for override in resume.extra:
            args += ["--set", override]
        resumed = cli(*args)
        assert resumed.returncode == 0, resumed.stderr
        said.append(resumed.stderr)
        job_id = re.search(r"^job id:\s+(\S+)$", resumed.stdout, re.M).group(1)
        slurm_cluster.job_ids.append(job_id)
        when, what = _into_next_epoch(paths, index), f"{name} on {resume.ranks} rank(s) in its next epoch"
    states.append(slurm_cluster.wait_state(job_id, ENDED, timeout=2400))
    return {"paths": paths, "ledger": ledger, "states": states, "said": said}


def _straight(slurm_cluster, root, spec_file: str) -> dict:
    name = "straight-" + spec_file.split("/")[-1].removesuffix(".yaml")
    ledger = root / f"{name}.ledger"
    job_id, paths = submit(spec_file, root, f"run.name={name}",
                           f"launch.env.HPC_TRAIN_SAMPLE_LEDGER={ledger}", "log.every_steps=1")
    slurm_cluster.job_ids.append(job_id)
    return {"paths": paths, "ledger": ledger,
            "states": [slurm_cluster.wait_state(job_id, ENDED, timeout=2400)]}


@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory, request):
    """Every selected chain at once (the node runs what fits), with the uninterrupted run of each
    spec they use; each waits in a thread of its own."""
    root = tmp_path_factory.mktemp("resize")
    plan = selected_plan(request.config, PLAN, HEAVY)
    specs = {spec for spec, *_ in plan.values()}
    with ThreadPoolExecutor(max_workers=len(plan) + len(specs)) as pool:
        futures = {name: pool.submit(_chain, slurm_cluster, root, name) for name in plan}
        futures.update({spec: pool.submit(_straight, slurm_cluster, root, spec) for spec in specs})
        return {name: future.result(timeout=5400) for name, future in futures.items()}


def _lr_by_position(rows: list[dict]) -> dict[int, tuple[float, int]]:
    return {row["position"]: (row["lr"], row["samples_per_step"]) for row in rows}


def _segments(rows: list[dict]) -> list[list[dict]]:
    """The ledger's rows by the start of the ranks that trained them, in the order written."""
    by_launch: dict[str, list[dict]] = {}
    for row in rows:
        by_launch.setdefault(row["launch"], []).append(row)
    return list(by_launch.values())


@pytest.mark.parametrize("name", heavy_params(PLAN, HEAVY))
def test_a_run_resumed_on_other_world_sizes_trains_every_sample_once_at_its_lr(runs, name):
    run, (spec_file, _, resumes) = runs[name], PLAN[name]
    straight = runs[spec_file]
    paths = run["paths"]
    assert run["states"][-1] == "COMPLETED", describe_failure(paths)
    assert straight["states"][0] == "COMPLETED", describe_failure(straight["paths"])
    spec, reference_spec = load_spec(paths.spec), load_spec(straight["paths"].spec)
    assert spec.world_size == resumes[-1].ranks
    for said in run["said"]:
        assert "world size" in said and "samples per step" in said, said

    # Each resume from its stop's checkpoint, mid-epoch, on the ranks asked for.
    stops = [e["step"] for e in events(paths, "stop_saved")]
    resumed = events(paths, "resumed")
    assert [e["from_checkpoint"] for e in resumed] == stops and len(stops) == len(resumes)
    assert all(e["consumed"] > 0 for e in resumed), resumed                     # mid-epoch
    started = events(paths, "training_started")
    ranks = [reference_spec.world_size, *(r.ranks for r in resumes)]
    assert [e["world_size"] for e in started] == ranks
    assert events(paths, "finished")[-1]["status"] == "completed"

    rows, reference = read_ledger(run["ledger"]), read_ledger(straight["ledger"])
    size = started[-1]["epoch_samples"]
    trained = assert_every_sample_once_in_order(rows, spec, size)
    assert_every_sample_once_in_order(reference, reference_spec, size)
    # Steps derived from the samples: the final step is the last stop's plus the rest at its batch.
    assert max(e["step"] for e in events(paths, "rank_finished")) == started[-1]["total_steps"]

    # The LR, segment by segment (each start of the ranks is one: nothing failed, nothing was
    # trained twice), against the uninterrupted run's at the positions both reach.
    expected = _lr_by_position(reference)
    segments = _segments(rows)
    assert len(segments) == len(ranks), "a segment trained nothing"
    compared = []
    for index, segment in enumerate(segments):
        got = _lr_by_position(segment)
        (per_step,) = {s for _, s in got.values()}
        assert per_step == started[index]["global_batch"], (index, per_step, started[index])
        span = [p for p in expected if min(got) <= p <= max(got)]
        shared = sorted(expected.keys() & got.keys())
        assert len(shared) >= min(len(got), len(span)) // 2, f"segment {index}: too few common step ends"
        for position in shared:
            (lr, _), (lr0, per_step0) = got[position], expected[position]
            assert lr * per_step0 / per_step == pytest.approx(lr0, rel=1e-9), (index, position)
        if per_step == reference_spec.samples_per_step:
            # The uninterrupted run's global batch: its steps, at exactly its LR.
            assert shared == span and all(got[p][0] == expected[p][0] for p in shared), index
        if index and KEEP in resumes[index - 1].extra:
            # Kept the last checkpoint's samples per step, by accumulation: and so its peak LR.
            previous = started[index - 1]
            assert (per_step, started[index]["peak_lr"]) == (previous["global_batch"], previous["peak_lr"])
            if index == len(segments) - 1:      # the written spec is this segment's
                assert spec.parallel.accumulation > 1
                assert spec.parallel.accumulation * spec.replicas * spec.data.batch_size == per_step
            assert "kept" in run["said"][index - 1], run["said"][index - 1]
        compared.append(f"{started[index]['world_size']} rank(s) x {len(segment) // per_step} steps "
                        f"of {per_step} ({len(shared)} step ends shared)")
    print(f"[resize] {name}: stopped at steps {stops}; segments: {'; '.join(compared)}; "
          f"{started[-1]['total_steps']} steps in all; samples trained per epoch {trained}; LR equal "
          f"at each shared step end after the linear rule's scale")

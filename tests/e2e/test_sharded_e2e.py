"""Sharded data parallelism on the real Slurm, with the shipped specs as users submit them.

- `jobs/transformer_zero_cpu.yaml` as shipped (gpt, DeepSpeed ZeRO-3 on 2 ranks) and with
  `parallel.backend=fsdp`, and `jobs/smoke.yaml` (ResNet on the HDF5 shards, workers,
  augmentation) with fsdp and with DeepSpeed ZeRO-1, on the single-node cluster;
- the ZeRO-3 spec with one rank on each of two nodes of the multi-node cluster.
Each trains to completion with its loss falling, every rank finishing at the same step (with the
same whole-model digest, but under ZeRO-3), and sharded checkpoints in the run directory (every rank's part).
The first-step losses against DDP, resumes at other world sizes and the bit-identical stop and
resume are tests/train/test_fsdp.py and tests/parallel/test_deepspeed.py (local mpirun).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from hpc_train.rundir import read_jsonl
from tests.runs import describe_failure, events, submit

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
ZERO, SMOKE = "jobs/transformer_zero_cpu.yaml", "jobs/smoke.yaml"
PLAN = {"zero3-gpt": (ZERO, []),
        "fsdp-gpt": (ZERO, ["parallel.backend=fsdp"]),
        "fsdp-smoke": (SMOKE, ["parallel.backend=fsdp"]),
        "zero1-smoke": (SMOKE, ["parallel.backend=deepspeed", "parallel.deepspeed.stage=1"])}


def _run(cluster, root, name: str, env=None, *more: str) -> dict:
    spec, overrides = PLAN[name]
    job_id, paths = submit(spec, root, f"run.name={name}", *overrides, *more, env=env)
    cluster.job_ids.append(job_id)
    return {"paths": paths, "state": cluster.wait_state(job_id, ENDED, timeout=1500)}


def _assert_sharded_run_trained(run: dict, whole_digest: bool = True) -> None:
    """whole_digest: the ranks' end digests cover the whole model (not under ZeRO-3, whose
    parameters each rank holds only a shard of at the end: a known gap)."""
    paths = run["paths"]
    assert run["state"] == "COMPLETED", describe_failure(paths)
    finished = events(paths, "rank_finished")
    assert {e["rank"] for e in finished} == {0, 1}
    assert len({e["step"] for e in finished}) == 1
    if whole_digest:
        assert len({e["params_sha256"] for e in finished}) == 1, "ranks ended with different models"
    losses = [m["loss"] for m in read_jsonl(paths.metrics) if m.get("split") is None]
    assert len(losses) >= 3 and losses[-1] < 0.8 * losses[0], losses
    last = sorted(paths.checkpoints.glob("step-*"))[-1]
    parts = [p for p in (last / "sharded").rglob("*") if p.is_file()]
    assert len(parts) >= 2, f"{last}: no sharded part of every rank ({parts})"


@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("sharded")
    with ThreadPoolExecutor(max_workers=len(PLAN)) as pool:
        futures = {name: pool.submit(_run, slurm_cluster, root, name) for name in PLAN}
        return {name: future.result(timeout=3000) for name, future in futures.items()}


@pytest.mark.parametrize("name", list(PLAN))
def test_a_sharded_run_trains_to_completion(runs, name):
    _assert_sharded_run_trained(runs[name], whole_digest=name != "zero3-gpt")


@pytest.mark.multinode
def test_zero3_across_two_nodes(slurm_nodes, tmp_path):
    run = _run(slurm_nodes, tmp_path, "zero3-gpt", slurm_nodes.env,
               "slurm.nodes=2", "slurm.tasks_per_node=1")
    _assert_sharded_run_trained(run, whole_digest=False)
    hosts = events(run["paths"], "started")[0]["hosts"]
    assert len(set(hosts)) == 2 and set(hosts) <= set(slurm_nodes.nodes), hosts

"""Sharded data parallelism on the real Slurm, with the shipped specs as users submit them.

`jobs/transformer_zero_cpu.yaml` (gpt, text) and `jobs/smoke.yaml` (ResNet on the HDF5 shards,
workers, augmentation), each under fsdp and DeepSpeed ZeRO 1, 2 and 3, beside the same spec under
DDP, on the single-node cluster; and with one rank on each of two nodes of the multi-node cluster.
Each trains to completion with its loss falling, every rank at the same step with the same
whole-model digest, sharded checkpoints holding every rank's part, its first step's loss DDP's
within 1e-6 (fp32, same seed and data) and its final validation loss within 2% of DDP's.

CI runs every backend on the GPT spec and fsdp and ZeRO-1 on the smoke spec on one node, and
ZeRO-3 (gpt) and fsdp (smoke) across two nodes; `--heavy` runs the rest of the matrix. A run across
two nodes is compared with its DDP twin across the same two nodes, so the multi-node tests need
nothing of the single-node cluster (CI runs them in a lane of their own, beside the others).
Stopped three ways and bit-identical: tests/e2e/test_lifecycle_e2e.py. Resumes at other world
sizes: tests/train/test_fsdp.py (local mpirun).
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest

from hpc_train.rundir import read_jsonl
from tests.conftest import heavy_requested
from tests.runs import NO_WORKERS, describe_failure, events, submit

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
SPECS = {"gpt": "jobs/transformer_zero_cpu.yaml", "smoke": "jobs/smoke.yaml"}
BACKENDS = {"ddp": ["parallel.backend=ddp"], "fsdp": ["parallel.backend=fsdp"],
            **{f"zero{stage}": ["parallel.backend=deepspeed", f"parallel.deepspeed.stage={stage}"]
               for stage in (1, 2, 3)}}
# CI's reduced form: the GPT spec under fsdp and ZeRO-3 (and ZeRO-1 on smoke) on one node, fsdp
# smoke and ZeRO-3 GPT across two; the DDP twin of each spec. The rest with --heavy.
ONE_NODE_CI = {("gpt", "ddp"), ("gpt", "fsdp"), ("gpt", "zero3"), ("smoke", "ddp"), ("smoke", "zero1")}
TWO_NODES_CI = {("gpt", "zero3"), ("smoke", "fsdp")}


def _selected(ci: set[tuple[str, str]]) -> list:
    """Every (spec, sharded backend), marked heavy where CI does not run it."""
    return [pytest.param(spec, backend, marks=[] if (spec, backend) in ci else [pytest.mark.heavy])
            for spec in SPECS for backend in BACKENDS if backend != "ddp"]


def _run(cluster, root, spec: str, backend: str, *more: str) -> dict:
    loading = [NO_WORKERS] if spec == "smoke" else []
    job_id, paths = submit(SPECS[spec], root, f"run.name={spec}-{backend}", *BACKENDS[backend], *loading, *more,
                           env=cluster.env)
    cluster.job_ids.append(job_id)
    return {"paths": paths, "state": cluster.wait_state(job_id, ENDED, timeout=1500)}


def _losses(run: dict) -> tuple[list[float], float]:
    """(the training losses logged, the last validation loss)."""
    metrics = read_jsonl(run["paths"].metrics)
    return ([m["loss"] for m in metrics if m.get("split") is None],
            [m["loss"] for m in metrics if m.get("split") == "val"][-1])


def _assert_trained_as_ddp(run: dict, ddp: dict) -> None:
    paths = run["paths"]
    assert run["state"] == "COMPLETED", describe_failure(paths)
    finished = events(paths, "rank_finished")
    assert {e["rank"] for e in finished} == {0, 1}
    assert len({e["step"] for e in finished}) == 1
    assert len({e["params_sha256"] for e in finished}) == 1, "ranks ended with different models"
    (losses, val), (ddp_losses, ddp_val) = _losses(run), _losses(ddp)
    assert len(losses) >= 3 and losses[-1] < 0.8 * losses[0], losses
    assert abs(losses[0] - ddp_losses[0]) <= 1e-6, (losses[0], ddp_losses[0])
    assert abs(val - ddp_val) <= 0.02 * ddp_val, (val, ddp_val)
    last = sorted(paths.checkpoints.glob("step-*"))[-1]
    parts = [p for p in (last / "sharded").rglob("*") if p.is_file()]
    assert len(parts) >= 2, f"{last}: no sharded part of every rank ({parts})"


@pytest.fixture(scope="module")
def one_node(slurm_cluster, tmp_path_factory, request):
    """Every selected run of the module on the single-node cluster, submitted at once, with the
    DDP twin of each spec."""
    heavy = heavy_requested(request.config)
    wanted = {(s, b) for s in SPECS for b in BACKENDS if heavy or (s, b) in ONE_NODE_CI}
    root = tmp_path_factory.mktemp("sharded")
    with ThreadPoolExecutor(max_workers=len(wanted)) as pool:
        futures = {key: pool.submit(_run, slurm_cluster, root, *key) for key in wanted}
        return {key: future.result(timeout=3000) for key, future in futures.items()}


@pytest.mark.parametrize("spec, backend", _selected(ONE_NODE_CI))
def test_a_sharded_run_trains_as_ddp_does(one_node, spec, backend):
    _assert_trained_as_ddp(one_node[spec, backend], one_node[spec, "ddp"])


@pytest.fixture(scope="module")
def two_nodes(slurm_nodes, tmp_path_factory, request):
    """Every selected run across two nodes of the multi-node cluster (one rank on each), with the
    DDP twin of each spec across two nodes too, submitted at once."""
    heavy = heavy_requested(request.config)
    sharded = {(s, b) for s in SPECS for b in BACKENDS if b != "ddp" and (heavy or (s, b) in TWO_NODES_CI)}
    wanted = sharded | {(spec, "ddp") for spec, _ in sharded}
    root = tmp_path_factory.mktemp("sharded-two-nodes")
    across = ("slurm.nodes=2", "slurm.tasks_per_node=1")
    with ThreadPoolExecutor(max_workers=len(wanted)) as pool:
        futures = {key: pool.submit(_run, slurm_nodes, root, *key, *across) for key in wanted}
        return {key: future.result(timeout=3000) for key, future in futures.items()}


@pytest.mark.multinode
@pytest.mark.parametrize("spec, backend", _selected(TWO_NODES_CI))
def test_a_sharded_run_across_two_nodes_trains_as_ddp_does(two_nodes, slurm_nodes, spec, backend):
    run = two_nodes[spec, backend]
    _assert_trained_as_ddp(run, two_nodes[spec, "ddp"])
    hosts = events(run["paths"], "started")[0]["hosts"]
    assert len(set(hosts)) == 2 and set(hosts) <= set(slurm_nodes.nodes), hosts

"""Node-local copies on the 2-node Slurm: the smoke job with `data.copy_to` under a directory per
node ($SLURMD_NODENAME, as a node-local disk would be). Each node copies the shards once; the
requeued run copies nothing; a later job finds one node's copy damaged and replaces just that."""

from __future__ import annotations

import subprocess

import pytest

from tests.conftest import REPO
from tests.runs import NO_WORKERS, assert_trained, describe_failure, events, logged_step, submit, wait_for

pytestmark = [pytest.mark.multinode, pytest.mark.slurm, pytest.mark.mpi, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def _copies(paths, since: float = 0.0) -> dict[str, dict]:
    return {e["host"]: e for e in events(paths, "data_copied") if e["time"] > since}


def test_each_node_copies_once_keeps_across_a_requeue_and_replaces_a_damaged_copy(slurm_nodes, tmp_path):
    local = tmp_path / "local"
    place = f"{local}/$SLURMD_NODENAME"
    common = ["slurm.nodes=2", "slurm.tasks_per_node=1", f"data.copy_to={place}", "log.every_steps=2",
              NO_WORKERS]
    job_id, paths = submit("jobs/smoke.yaml", tmp_path, "run.name=local-copy", *common, env=slurm_nodes.env)
    slurm_nodes.job_ids.append(job_id)
    first = wait_for(lambda: len(_copies(paths)) == 2 and _copies(paths), 300, "both nodes copied")
    nodes = events(paths, "started")[0]["hosts"]     # the two of the cluster's that Slurm gave
    assert sorted(first) == sorted(nodes) and set(nodes) <= set(slurm_nodes.nodes)
    for node in nodes:
        assert first[node]["local"] and first[node]["copied"] > 0 and first[node]["kept"] == 0
        assert first[node]["root"] == f"{local}/{node}/demo-shards"
    wait_for(lambda: logged_step(paths) >= 10, 300, "step 10")
    sent = events(paths, "data_copied")[-1]["time"]
    subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], check=True, timeout=30,
                   env=slurm_nodes.env)
    state = slurm_nodes.wait_state(job_id, ENDED, timeout=600)
    assert state == "COMPLETED", describe_failure(paths)
    assert_trained(paths, ranks=2)
    again = _copies(paths, since=sent)
    assert sorted(again) == sorted(nodes) and len(events(paths, "started")) == 2
    for node in nodes:
        assert (again[node]["copied"], again[node]["kept"]) == (0, first[node]["copied"])
    # One byte of one shard on the second node, same size: only its sha256 tells.
    victim = local / nodes[1] / "demo-shards" / "train" / "shard-00002.h5"
    data = bytearray(victim.read_bytes())
    data[len(data) // 3] ^= 0xFF
    victim.write_bytes(bytes(data))
    job_id, later = submit("jobs/smoke.yaml", tmp_path, "run.name=local-copy-later", *common,
                           "optim.max_steps=4", env=slurm_nodes.env)
    slurm_nodes.job_ids.append(job_id)
    assert slurm_nodes.wait_state(job_id, ENDED, timeout=600) == "COMPLETED", describe_failure(later)
    found = _copies(later)
    assert (found[nodes[0]]["copied"], found[nodes[0]]["replaced"]) == (0, 0)
    assert (found[nodes[1]]["copied"], found[nodes[1]]["replaced"]) == (1, 1)
    assert victim.read_bytes() == (REPO / "data/demo-shards/train/shard-00002.h5").read_bytes()

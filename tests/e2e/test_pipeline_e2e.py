"""A pipeline job through `submit` on the real Slurm: 2 stages x 2 replicas of the gpt model,
stopped mid-run by USR2 (what Slurm sends before the time limit), requeued by its driver, and
resumed to exactly the weights and losses of an uninterrupted run.

The interrupted run reads HDF5 token shards written by `data tokenize --generate` from the same
bytes that the uninterrupted run generates in memory (`data.kind: text`), so equal results also
show that the two data paths feed identical samples."""

from __future__ import annotations

import subprocess
import time

import pytest

from hpc_train.rundir import read_jsonl
from tests.runs import cli, describe_failure, events, heartbeat_step, submit

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
SPEC = "jobs/transformer_pipeline_cpu.yaml"
# 1F1B, remat and a time-balanced cut: the resume must restore every part of a stage.
RUN = ["optim.max_steps=30", "checkpoint.every_steps=10", "log.every_steps=5",
       "parallel.pipeline.schedule=1f1b", "parallel.pipeline.remat=true"]
STOP_AT_STEP = 12   # between periodic checkpoints: only the stop's own save has this step


@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory):
    root = tmp_path_factory.mktemp("pipeline")
    shards = root / "tokens"
    # The text run's corpus: train_samples (2048) x seq_len (64) + 1 bytes, seed run.seed (0).
    out = cli("data", "tokenize", "--generate", str(2048 * 64 + 1), "--val-fraction", "0",
              "--out", str(shards))
    assert out.returncode == 0, out.stderr
    data = {"interrupted": ["data.kind=tokens", f"data.path={shards}"], "straight": []}
    submitted = {}
    for name in ("interrupted", "straight"):       # the node runs one 4-rank job at a time
        job_id, paths = submit(SPEC, root, f"run.name={name}", *RUN, *data[name])
        slurm_cluster.job_ids.append(job_id)
        submitted[name] = (job_id, paths)
    job_id, paths = submitted["interrupted"]
    deadline = time.monotonic() + 600
    while heartbeat_step(paths) < STOP_AT_STEP and time.monotonic() < deadline:
        time.sleep(0.2)
    assert heartbeat_step(paths) >= STOP_AT_STEP, describe_failure(paths)
    # To the batch shell only, as Slurm's --signal=B:USR2 does before the time limit.
    subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], check=True, timeout=30)
    for name, (job_id, paths) in submitted.items():
        state = slurm_cluster.wait_state(job_id, ENDED, timeout=600)
        assert state == "COMPLETED", f"{name}: {state}\n{describe_failure(paths)}"
    return {name: paths for name, (_, paths) in submitted.items()}


def stage_digests(paths) -> dict[int, set[str]]:
    digests: dict[int, set[str]] = {}
    for e in events(paths, "rank_finished"):
        digests.setdefault(e["stage"], set()).add(e["params_sha256"])
    return digests


def test_the_pipeline_job_stops_saves_requeues_and_resumes_where_it_stopped(runs):
    paths = runs["interrupted"]
    stops = events(paths, "stop_saved")
    assert [e["reason"] for e in stops] == ["SIGUSR2"], describe_failure(paths)
    assert stops[0]["step"] >= STOP_AT_STEP
    assert (events(paths, "requeued")[0]["by"], events(paths, "requeued")[0]["cause"]) == ("driver", "stop")
    assert events(paths, "resumed")[0]["from_checkpoint"] == stops[0]["step"]
    assert [e["restart"] for e in events(paths, "started")] == [0, 1]
    assert events(paths, "finished")[-1]["status"] == "completed"
    # Each stage's weights were saved once (by replica 0), beside every rank's own file.
    step_dir = next(p for p in (paths.checkpoints).glob("step-*") if p.name.endswith(f"{stops[0]['step']:08d}"))
    assert sorted(p.name for p in step_dir.glob("stage-*.pt")) == ["stage-00000.pt", "stage-00001.pt"]


def test_the_resumed_run_ends_identical_to_an_uninterrupted_one(runs):
    interrupted, straight = stage_digests(runs["interrupted"]), stage_digests(runs["straight"])
    assert sorted(straight) == [0, 1]
    for stage in (0, 1):
        assert len(straight[stage]) == 1          # both replicas of a stage agree exactly
        assert interrupted[stage] == straight[stage], f"stage {stage} differs after the resume"
    losses = {name: {m["step"]: m["loss"] for m in read_jsonl(paths.metrics) if "split" not in m}
              for name, paths in runs.items()}
    assert losses["interrupted"] == losses["straight"]
    steps = sorted(losses["straight"])
    assert steps[-1] == 30 and losses["straight"][30] < 0.8 * losses["straight"][5]   # it learns

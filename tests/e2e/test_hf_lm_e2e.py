"""A user's Hugging Face model on the real multi-node Slurm: jobs/hf_lm.yaml as shipped (a
transformers GPT-2 and text read with `datasets`, examples/hf_lm, named by reference) in two
pipeline stages, one on each of two nodes, cut where `model.blocks` says.

Stopped by USR2 to the batch shell (what Slurm sends before the time limit) at step 8, it saves,
requeues itself and ends COMPLETED with each stage's weights and every step's loss as the
uninterrupted run's: exact resume holds for a user's model cut into stages, across nodes.
With --heavy, the same under FSDP and DeepSpeed ZeRO-3 (one rank on each node, data parallel).
The local runs of tests/train/test_hf_lm.py cover those backends in CI (under mpirun).
"""

from __future__ import annotations

import subprocess

import pytest

from hpc_train.rundir import read_jsonl
from tests.conftest import heavy_params, require, selected_plan
from tests.runs import assert_same_training, describe_failure, events, logged_step, submit, wait_for

pytestmark = [pytest.mark.multinode, pytest.mark.slurm, pytest.mark.mpi, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
SPEC = "jobs/hf_lm.yaml"
ACROSS = ["slurm.nodes=2", "slurm.tasks_per_node=1"]
STEPS, STOP_AT = 30, 8
RUN = [f"optim.max_steps={STEPS}", "log.every_steps=1", "checkpoint.every_steps=10"]
# The stopped job sleeps 0.5 s in every step (the test-only pace, no change to the numbers): the
# tiny model's 30 steps would otherwise end before the signal arrives; 11 s are left after step 8.
PACED = {"stopped": ["launch.env.HPC_TRAIN_FAULT=pace:0.5"], "straight": []}
LAYOUTS = {
    "pipeline": ["parallel.pipeline.stages=2", "model.blocks=hf_lm.model:blocks",
                 "parallel.pipeline.microbatches=8"],
    "fsdp": ["parallel.backend=fsdp", "parallel.fsdp.units=[GPT2Block]"],
    "zero3": ["parallel.backend=deepspeed", "parallel.deepspeed.stage=3"],
}
HEAVY = {"fsdp", "zero3"}


@pytest.fixture(scope="module")
def jobs(slurm_nodes, tmp_path_factory, request):
    """Per layout, an uninterrupted job and one stopped by USR2 at step STOP_AT: all submitted at
    once, each pair judged by its test."""
    require("transformers")
    require("datasets")
    root = tmp_path_factory.mktemp("hf-lm")
    submitted = {}
    for layout, overrides in selected_plan(request.config, LAYOUTS, HEAVY).items():
        for kind in ("straight", "stopped"):
            job_id, paths = submit(SPEC, root, f"run.name={layout}-{kind}", *ACROSS, *RUN, *overrides,
                                   *PACED[kind], env=slurm_nodes.env)
            slurm_nodes.job_ids.append(job_id)
            submitted[layout, kind] = (job_id, paths)
    for layout in {layout for layout, _ in submitted}:
        job_id, paths = submitted[layout, "stopped"]
        wait_for(lambda: logged_step(paths) >= STOP_AT, 900, f"step {STOP_AT} of {paths.root.name}")
        subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], check=True, timeout=30,
                       env=slurm_nodes.env)
    states = {key: slurm_nodes.wait_state(job_id, ENDED, timeout=1200)
              for key, (job_id, _) in submitted.items()}
    return {key: (states[key], paths) for key, (_, paths) in submitted.items()}


def _stopped_and_resumed(state: str, paths) -> None:
    assert state == "COMPLETED", describe_failure(paths)
    [stop] = events(paths, "stop_saved")
    assert stop["reason"] == "SIGUSR2" and stop["step"] >= STOP_AT
    [requeued] = events(paths, "requeued")
    assert (requeued["by"], requeued["cause"]) == ("driver", "stop")
    assert [e["from_checkpoint"] for e in events(paths, "resumed")] == [stop["step"]]
    for started in events(paths, "started"):          # one rank on each of two nodes, each run
        assert len(set(started["hosts"])) == 2, started


def _losses(paths) -> dict[int, float]:
    return {m["step"]: m["loss"] for m in read_jsonl(paths.metrics) if m.get("split") is None}


def test_the_hf_model_in_two_stages_on_two_nodes_resumes_bit_identical(jobs):
    (state, straight), (stopped_state, stopped) = jobs["pipeline", "straight"], jobs["pipeline", "stopped"]
    assert state == "COMPLETED", describe_failure(straight)
    _stopped_and_resumed(stopped_state, stopped)
    digests = {}
    for run in (straight, stopped):
        finished = events(run, "rank_finished")[-2:]
        assert sorted((e["rank"], e["stage"]) for e in finished) == [(0, 0), (1, 1)]
        digests[run.root.name] = {e["stage"]: e["params_sha256"] for e in finished}
    assert digests[stopped.root.name] == digests[straight.root.name], "a stage differs after the resume"
    expected = _losses(straight)
    assert sorted(expected) == list(range(1, STEPS + 1)) and expected[STEPS] < expected[1]
    assert _losses(stopped) == expected


@pytest.mark.parametrize("layout", heavy_params(["fsdp", "zero3"], HEAVY))
def test_the_hf_model_sharded_on_two_nodes_resumes_bit_identical(layout, jobs):
    (state, straight), (stopped_state, stopped) = jobs[layout, "straight"], jobs[layout, "stopped"]
    assert state == "COMPLETED", describe_failure(straight)
    _stopped_and_resumed(stopped_state, stopped)
    assert_same_training(stopped, straight, STEPS)

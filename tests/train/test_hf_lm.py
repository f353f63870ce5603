"""jobs/hf_lm.yaml on real mpirun ranks, driven without Slurm: a Hugging Face transformers GPT-2
and text read with `datasets` (examples/hf_lm, a user's package named by reference) trains in
two pipeline stages cut at the blocks model.blocks returns, its stage checkpoints export as the
Hugging Face model's own state dict, and a run stopped mid-way and resumed ends bit-identical to
one that never stopped. With --heavy, the same model under DDP, FSDP and DeepSpeed ZeRO-3.

Tiny runs: 32-token sequences of a few kilobytes of text, 8 steps, no data workers. One
uninterrupted pipeline run serves every test that reads or compares with one.
"""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from hpc_train.checkpoint import layout
from hpc_train.data.tokens import generate_corpus
from hpc_train.rundir import RunPaths, read_jsonl
from hpc_train.runtime.stop import STOP_EXIT
from tests.conftest import REPO, heavy_params, require
from tests.runs import assert_identical, cli, describe_failure, drive, events, local_run, train_losses

pytestmark = [pytest.mark.mpi, pytest.mark.slow]

SPEC = "jobs/hf_lm.yaml"
SEQ = 32
PIPELINE = ("parallel.pipeline.stages=2", "model.blocks=hf_lm.model:blocks",
            "parallel.pipeline.microbatches=8")
# 36 training sequences: 4 steps of 8 (one pipeline replica of 8 sequences) an epoch, 2 epochs.
TINY = (f"data.options.seq_len={SEQ}", "optim.epochs=2", "optim.warmup_epochs=0.25", "optim.base_lr=0.5",
        "log.every_steps=1", "checkpoint.every_steps=null", "checkpoint.keep_last=10")
TOTAL = 8
STOP = 5          # a USR2 at step 2: the ranks agree on stops every 5 steps


def text_root(root: Path, train: int, val: int) -> str:
    """ROOT/train.txt and val.txt holding `train` and `val` sequences of SEQ tokens."""
    root.mkdir(parents=True, exist_ok=True)
    (root / "train.txt").write_bytes(generate_corpus(train * SEQ + 1, seed=0))
    (root / "val.txt").write_bytes(generate_corpus(val * SEQ + 1, seed=1))
    return str(root)


def run(root: Path, name: str, *overrides: str, stop: bool = False) -> RunPaths:
    paths = local_run(root, *TINY, *overrides, name=name, spec_file=SPEC)
    if stop:
        assert drive(paths, signal_at_step=2, signum=signal.SIGUSR2) == STOP_EXIT, describe_failure(paths)
    else:
        assert drive(paths) == 0, describe_failure(paths)
    return paths


@pytest.fixture(scope="module")
def pipeline_data(tmp_path_factory) -> str:
    require("transformers")
    require("datasets")
    # 8 validation sequences: one whole batch for the pipeline's one replica.
    return text_root(tmp_path_factory.mktemp("hf-text"), train=36, val=8)


@pytest.fixture(scope="module")
def straight(pipeline_data, tmp_path_factory) -> RunPaths:
    """The uninterrupted 2-stage run that the tests below read and compare with."""
    return run(tmp_path_factory.mktemp("hf-straight"), "hf", *PIPELINE,
               f"data.options.root={pipeline_data}")


def assert_learned(paths: RunPaths, steps: int = TOTAL) -> None:
    losses = train_losses(paths)
    assert len(losses) == steps and losses[-1] < losses[0] - 0.5, losses
    val = [m for m in read_jsonl(paths.metrics) if m.get("split") == "val"]
    assert [m["epoch"] for m in val] == [0, 1] and val[-1]["loss"] < val[0]["loss"], val
    assert 0 <= val[-1]["accuracy"] <= 1
    assert events(paths, "finished")[-1]["status"] == "completed"


def test_the_hf_model_trains_in_two_pipeline_stages(straight):
    assert_learned(straight)
    [cut] = events(straight, "pipeline_cut")
    assert sum(cut["sizes"]) == 4 and len(cut["sizes"]) == 2   # embeddings, 2 layers, head
    finished = events(straight, "rank_finished")
    assert sorted(e["stage"] for e in finished) == [0, 1]
    final = straight.checkpoints / layout.step_dir_name(TOTAL)
    assert [p.name for p in layout.stage_files(final)] == ["stage-00000.pt", "stage-00001.pt"]
    logged = read_jsonl(straight.metrics)[0]
    assert "samples_per_s" in logged and "images_per_s" not in logged   # sequences, not images


def test_export_writes_the_stages_as_the_hf_models_own_state_dict(straight, tmp_path, monkeypatch):
    """The stage files' block-index names map onto GPT2LMHeadModel's names through the blocks,
    which share its modules: the exported file loads into a fresh model with no name changed."""
    import torch

    from hpc_train.models.blocks import block_list

    out = cli("export", str(straight.root), "-o", str(tmp_path / "lm.pt"))
    assert out.returncode == 0, out.stderr
    saved = torch.load(tmp_path / "lm.pt", weights_only=True)
    assert f"hf_lm.model:byte_gpt2 (task causal_lm) from step {TOTAL}" in out.stdout
    assert (saved["meta"]["model"], saved["meta"]["task"]) == ("hf_lm.model:byte_gpt2", "causal_lm")
    assert "transformer.h.1.attn.c_attn.weight" in saved["state_dict"]
    monkeypatch.syspath_prepend(str(REPO / "examples/hf_lm"))
    from hf_lm.model import byte_gpt2

    model = byte_gpt2(**saved["meta"]["model_options"])
    model.load_state_dict(saved["state_dict"])
    staged = block_list("hf_lm.model:byte_gpt2", model, "hf_lm.model:blocks").state_dict()
    final = straight.checkpoints / layout.step_dir_name(TOTAL)
    for path in layout.stage_files(final):
        for name, tensor in torch.load(path, weights_only=True)["model"].items():
            assert torch.equal(staged[name], tensor), name


def final_files(paths: RunPaths) -> dict:
    """Every state file of the last checkpoint (replicated, each rank's, each stage's). Of a
    rank's RNG streams, torch's (dropout's): Python's and numpy's start from each process's own
    entropy, which nothing here seeds, so two runs never share them."""
    import torch

    directory = paths.checkpoints / layout.step_dir_name(TOTAL)
    files = {p.name: torch.load(p, weights_only=True) for p in sorted(directory.glob("*.pt"))}
    for name in files:
        if name.startswith("rank-"):
            files[name]["rng"] = {"torch": files[name]["rng"]["torch"]}
    return files


def test_a_stopped_pipeline_run_resumes_bit_identical(straight, pipeline_data, tmp_path):
    # The same name: the checkpoints hold the spec, which then differs in nothing.
    stopped = run(tmp_path, "hf", *PIPELINE, f"data.options.root={pipeline_data}", stop=True)
    assert [e["step"] for e in events(stopped, "stop_saved")] == [STOP]
    assert drive(stopped) == 0, describe_failure(stopped)
    assert [e["step"] for e in events(stopped, "resumed")] == [STOP]
    expected, got = final_files(straight), final_files(stopped)
    assert sorted(expected) == ["rank-00000.pt", "rank-00001.pt", "replicated.pt",
                                "stage-00000.pt", "stage-00001.pt"]
    assert_identical(expected, got, "final checkpoint")   # weights, optimizer, sampler, RNG streams
    losses = {m["step"]: m["loss"] for m in read_jsonl(straight.metrics) if m.get("split") is None}
    again = {m["step"]: m["loss"] for m in read_jsonl(stopped.metrics) if m.get("split") is None}
    assert again == losses


def test_a_pipeline_of_a_model_that_is_no_block_list_fails_in_one_line(pipeline_data, tmp_path):
    """What the login node cannot know without importing (validate --import says it too): the
    ranks fail at the model's build, before any step, naming model.blocks and the fix."""
    paths = local_run(tmp_path, *TINY, "parallel.pipeline.stages=2", "parallel.pipeline.microbatches=8",
                      f"data.options.root={pipeline_data}", "launch.restarts_in_job=0",
                      "checkpoint.retries_on_failure=0", name="no-blocks", spec_file=SPEC)
    assert drive(paths) != 0
    failed = events(paths, "rank_failed")
    assert {e["rank"] for e in failed} == {0, 1}
    for event in failed:
        assert event["error"].startswith("UserCodeError: model.name hf_lm.model:byte_gpt2 built "
                                         "GPT2LMHeadModel, which is not an nn.Sequential, and "
                                         "model.blocks is not set"), event["error"]
        assert "Fix: set model.blocks" in event["error"] and "\n" not in event["error"]


# The whole-model backends with --heavy. CI covers their paths elsewhere: a user's model trained
# whole under DDP/Horovod in tests/e2e/test_user_code_e2e.py; a token model under FSDP and ZeRO-3
# in tests/train/test_fsdp.py::test_the_gpt_spec_trains_as_ddp_does and
# tests/parallel/test_deepspeed.py::test_a_stopped_zero_run_resumes_bit_identical; the blank
# forward of a rank without a validation batch in tests/train/test_sharded_model.py; this model
# and its data on the ranks in the pipeline tests above.
BACKENDS = {"ddp": (),
            "fsdp": ("parallel.backend=fsdp", "parallel.fsdp.units=[GPT2Block]"),
            "deepspeed": ("parallel.backend=deepspeed", "parallel.deepspeed.stage=3",
                          # every parameter partitioned, as a large model's (below 1e5 elements
                          # DeepSpeed keeps them whole on every rank)
                          "parallel.deepspeed.config={zero_optimization: "
                          "{stage3_param_persistence_threshold: 0}}")}


@pytest.mark.heavy
@pytest.mark.parametrize("backend", heavy_params(BACKENDS, set(BACKENDS)))
def test_the_hf_model_trains_whole_under_each_backend(backend, tmp_path):
    """2 ranks x 8 sequences a step: 72 training sequences make the same 8 steps. One validation
    sequence: rank 1 has none, and under FSDP and ZeRO-3 it forwards a blank input of token ids
    shaped as its training inputs, in step with rank 0's batch."""
    require("transformers")
    require("datasets")
    if backend == "deepspeed":
        require("deepspeed")
    root = text_root(tmp_path / "text", train=72, val=1)
    paths = run(tmp_path, backend, *BACKENDS[backend], f"data.options.root={root}")
    losses = train_losses(paths)
    assert len(losses) == TOTAL and losses[-1] < losses[0] - 0.5, losses
    val = [m for m in read_jsonl(paths.metrics) if m.get("split") == "val"]
    assert len(val) == 2 and all(m["loss"] > 0 for m in val), val
    finished = events(paths, "rank_finished")
    assert {e["rank"] for e in finished} == {0, 1}
    assert len({e["params_sha256"] for e in finished}) == 1        # the whole model agrees


# The pipeline's other settings on the user's blocks, with --heavy. CI covers their paths: the
# engine's schedules, remat and timed balance on gpt's blocks in
# tests/parallel/test_pipeline_equivalence.py (1F1B against one process, remat, balance time),
# a user's blocks through the engine in the pipeline tests above, the count check of a balance
# list in tests/parallel/test_pipeline_plan.py::test_a_cut_the_blocks_cannot_take_is_one_line_naming_the_key.
VARIANTS = {"1f1b-remat-time": ("parallel.pipeline.schedule=1f1b", "parallel.pipeline.remat=true",
                                "parallel.pipeline.balance=time"),
            "balance-list": ("parallel.pipeline.balance=[1, 3]",)}


@pytest.mark.heavy
@pytest.mark.parametrize("variant", heavy_params(VARIANTS, set(VARIANTS)))
def test_the_pipeline_settings_work_unchanged_on_the_users_blocks(variant, pipeline_data, tmp_path):
    paths = run(tmp_path, variant, *PIPELINE, *VARIANTS[variant], f"data.options.root={pipeline_data}")
    assert_learned(paths)
    [cut] = events(paths, "pipeline_cut")
    assert sum(cut["sizes"]) == 4 and len(cut["sizes"]) == 2
    if variant == "balance-list":
        assert cut["sizes"] == [1, 3]

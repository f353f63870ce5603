"""Pipeline stages of the user's own model (model.blocks) on the login node: the rules that let
it through or refuse it in one line, its reference checked and snapshotted like every other, and
the one refusal only `validate --import` can make (tests/specs_bad/with_import/)."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_train.cli import main as cli_main
from hpc_train.spec import load_spec, validate_spec_file
from hpc_train.spec.code_refs import code_problems, named_code, own_packages
from hpc_train.spec.problems import SpecInvalid
from tests.conftest import REPO

HF = REPO / "jobs/hf_lm.yaml"
PIPELINE = ["parallel.pipeline.stages=2", "model.blocks=hf_lm.model:blocks",
            "parallel.pipeline.microbatches=8"]
NEEDS_IMPORT = sorted((REPO / "tests/specs_bad/with_import").glob("*.yaml"))


def errors_of(*overrides: str, spec_file: Path = HF) -> list[str]:
    try:
        load_spec(spec_file, list(overrides))
    except SpecInvalid as exc:
        return [str(p) for p in exc.problems]
    return []


@pytest.mark.parametrize("overrides", [
    (), PIPELINE, ("parallel.backend=fsdp", "parallel.fsdp.units=[GPT2Block]"),
    ("parallel.backend=deepspeed", "parallel.deepspeed.stage=3"),
    (*PIPELINE, "parallel.pipeline.balance=[1, 1]"), (*PIPELINE, "parallel.pipeline.balance=time"),
], ids=["ddp", "pipeline", "fsdp", "zero3", "pipeline-balance", "pipeline-time"])
def test_the_hf_example_validates_without_warnings_under_every_backend(overrides):
    spec, warnings = validate_spec_file(HF, list(overrides))
    assert warnings == [], [str(w) for w in warnings]
    assert spec.task_kind.value == "causal_lm"


def test_the_pipeline_takes_the_users_model_on_the_pipeline_engine():
    spec = load_spec(HF, PIPELINE)
    assert spec.parallelism.value == "pipeline" and spec.layout.stages == 2
    assert spec.model.blocks == "hf_lm.model:blocks"


@pytest.mark.parametrize("overrides, words", [
    (("model.blocks=hf_lm.model:blocks",), "model.blocks: 'hf_lm.model:blocks' with "
     "parallel.pipeline.stages 1 is not allowed: model.blocks says where pipeline stages cut your "
     "model; without stages it would be ignored. Fix: set parallel.pipeline.stages: 2 or more"),
    ((*PIPELINE, "task.name=auto"), "task.name: 'auto' (classification) with your own model in 2 "
     "pipeline stages is not allowed: the pipeline trains causal_lm only"),
    ((*PIPELINE, "parallel.pipeline.balance=[1, 1, 2]"), "parallel.pipeline.balance: [1, 1, 2] with "
     "2 stages is not allowed: one block count >= 1 per stage, summing to your model's blocks"),
    ((*PIPELINE, "parallel.accumulation=2"), "parallel.accumulation: 2 with the pipeline engine "
     "(your model's blocks) is not allowed"),
    (("model.blocks=hf_lm.model", *PIPELINE[:1]), "package.module:callable"),
])
def test_a_pipeline_of_the_users_model_that_cannot_work_is_one_line(overrides, words):
    errors = errors_of(*overrides)
    assert any(words in e for e in errors), errors
    assert all("Fix: " in e for e in errors), errors


def test_token_data_trains_the_users_language_model_too():
    """data.kind text feeds token ids to any language model now, not only gpt; and auto is
    causal_lm there, so the pipeline takes it."""
    spec = load_spec(HF, ["data.kind=text", "data.dataset=null", "data.options={}",
                          "task.name=auto", *PIPELINE])
    assert spec.task_kind.value == "causal_lm"
    refused = errors_of("data.kind=text", "data.dataset=null", "data.options={}", "model.name=resnet18",
                        "model.options={}", "task.name=auto")
    assert any("token data needs a language model" in e for e in refused), refused


def test_the_resnet_catalog_model_still_trains_data_parallel_only():
    errors = errors_of("slurm.tasks_per_node=2", "parallel.pipeline.stages=2",
                       "parallel.pipeline.microbatches=8", spec_file=REPO / "jobs/smoke.yaml")
    assert any("pipeline stages cut the gpt block list or your own model's blocks" in e
               for e in errors), errors


def test_model_blocks_is_checked_found_and_snapshotted_like_every_reference(tmp_path):
    spec = load_spec(HF, PIPELINE)
    assert ("model.blocks", "hf_lm.model:blocks") in named_code(spec)
    assert code_problems(spec, REPO) == []
    assert own_packages(spec, REPO) == {"hf_lm": REPO / "examples/hf_lm/hf_lm"}
    # Blocks in a package of their own: found there, and that package travels with the run too.
    (tmp_path / "cuts").mkdir()
    (tmp_path / "cuts" / "__init__.py").write_text("")
    (tmp_path / "cuts" / "gpt2.py").write_text("def blocks(model):\n    return []\n")
    spec = load_spec(HF, [*PIPELINE, f"run.code=[examples/hf_lm, {tmp_path}]",
                          "model.blocks=cuts.gpt2:blocks"])
    assert own_packages(spec, REPO)["cuts"] == tmp_path / "cuts"
    spec = load_spec(HF, [*PIPELINE, "model.blocks=hf_lm.cuts:blocks"])
    [problem] = code_problems(spec, REPO)
    assert problem.key == "model.blocks" and "no module hf_lm.cuts" in problem.rule


def test_the_corpus_of_what_only_an_import_tells():
    assert NEEDS_IMPORT, "tests/specs_bad/with_import/ holds the specs only --import refuses"


@pytest.mark.parametrize("path", NEEDS_IMPORT, ids=lambda p: p.stem)
def test_validate_import_refuses_what_the_login_node_cannot_know(path, monkeypatch, capsys):
    """Valid by the rules (nothing imported), refused in one line once the model is built."""
    expected = path.read_text().splitlines()[0].removeprefix("# expect: ")
    monkeypatch.chdir(REPO)
    relative = str(path.relative_to(REPO))
    assert cli_main(["validate", relative, "--no-slurm"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert cli_main(["validate", relative, "--no-slurm", "--import"]) == 2
    err = capsys.readouterr().err
    assert expected in err and "Fix: " in err and "Traceback" not in err, err

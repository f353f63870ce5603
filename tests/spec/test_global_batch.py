"""A change of world size and the global batch: keep_global_batch's arithmetic, resume's line."""

from __future__ import annotations

import pytest

from hpc_train import run_state
from hpc_train.spec import SpecInvalid, load_spec, spec_from_dict
from hpc_train.spec.global_batch import GlobalBatch, describe_change, kept_accumulation, keeping
from tests.runs import cli, events, local_run


def _spec(ranks: int, batch: int = 32, accumulation: int = 1, keep: bool = True, stages: int = 1):
    return spec_from_dict({
        "run": {"name": "t"}, "slurm": {"tasks_per_node": ranks},
        "data": {"batch_size": batch, "kind": "text" if stages > 1 else "synthetic"},
        "model": {"name": "gpt" if stages > 1 else "resnet_tiny"},
        "parallel": {"accumulation": accumulation, "keep_global_batch": keep,
                     "pipeline": {"stages": stages}}})


@pytest.mark.parametrize("ranks, batch, last_world, last_per_step, accumulation", [
    (1, 32, 2, 64, 2),        # half the ranks: twice the passes
    (2, 32, 2, 64, 1),        # the same shape
    (1, 16, 4, 128, 8),
    (4, 8, 2, 64, 2),         # more ranks with smaller batches
    (3, 8, 2, 48, 2),
])
def test_keep_global_batch_changes_accumulation_where_it_divides(ranks, batch, last_world,
                                                                  last_per_step, accumulation):
    spec = _spec(ranks, batch)
    assert kept_accumulation(spec, GlobalBatch(last_world, last_per_step)) == accumulation


@pytest.mark.parametrize("ranks, last_per_step", [(4, 64), (3, 64), (2, 48)])
def test_keep_global_batch_refuses_in_one_line_where_it_cannot(ranks, last_per_step):
    with pytest.raises(SpecInvalid) as refused:
        kept_accumulation(_spec(ranks), GlobalBatch(2, last_per_step))
    message = str(refused.value)
    assert message.count("\n") == 0 and message.startswith("parallel.keep_global_batch: true with")
    assert f"{last_per_step} samples per step" in message and "Fix:" in message
    assert "keep_global_batch=false" in message


def test_a_pipeline_keeps_the_global_batch_only_with_the_same_replicas():
    two_replicas = GlobalBatch(4, 32)                      # 2 stages x 2 replicas x batch 16
    assert kept_accumulation(_spec(4, 16, stages=2), two_replicas) == 1
    with pytest.raises(SpecInvalid, match="the pipeline does not accumulate"):
        kept_accumulation(_spec(2, 16, stages=2), two_replicas)


def test_keeping_gives_overrides_and_keeps_the_lr():
    last = GlobalBatch(2, 64)
    assert keeping(_spec(2), last) == [] and keeping(_spec(1, keep=False), last) == []
    assert keeping(_spec(1), last) == ["parallel.accumulation=2"]
    kept = _spec(1, accumulation=2)
    assert kept.scaled_lr == _spec(2).scaled_lr                 # the linear rule: same LR


def test_the_change_is_said_in_one_line():
    last = GlobalBatch(2, 64)
    assert describe_change(last, _spec(2)) is None
    grown = describe_change(last, _spec(4, keep=False))
    assert grown.startswith("world size 2 -> 4: samples per step 64 -> 128") and "x2 by the linear" in grown
    kept = describe_change(last, _spec(1, accumulation=2))
    assert kept.startswith("world size 2 -> 1: samples per step 64 kept (accumulation 2)")
    assert "unchanged" in kept and "\n" not in grown + kept


def test_resume_keeps_or_refuses_before_submitting(tmp_path, capsys):
    paths = local_run(tmp_path, "data.kind=synthetic", "data.train_samples=512")
    paths.make_dirs()
    run_state.update(paths, lambda state: state.with_last_save(
        {"step": 3, "epoch": 0, "consumed": 192, "samples": 192, "samples_per_step": 64,
         "world_size": 2}))
    spec_before = paths.spec.read_text()
    refused = cli("resume", str(paths.root), "--local", "--allow-spec-change", "--set",
                  "slurm.tasks_per_node=4", "--set", "parallel.keep_global_batch=true")
    assert refused.returncode == 2, refused.stderr
    assert "parallel.keep_global_batch: true with 4 rank(s)" in refused.stderr
    assert paths.spec.read_text() == spec_before and not events(paths, "resubmitted")

    from hpc_train.slurm.resume import prepare_resume
    spec = prepare_resume(paths, ["slurm.tasks_per_node=1", "parallel.keep_global_batch=true"], True)
    assert (spec.world_size, spec.parallel.accumulation, spec.samples_per_step) == (1, 2, 64)
    assert load_spec(paths.spec) == spec
    said = capsys.readouterr().err
    assert said.startswith("resume: world size 2 -> 1: samples per step 64 kept (accumulation 2)")

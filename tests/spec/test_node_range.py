"""`slurm.nodes` as a range (Slurm's MIN-MAX): its spelling, its rules, the spec each start trains
with (`fit_to_nodes`, the rank's `start_spec`) and the resume it permits without consent."""

from __future__ import annotations

import pytest

from hpc_train import run_state
from hpc_train.errors import SpecError
from hpc_train.job.worker import start_spec
from hpc_train.runtime.stop import NODES_ENV
from hpc_train.spec import (SpecInvalid, build_spec, describe_spec, dump_spec_yaml, load_spec,
                            spec_from_dict, spec_hash)
from hpc_train.spec.global_batch import fit_to_nodes, refits
from tests.runs import local_run


def ranged(nodes="1-2", tasks=1, keep=False, **sections):
    return spec_from_dict({"run": {"name": "t"}, "slurm": {"nodes": nodes, "tasks_per_node": tasks},
                           "parallel": {"keep_global_batch": keep}, **sections})


def errors(data: dict, overrides=()) -> list[str]:
    spec, problems, _ = build_spec({"run": {"name": "t"}, **data}, overrides)
    assert spec is None
    return [str(p) for p in problems]


def test_the_range_is_read_as_its_two_numbers_from_the_file_and_from_set():
    for data, overrides in (({"slurm": {"nodes": "1-2"}}, ()), ({}, ["slurm.nodes=1-2"]),
                            ({"slurm": {"nodes": " 1 - 2 "}}, ())):
        spec, problems, warnings = build_spec({"run": {"name": "t"}, **data}, overrides)
        assert (spec.slurm.nodes, spec.slurm.min_nodes, spec.slurm.fewest_nodes) == (2, 1, 1)
        assert problems == warnings == []                   # a spelling: nothing to warn of
    plain = spec_from_dict({"run": {"name": "t"}, "slurm": {"nodes": 2}})
    assert (plain.slurm.min_nodes, plain.slurm.fewest_nodes) == (None, 2)


@pytest.mark.parametrize("written, fix", [("2-1", "slurm.nodes: 1-2"), ("0-2", "slurm.nodes: 1-2"),
                                          ("a-b", "slurm.nodes: 1-2"), ("3-2", "slurm.nodes: 2-3"),
                                          ("1-2-3", "slurm.nodes: 1-2")])
def test_a_wrong_range_is_one_line_naming_the_key(written, fix):
    found = errors({"slurm": {"nodes": written}})
    assert found == [f"slurm.nodes: {written!r} is not allowed: a node range is Slurm's MIN-MAX: "
                     f"two whole numbers, 1 <= MIN <= MAX. Fix: write e.g. {fix}, or one number "
                     "of nodes"]
    assert errors({}, [f"slurm.nodes={written}"])[0].startswith("slurm.nodes (from --set): ")


def test_the_fewest_nodes_cannot_exceed_the_most():
    found = errors({"slurm": {"nodes": 2, "min_nodes": 3}})
    assert len(found) == 1 and found[0].startswith("slurm.nodes: 2 with slurm.min_nodes 3 is not "
                                                   "allowed: the fewest nodes of a range")
    assert "slurm.min_nodes: 0 is not allowed: must be >= 1" in errors({"slurm": {"min_nodes": 0}})[0]


def test_the_resolved_spec_dumps_both_numbers_and_loads_back_equal(tmp_path):
    spec = ranged()
    text = dump_spec_yaml(spec)
    assert "  nodes: 2\n  min_nodes: 1\n" in text
    (tmp_path / "spec.yaml").write_text(text)
    again = load_spec(tmp_path / "spec.yaml")
    assert again == spec and spec_hash(again) == spec_hash(spec)
    assert spec_hash(spec) != spec_hash(ranged(2)) and ranged("2-2") != ranged(2)


def test_validate_shows_the_range():
    summary = describe_spec(ranged("1-2", tasks=2))
    assert "world size:   2-4 = 1-2 node(s) x 2 task(s) (CPU)" in summary
    assert "world size:   4 = 2 node(s) x 2 task(s)" in describe_spec(ranged(2, tasks=2))


GPT = {"model": {"name": "gpt"}, "data": {"kind": "text", "batch_size": 16}}


def test_every_node_count_of_the_range_must_form_whole_pipelines():
    pipeline = {**GPT, "parallel": {"pipeline": {"stages": 2, "microbatches": 8}}}
    found = errors({"slurm": {"nodes": "2-4"}, **pipeline})
    assert found == ["slurm.nodes: 2-4 with parallel.pipeline.stages 2 and slurm.tasks_per_node 1 "
                     "is not allowed: on 3 node(s) the 3 ranks cannot form pipelines of 2 stages: "
                     "every node count of the range must give a multiple of the stage count. Fix: "
                     "set slurm.tasks_per_node to a multiple of 2, or slurm.nodes: 4 (no range)"]
    assert spec_from_dict({"run": {"name": "t"}, "slurm": {"nodes": "1-3", "tasks_per_node": 2},
                           **pipeline}).slurm.fewest_nodes == 1


def test_keep_global_batch_must_find_its_accumulation_at_every_node_count():
    found = errors({"slurm": {"nodes": "1-3"}, "parallel": {"keep_global_batch": True}})
    assert len(found) == 1 and found[0].startswith(
        "slurm.nodes: 1-3 with parallel.keep_global_batch true is not allowed: on 2 node(s) no "
        "parallel.accumulation keeps the 96 samples per step of 3 nodes: data.batch_size x "
        "replicas = 64 samples per pass does not divide them. Fix:")
    pipeline = {**GPT, "parallel": {"keep_global_batch": True,
                                    "pipeline": {"stages": 2, "microbatches": 8}}}
    assert "the pipeline does not accumulate" in errors(
        {"slurm": {"nodes": "1-2", "tasks_per_node": 2}, **pipeline})[0]
    assert ranged("1-2", keep=True).parallel.keep_global_batch        # 1 and 2 divide 2


def test_fitting_to_the_written_count_is_the_written_spec():
    for spec in (ranged(), ranged(keep=True), ranged(2)):
        assert fit_to_nodes(spec, spec.slurm.nodes) == spec


def test_fitting_to_fewer_nodes_changes_the_nodes_and_keeps_the_range():
    fitted = fit_to_nodes(ranged("1-2", tasks=2), 1)
    assert (fitted.slurm.nodes, fitted.slurm.min_nodes, fitted.world_size) == (1, 1, 2)
    assert fitted.parallel.accumulation == 1 and fitted.samples_per_step == 64   # the ranks' batch
    assert fitted.scaled_lr == ranged("1-2", tasks=2).scaled_lr / 2              # the linear rule


def test_fitting_under_keep_global_batch_keeps_the_written_samples_per_step():
    written = ranged("1-2", tasks=2, keep=True)
    for nodes, accumulation in ((2, 1), (1, 2)):
        fitted = fit_to_nodes(written, nodes)
        assert (fitted.slurm.nodes, fitted.parallel.accumulation) == (nodes, accumulation)
        assert fitted.samples_per_step == written.samples_per_step == 128
        assert fitted.scaled_lr == written.scaled_lr


@pytest.mark.parametrize("nodes", [0, 3])
def test_a_start_outside_the_range_is_refused_naming_the_key(nodes):
    with pytest.raises(SpecInvalid, match=rf"^slurm.nodes: 1-2 is not allowed: a start on {nodes} "):
        fit_to_nodes(ranged(), nodes)
    with pytest.raises(SpecInvalid, match="slurm.nodes: 2-2"):
        fit_to_nodes(ranged(2), 1)


def test_the_rank_trains_with_the_spec_fitted_to_the_drivers_node_count():
    written = ranged(keep=True)
    assert start_spec(written, {}) is written
    assert start_spec(written, {NODES_ENV: "2"}) == written
    assert start_spec(written, {NODES_ENV: "1"}) == fit_to_nodes(written, 1)
    with pytest.raises(SpecInvalid):
        start_spec(written, {NODES_ENV: "3"})


def test_refits_permits_only_another_node_count_of_the_range():
    written = ranged("1-2", tasks=2, keep=True)
    assert refits(written, written) and refits(written, fit_to_nodes(written, 1))
    assert not refits(written, ranged("1-3", tasks=2))                 # the range itself changed
    assert not refits(ranged(2, tasks=2), ranged("1-2", tasks=2))
    not_kept = spec_from_dict({"run": {"name": "t"}, "slurm": {"nodes": 1, "min_nodes": 1,
                                                               "tasks_per_node": 2},
                               "parallel": {"keep_global_batch": True}})
    assert not refits(written, not_kept)            # 1 node without the accumulation that keeps
    other = fit_to_nodes(ranged("1-2", tasks=2, keep=True, optim={"base_lr": 0.2}), 1)
    assert not refits(written, other)


def test_resume_on_another_node_count_of_the_range_needs_no_consent(tmp_path):
    from hpc_train.slurm.resume import prepare_resume

    paths = local_run(tmp_path, "slurm.nodes=1-2", "slurm.tasks_per_node=1",
                      "parallel.keep_global_batch=true")
    paths.make_dirs()
    written = load_spec(paths.spec)
    # The last start trained on 1 node of 2: the samples per step kept, with accumulation 2.
    run_state.update(paths, lambda state: state.with_last_save(
        {"step": 3, "epoch": 0, "consumed": 192, "samples": 192, "samples_per_step": 64,
         "world_size": 1}))
    assert prepare_resume(paths, [], False) == written                   # nothing to consent to
    assert run_state.read(paths).consented_specs == ()

    narrowed = prepare_resume(paths, ["slurm.nodes=1"], False)
    assert narrowed == fit_to_nodes(written, 1) and load_spec(paths.spec) == narrowed
    assert narrowed.parallel.accumulation == 2
    # Recorded like a consent: the checkpoints (of the written spec) load under the new one.
    assert run_state.read(paths).consented_specs == ((spec_hash(written), spec_hash(narrowed)),)

    with pytest.raises(SpecError, match="--allow-spec-change"):
        prepare_resume(paths, ["slurm.nodes=2"], False)                  # beyond the range now

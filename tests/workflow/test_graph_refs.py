"""The stage graph and references between stages: pure functions, plain data."""

from __future__ import annotations

import pytest

from hpc_train.workflow import graph, refs

NEEDS = {"shard": [], "val": ["shard"], "train": ["val"], "evaluate": ["train"],
         "export": ["evaluate"], "notify": ["train"]}


def test_order_puts_every_stage_after_what_it_needs_in_file_order():
    assert graph.order(NEEDS) == ["shard", "val", "train", "evaluate", "export", "notify"]
    assert graph.order({"b": ["a"], "a": [], "c": []}) == ["a", "b", "c"]


def test_a_cycle_is_found_and_spelled_out():
    assert graph.find_cycle(NEEDS) is None
    cycle = graph.find_cycle({"a": ["c"], "b": ["a"], "c": ["b"], "d": []})
    assert cycle == ["a", "c", "b", "a"]
    assert graph.find_cycle({"a": ["a"]}) == ["a", "a"]
    with pytest.raises(ValueError):
        graph.order({"a": ["b"], "b": ["a"]})


def test_ancestors_and_descendants():
    assert graph.ancestors(NEEDS, "evaluate") == {"train", "val", "shard"}
    assert graph.ancestors(NEEDS, "shard") == set()
    assert graph.descendants(NEEDS, {"train"}) == {"evaluate", "export", "notify"}
    assert graph.descendants(NEEDS, {"export"}) == set()


def test_layers_group_stages_by_depth():
    assert graph.layers(NEEDS) == [["shard"], ["val"], ["train"], ["evaluate", "notify"], ["export"]]


def test_references_leave_the_shells_braces_alone():
    text = 'cp {train.run_dir}/x "${HOME}"/{a,b} {sweep.best.run_dir} { echo; } {workflow.dir}'
    assert refs.references(text) == [refs.Ref("train", "run_dir"), refs.Ref("sweep", "best.run_dir"),
                                     refs.Ref("workflow", "dir")]
    assert refs.references("${x.y} {1.2} {a..b}") == []


def test_substitute_keeps_run_time_parts_apart():
    known = {refs.Ref("train", "run_dir"): refs.literal("/runs/t-1"),
             refs.Ref("sweep", "best.run_dir"): (refs.Best("sweep"),)}
    assert refs.substitute("{train.run_dir}/model.pt", known) == ("/runs/t-1/model.pt",)
    value = refs.substitute("{sweep.best.run_dir}/eval", known)
    assert value == (refs.Best("sweep"), "/eval")
    assert not refs.is_known(value) and refs.runtime_stages(value) == ["sweep"]
    assert refs.text(value) == "{sweep.best.run_dir}/eval"
    with pytest.raises(ValueError):
        refs.known_text(value)
    assert refs.join(["a", "", "b", refs.Best("s"), "c"]) == ("ab", refs.Best("s"), "c")

"""Bad input as a new user writes it: refused before the queue, in one line each, exit 2, by a
bound checked before the input costs anything (no alias expanded, no value walked whole, no dead
controller waited for), with nothing created. The capacity rules are pure (facts in, problems
out); the commands are tried against the real single-node Slurm and a controller that does not
answer."""

from __future__ import annotations

import os
import sys

import pytest
import yaml

from hpc_train.scheduler.parse import NodeShape, gres_gpus, parse_node_shapes
from hpc_train.spec import load_spec
from hpc_train.spec import problems as spec_problems
from hpc_train.spec.capacity import Facts, capacity_problems
from hpc_train.spec.problems import show
from hpc_train.spec.yaml_io import MAX_VALUES, AliasBomb, SpecLoader, parse_yaml
from tests.conftest import REPO
from tests.runs import cli, path_without

BOMB = "run: {name: bomb}\n" + "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
    f"{b}: &{b} [{', '.join(['*' + a] * 9)}]\n" for a, b in zip("abcdefgh", "bcdefghi"))


def _node(name="n1", partition="debug", default=True, cpus=8, memory_mb=64_000, gpus=4, state="idle"):
    return NodeShape(name, partition, default, cpus, memory_mb, gpus, state)


@pytest.fixture(scope="module")
def smoke():
    return load_spec(REPO / "jobs/smoke.yaml")


def _with(spec, **slurm):
    from dataclasses import replace
    return replace(spec, slurm=replace(spec.slurm, **slurm))


# -- YAML aliases and long values ------------------------------------------------------------

def test_an_alias_bomb_is_refused_while_composing_before_it_is_expanded(monkeypatch):
    """Refused from the composed nodes, each counted once (the document's ~100 nodes, not the
    9**9 values they expand to), before PyYAML constructs any value of them."""
    constructed, counted = [], []
    monkeypatch.setattr(SpecLoader, "construct_document", lambda self, node: constructed.append(node))

    def count_sizes(frame, event, _arg):     # every call of expanded_size's inner size()
        if event == "call" and frame.f_code.co_qualname == "expanded_size.<locals>.size":
            counted.append(1)

    sys.setprofile(count_sizes)
    try:
        with pytest.raises(AliasBomb, match=f"more than {MAX_VALUES:,} values"):
            parse_yaml(BOMB)
    finally:
        sys.setprofile(None)
    assert constructed == [] and 0 < len(counted) < 1_000, len(counted)


def test_shared_aliases_below_the_bound_and_self_references():
    assert parse_yaml("a: &x {k: 1}\nb: *x\nc: *x\n") == {"a": {"k": 1}, "b": {"k": 1}, "c": {"k": 1}}
    with pytest.raises(AliasBomb, match="refers to the value that contains it"):
        parse_yaml("a: &x [1, *x]\n")


@pytest.mark.parametrize("value", [list(range(10**6)), "x" * 10**6, {str(i): [i] * 100 for i in range(10**4)},
                                   10**10000, [[[[["deep"]]]]] * 1000],
                         ids=["long-list", "long-string", "big-dict", "huge-int", "deep-lists"])
def test_a_value_in_a_message_is_cut_and_costs_what_a_small_one_does(value, monkeypatch):
    """show() walks only what the line can hold: a few dozen values looked at and a few hundred
    characters made, whatever the size of the value (the whole of it would be millions)."""
    looked_at, made = [], []
    pieces = spec_problems._repr_pieces

    def counted(item, depth):                # the walk's every value goes through here
        looked_at.append(depth)
        for piece in pieces(item, depth):
            if depth == 0:                   # each piece of the text once, as show() reads it
                made.append(len(piece))
            yield piece

    monkeypatch.setattr(spec_problems, "_repr_pieces", counted)
    text = show(value)
    assert len(text) <= 80
    assert len(looked_at) <= 80 and sum(made) <= 8 * 80, (len(looked_at), sum(made))


def test_show_is_repr_for_values_that_fit():
    for value in (1, 2.5, None, True, "a'b", [1, (2,)], {"k": [1, 2]}, (), {}):
        assert show(value) == repr(value)


# -- capacity: pure rules --------------------------------------------------------------------

def test_samples_per_step_beyond_the_training_split(smoke):
    from dataclasses import replace
    spec = replace(smoke, data=replace(smoke.data, batch_size=10**12))
    [problem] = capacity_problems(spec, Facts(train_samples=3000, manifest="m.json"))
    assert problem.key == "data.batch_size" and "more than the 3,000" in str(problem)
    assert f"at most {3000 // spec.replicas:,} per rank" in str(problem)
    assert capacity_problems(smoke, Facts(train_samples=3000)) == []
    assert capacity_problems(spec, Facts()) == []        # no manifest seen: not checked


@pytest.mark.parametrize("slurm, key, said", [
    ({"nodes": 100_000}, "slurm.nodes", "has 3 node(s) that fit"),
    ({"nodes": 3, "spare_nodes": 1}, "slurm.nodes", "3 + 1 spare"),
    ({"cpus_per_task": 500}, "slurm.tasks_per_node + slurm.cpus_per_task", "the largest has 16 CPUs"),
    ({"mem": "100000G"}, "slurm.mem", "the largest has 128,000 MB"),
    ({"gpus_per_node": 64}, "slurm.gpus_per_node", "the largest has 8 GPUs"),
    ({"nodes": 2, "gpus_per_node": 8}, "slurm.nodes", "has 1 node(s) that fit"),
    ({"partition": "gpu"}, "slurm.partition", "no such partition (partitions: debug, big)"),
])
def test_a_request_no_node_or_not_enough_nodes_can_hold(smoke, slurm, key, said):
    nodes = (_node("n1"), _node("n2"), _node("n3", cpus=16, memory_mb=128_000, gpus=8))
    chosen = slurm.get("partition")
    facts = Facts(partition=chosen, nodes=() if chosen else nodes, partitions=("debug", "big"))
    problems = capacity_problems(_with(smoke, **slurm), facts)
    assert [p.key for p in problems] == [key] and said in str(problems[0]), problems


def test_a_request_that_fits_and_facts_not_known(smoke):
    assert capacity_problems(_with(smoke, nodes=3, mem="60G"), Facts(nodes=(_node(), _node(), _node()))) == []
    assert capacity_problems(_with(smoke, nodes=10**6), Facts()) == []


def test_sinfo_lines_per_node_and_partition():
    text = ("vm|debug*|4|20489|(null)|idle\n"
            "g1|gpu|64|512000+|gpu:a100:8(S:0-1),nic:1|mixed*\n"
            "garbage line\n")
    assert parse_node_shapes(text) == [
        NodeShape("vm", "debug", True, 4, 20489, 0, "idle"),
        NodeShape("g1", "gpu", False, 64, 512000, 8, "mixed")]
    assert gres_gpus("gpu:2,gpu:v100:2") == 4 and gres_gpus("(null)") == 0


# -- the commands, on the real Slurm ---------------------------------------------------------

def _one_line_exit_2(out, *words):
    """Refused in one line that names the bound (`words`): the check that stops the input before
    it costs anything (cli's timeout only catches a hang)."""
    assert out.returncode == 2, out.stdout + out.stderr
    [line] = out.stderr.splitlines()
    assert all(w in line for w in words), line


@pytest.mark.slurm
@pytest.mark.parametrize("bad, words", [
    (["--set", "data.batch_size=1000000000000"], ("data.batch_size", "training split")),
    (["--set", "slurm.nodes=100000"], ("slurm.nodes", "100,000", "partition")),
])
def test_validate_and_submit_refuse_what_cannot_run_here(slurm_cluster, tmp_path, bad, words):
    for command in ("validate", "submit"):
        out = cli(command, "jobs/smoke.yaml", "--set", f"run.root={tmp_path}/runs", *bad, timeout=60)
        _one_line_exit_2(out, *words)
    assert not (tmp_path / "runs").exists()


def test_the_alias_bomb_through_validate_and_submit(tmp_path):
    spec = tmp_path / "bomb.yaml"
    spec.write_text(BOMB)
    for command in ("validate", "submit"):
        _one_line_exit_2(cli(command, str(spec), "--no-slurm", timeout=60), "aliases expand")
    yaml.safe_load("a: 1")   # PyYAML itself is untouched: only our loader bounds aliases


def test_validate_says_what_it_could_not_ask_a_dead_controller(tmp_path):
    """`scontrol ping` says at once that the controller is down, and validate then never runs
    sinfo (which would wait for the dead controller): sinfo here only notes that it was run."""
    dead = tmp_path / "slurm.conf"
    dead.write_text("ClusterName=nowhere\nSlurmctldHost=nowhere(127.0.0.1)\nSlurmctldPort=9\n")
    ran = tmp_path / "sinfo-ran"
    bin_dir = path_without(tmp_path / "bin", ("sinfo",), {"sinfo": f"#!/bin/sh\ntouch {ran}\nexit 1\n"})
    out = cli("validate", "jobs/smoke.yaml", "--set", "slurm.nodes=4",
              env={**os.environ, "SLURM_CONF": str(dead), "PATH": bin_dir}, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "note: nodes and per-node resources not checked against Slurm" in out.stderr
    assert "is DOWN" in out.stderr and not ran.exists(), out.stderr
    assert "preemption:" not in out.stdout          # nothing asked of a dead controller


@pytest.mark.slurm
def test_validate_says_what_a_preemption_would_give_the_job(slurm_cluster):
    """Our cluster is preemptable as many sites are (env/slurm/start.sh): validate says how long
    a preempted job of the spec's partition has to save."""
    out = cli("validate", "jobs/smoke.yaml", timeout=60)
    assert out.returncode == 0, out.stderr
    assert ("preemption: partition debug: PreemptMode REQUEUE (preempt/partition_prio), "
            "GraceTime 30 s, KillWait 5 s") in out.stdout, out.stdout


@pytest.mark.slurm
@pytest.mark.parametrize("bad, key, words", [
    ({"set": {"slurm.nodes": 100000}}, "stages.train.set.slurm.nodes", ("100,000", "partition")),
    ({"sweep": {"grid": {"data.batch_size": [32, 10**12]}}}, "stages.train.sweep member 1: data.batch_size",
     ("training split",)),
])
def test_workflow_validate_and_run_refuse_a_stage_that_cannot_run_here(slurm_cluster, tmp_path, bad, key, words):
    """A train stage (or one sweep member) held against the same rules as `submit`'s spec, named
    where the workflow file wrote the value; nothing created, nothing submitted."""
    workflow = {"name": "unfit", "root": str(tmp_path / "runs"), "stages": {
        "train": {"kind": "train", "spec": "jobs/smoke.yaml", **bad}}}
    path = tmp_path / "wf.yaml"
    path.write_text(yaml.safe_dump(workflow))
    for command in ("validate", "run"):
        out = cli("workflow", command, str(path), timeout=60)
        _one_line_exit_2(out, key, *words)
    assert not (tmp_path / "runs").exists()


@pytest.mark.parametrize("text, words", [
    ("run: " + "[" * 20_000 + "]" * 20_000 + "\n", ("nested more than", "deep")),
    ("".join(" " * i + f"k{i}:\n" for i in range(1_000)), ("nested more than", "deep")),
    ("run:\n  name: " + "x" * 2_000_000 + "\n", ("bytes", "at most 1,048,576")),
])
def test_a_spec_nested_too_deep_or_too_big_is_one_line_at_once(tmp_path, text, words):
    """PyYAML composes recursively (deeper than Python's limit: a traceback) and reads a file
    whole (50 MB took 12 s to refuse): both are bounded before that."""
    spec = tmp_path / "odd.yaml"
    spec.write_text(text)
    for command in ("validate", "submit"):
        _one_line_exit_2(cli(command, str(spec), "--no-slurm", timeout=60), *words)
    assert not (tmp_path / "runs").exists()

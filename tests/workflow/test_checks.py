"""Workflow files are checked like job specs: every problem on one line (key, value, rule, fix),
exit 2, nothing created and nothing submitted."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml

from hpc_train.spec import SpecInvalid
from hpc_train.workflow.load import load_workflow
from hpc_train.workflow.run import check
from tests.conftest import REPO
from tests.runs import cli, path_without

GOOD = {
    "name": "t",
    "stages": {
        "shard": {"kind": "shard", "src": "data/demo/train", "out": "{workflow.dir}/shards", "tasks": 2},
        "train": {"kind": "train", "after": ["shard"], "spec": "jobs/smoke.yaml",
                  "set": {"data.path": "{shard.out}"}},
        "evaluate": {"kind": "evaluate", "after": ["train"], "run_dir": "{train.run_dir}"},
    },
}


def write(tmp_path: Path, data: dict) -> str:
    path = tmp_path / "wf.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def changed(**stages) -> dict:
    data = {"name": "t", "stages": {k: dict(v) for k, v in GOOD["stages"].items()}}
    for name, value in stages.items():
        if value is None:
            del data["stages"][name]
        else:
            data["stages"][name] = value
    return data


BAD = {
    "cycle": (changed(shard={**GOOD["stages"]["shard"], "after": ["evaluate"]}),
              "stages.shard.after: the stages wait for each other in a cycle (shard -> evaluate -> train -> shard"),
    "unknown_after": (changed(evaluate={**GOOD["stages"]["evaluate"], "after": ["trian"]}),
                      "stages.evaluate.after[0]: 'trian' is not allowed: no such stage (stages: shard, train, "
                      "evaluate). Fix: did you mean 'train'?"),
    "unknown_key": (changed(evaluate={**GOOD["stages"]["evaluate"], "chekpoint": 3}),
                    "stages.evaluate.chekpoint: unknown key (value 3); did you mean 'stages.evaluate.checkpoint'?"),
    "bad_kind": (changed(evaluate={**GOOD["stages"]["evaluate"], "kind": "evaluation"}),
                 "stages.evaluate.kind: 'evaluation' is not a stage kind; kinds: shard, train, evaluate, "
                 "export, command. Fix: did you mean 'evaluate'?"),
    "bad_stage_spec": (changed(train={**GOOD["stages"]["train"], "set": {"optim.base_lr": -1}}),
                       "stages.train.set.optim.base_lr: -1 is not allowed: must be > 0"),
    "missing_spec_file": (changed(train={**GOOD["stages"]["train"], "spec": "jobs/nope.yaml"}),
                          "stages.train.spec: 'jobs/nope.yaml': file not found"),
    "missing_output": (changed(evaluate={**GOOD["stages"]["evaluate"], "run_dir": "{train.output}"}),
                       "stages.evaluate.run_dir: '{train.output}' is not allowed: a train stage has no "
                       "output 'output' (it offers run_dir). Fix: write e.g. {train.run_dir}"),
    "missing_stage_ref": (changed(evaluate={**GOOD["stages"]["evaluate"], "run_dir": "{trian.run_dir}"}),
                          "stages.evaluate.run_dir: '{trian.run_dir}' is not allowed: refers to no stage"),
    "ref_without_wait": (changed(evaluate={**GOOD["stages"]["evaluate"], "after": []}),
                         "stages.evaluate.run_dir: '{train.run_dir}' is not allowed: evaluate uses an output "
                         "of train but does not wait for it"),
    "best_of_no_sweep": (changed(evaluate={**GOOD["stages"]["evaluate"], "run_dir": "{train.best.run_dir}"}),
                         "train is not a sweep: only a sweep has a best member"),
    "sweep_changes_slurm": (changed(train={**GOOD["stages"]["train"],
                                           "sweep": {"grid": {"slurm.time": ["00:10:00", "00:20:00"]}}},
                                    evaluate=None),
                            "stages.train.sweep.grid.slurm.time: 'slurm.time' is not allowed: sweep members "
                            "run as one Slurm job array"),
    "bad_type": (changed(shard={**GOOD["stages"]["shard"], "tasks": "two"}),
                 "stages.shard.tasks: 'two' is not allowed: must be a whole number"),
    "train_with_slurm": (changed(train={**GOOD["stages"]["train"], "slurm": {"time": "10"}}),
                         "stages.train.slurm: a train stage's resources are its job spec's slurm section"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_a_bad_workflow_gets_one_line_naming_the_problem(case, tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    data, expected = BAD[case]
    with pytest.raises(SpecInvalid) as caught:
        check(write(tmp_path, data), [], root=str(tmp_path / "runs"))
    lines = str(caught.value).splitlines()
    assert len(lines) == 1, lines
    assert expected in lines[0]
    assert "Fix:" in lines[0]


def test_every_problem_is_listed_at_once(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    # Field problems of every stage together (the rules between stages need whole stages).
    data = changed(evaluate={**GOOD["stages"]["evaluate"], "split": "a b", "checkpoint": -1},
                   shard={**GOOD["stages"]["shard"], "quality": 0})
    with pytest.raises(SpecInvalid) as caught:
        load_workflow(write(tmp_path, data))
    keys = sorted(p.key for p in caught.value.problems)
    assert keys == ["stages.evaluate.checkpoint", "stages.evaluate.split", "stages.shard.quality"]
    # Then every rule between stages, and every train stage's job spec problem.
    data = changed(evaluate={**GOOD["stages"]["evaluate"], "after": ["nope", "train"],
                             "data": "{shard.outt}"},
                   train={**GOOD["stages"]["train"], "set": {"optim.epochs": 0, "data.batch_size": 0}})
    with pytest.raises(SpecInvalid) as caught:
        check(write(tmp_path, data), [])
    keys = sorted(p.key for p in caught.value.problems)
    assert keys == ["stages.evaluate.after[0]", "stages.evaluate.data"]
    data["stages"]["evaluate"] = GOOD["stages"]["evaluate"]
    with pytest.raises(SpecInvalid) as caught:
        check(write(tmp_path, data), [])
    keys = sorted(p.key for p in caught.value.problems)
    assert keys == ["stages.train.set.data.batch_size", "stages.train.set.optim.epochs"]


def test_set_reaches_a_stage_or_a_train_stages_job_spec(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    path = write(tmp_path, GOOD)
    plan = check(path, ["train.optim.epochs=1", "shard.tasks=3", "evaluate.split=train",
                        "train.set.log.every_steps=5"], root=str(tmp_path))
    assert plan.stages["train"].train.specs[0].optim.epochs == 1
    assert plan.stages["train"].train.specs[0].log.every_steps == 5
    assert plan.stages["shard"].jobs[0].tasks == 3
    assert plan.stages["evaluate"].stage.split == "train"
    with pytest.raises(SpecInvalid, match=r"no stage 'trian' in the workflow .*did you mean 'train'"):
        check(path, ["trian.optim.epochs=1"])
    with pytest.raises(SpecInvalid, match=r"stages.train.set.optim.epochs: 0 is not allowed"):
        check(path, ["train.optim.epochs=0"])


def test_a_stages_old_resource_names_still_work_with_a_warning(tmp_path, monkeypatch):
    monkeypatch.chdir(REPO)
    data = changed(evaluate={**GOOD["stages"]["evaluate"], "slurm": {"cpus": 4, "gpus": 1}})
    plan = check(write(tmp_path, {**data, "slurm": {"cpus": 2, "time": "00:05:00"}}), [])
    resources = plan.workflow.slurm
    assert (resources["evaluate"].cpus_per_task, resources["evaluate"].gpus_per_node) == (4, 1)
    assert (resources["shard"].cpus_per_task, resources["shard"].mem) == (2, "4G")   # mem: a stage's default
    assert [str(w) for w in plan.warnings] == [
        "slurm.cpus: 2: deprecated: a stage's slurm keys are the job spec's (read as cpus_per_task for "
        "now). Consider: rename it to slurm.cpus_per_task",
        "stages.evaluate.slurm.cpus: 4: deprecated: a stage's slurm keys are the job spec's (read as "
        "cpus_per_task for now). Consider: rename it to stages.evaluate.slurm.cpus_per_task",
        "stages.evaluate.slurm.gpus: 1: deprecated: a stage's slurm keys are the job spec's (read as "
        "gpus_per_node for now). Consider: rename it to stages.evaluate.slurm.gpus_per_node"]
    # A bad value names the key as written too.
    with pytest.raises(SpecInvalid, match=r"^stages\.evaluate\.slurm\.cpus_per_task \(written as "
                                          r"stages\.evaluate\.slurm\.cpus\): 0 is not allowed: must be >= 1"):
        check(write(tmp_path, changed(evaluate={**GOOD["stages"]["evaluate"], "slurm": {"cpus": 0}})), [])


def test_the_cli_exits_2_and_neither_creates_nor_submits(tmp_path):
    # A PATH whose sbatch only leaves a trace: nothing may call it.
    trace = tmp_path / "sbatch-called"
    env = {**os.environ, "PATH": path_without(tmp_path / "bin", ("sbatch",),
                                              {"sbatch": f"#!/bin/sh\ntouch {trace}\n"})}
    data, _ = BAD["cycle"]
    path = write(tmp_path, {**data, "root": str(tmp_path / "runs")})
    for command in (["workflow", "run", path], ["workflow", "validate", path],
                    ["workflow", "run", path, "--dry-run"]):
        out = cli(*command, env=env)
        assert out.returncode == 2, out.stderr
        assert out.stderr.count("\n") == 1 and out.stderr.startswith("error: stages.shard.after:")
    assert not trace.exists() and not (tmp_path / "runs").exists()


def test_the_shipped_workflows_are_valid(monkeypatch):
    monkeypatch.chdir(REPO)
    for name in ("smoke", "sweep", "imagenet"):
        # imagenet's GPU nodes are another cluster's: not held against this one's sinfo.
        plan = check(f"workflows/{name}.yaml", [], ask_slurm=False if name == "imagenet" else None)
        assert plan.order[0] in ("shard_train", "train") and plan.warnings == []   # today's key names
    imagenet = check("workflows/imagenet.yaml", [], ask_slurm=False)
    assert imagenet.order == ["shard_train", "shard_val", "train", "evaluate", "export"]
    assert imagenet.stages["shard_train"].jobs[0].tasks == 32
    spec = imagenet.stages["train"].train.specs[0]
    assert (spec.model.name, spec.world_size, spec.data.path) == ("resnet50", 16, "/scratch/imagenet-shards")
    sweep = check("workflows/sweep.yaml", [])
    assert len(sweep.stages["train"].train.specs) == 4 and sweep.stages["train"].sweep.parallelism == 2


def test_a_file_that_is_no_workflow_is_named_in_workflow_words(tmp_path):
    (tmp_path / "empty.yaml").write_text("# nothing yet\n")
    (tmp_path / "tabs.yaml").write_text("name: x\nstages:\n\tshard: {}\n")
    for name, rule in (("empty.yaml", "the file is empty"), ("tabs.yaml", "not valid YAML"),
                       ("missing.yaml", "file not found")):
        with pytest.raises(SpecInvalid) as caught:
            load_workflow(tmp_path / name)
        assert len(caught.value.problems) == 1 and rule in str(caught.value)
        assert "jobs/" not in str(caught.value)

"""Planning a workflow and the batch scripts of its stages (pure: nothing is created)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
import yaml

from hpc_train.workflow import refs
from hpc_train.workflow.load import workflow_from_dict
from hpc_train.workflow.paths import WorkflowPaths
from hpc_train.workflow.plan import PlannedDirs, make_plan
from hpc_train.workflow.run import check, dry_run_text
from hpc_train.workflow.script import dependency, dependency_options, render, shell_line
from tests.conftest import REPO


@pytest.fixture
def smoke(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    return check("workflows/smoke.yaml", [], root=str(tmp_path / "odd $(dir)"))


def test_dependency_strings():
    assert dependency(["12", "13"], []) == "afterok:12:13"
    assert dependency(["12"], ["14"]) == "afterok:12,afterany:14"
    assert dependency([], []) is None
    assert dependency_options("afterok:1") == {"dependency": "afterok:1", "kill-on-invalid-dep": "yes"}
    assert dependency_options(None) == {}


def test_references_resolve_to_the_planned_directories(smoke, tmp_path):
    wf = Path(tmp_path / "odd $(dir)").resolve() / "smoke-chain-<timestamp>"
    shard = smoke.stages["shard_train"]
    assert refs.known_text(shard.outputs["out"]) == f"{wf}/shards"
    assert refs.known_text(shard.outputs["manifest"]) == f"{wf}/shards/train/manifest.json"
    spec = smoke.stages["train"].train.specs[0]
    assert spec.data.path == f"{wf}/shards"                       # set: {data.path: "{shard_train.out}"}
    run_dir = smoke.stages["train"].train.run_dirs[0]
    assert run_dir == REPO / "runs" / "smoke-<timestamp>"
    assert refs.known_text(smoke.stages["export"].outputs["output"]) == f"{wf}/smoke-model.pt"
    assert smoke.order == ["shard_train", "shard_val", "train", "evaluate", "export"]


def test_a_shard_stage_is_an_array_then_a_manifest_job(smoke):
    array, manifest = smoke.stages["shard_train"].jobs
    text = render(array, None)
    lines = text.splitlines()
    assert {"#SBATCH --array=0-1", "#SBATCH --nodes=1", "#SBATCH --ntasks-per-node=1"} <= set(lines)
    assert "--task-index \"${SLURM_ARRAY_TASK_ID}\" --task-count 2" in text
    assert "touch" not in text                                     # only the last job marks the stage
    text = render(manifest, "afterok:41")
    lines = text.splitlines()
    assert "#SBATCH --dependency=afterok:41" in lines and "#SBATCH --kill-on-invalid-dep=yes" in lines
    assert "--task-index 0 --task-count 1" in text and " data verify " in text
    assert lines[-1].startswith("touch -- ") and lines[-1].endswith("/stages/shard_train/COMPLETE'")
    assert "set -euo pipefail" in lines                            # the marker only after success


def test_site_profile_setup_and_mail_reach_every_kind_of_stage(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    data = yaml.safe_load((REPO / "workflows/smoke.yaml").read_text())
    data["slurm"].update(site_profile="env/site.example.sh", setup=["module load mpi"], mail_type="FAIL")
    data["stages"]["notify"] = {"kind": "command", "after": ["export"], "run": "echo done"}
    data["stages"]["train"]["spec"] = str(REPO / "jobs/smoke.yaml")
    plan = make_plan(workflow_from_dict(data), WorkflowPaths.planned(str(tmp_path), "t"), PlannedDirs(),
                     cwd=tmp_path)
    kinds = set()
    for stage in plan.stages.values():
        for job in stage.jobs:
            lines = render(job, None).splitlines()
            after_strict = lines[lines.index("set -euo pipefail") + 1:]
            # The relative profile is the submit directory's, as in a job spec.
            assert after_strict[:2] == [f"source {tmp_path}/env/site.example.sh", "module load mpi"]
            assert "#SBATCH --mail-type=FAIL" in lines
            kinds.add(stage.kind)
    assert kinds == {"shard", "evaluate", "export", "command"}


def test_odd_paths_stay_one_word_and_run_nothing(smoke, tmp_path):
    text = render(smoke.stages["evaluate"].jobs[0], None)
    line = next(li for li in text.splitlines() if " -m hpc_train evaluate " in li)
    words = subprocess.run(["bash", "-c", 'printf "%s\\n" ' + line.split(" -m hpc_train ", 1)[1]],
                           capture_output=True, text=True).stdout.splitlines()
    assert words == ["evaluate", str(REPO / "runs" / "smoke-<timestamp>"), "--split", "val"]
    assert "$(dir)" in text and not (tmp_path / "dir").exists()


def test_a_sweeps_best_member_is_chosen_when_the_job_starts(monkeypatch, tmp_path):
    monkeypatch.chdir(REPO)
    plan = check("workflows/sweep.yaml", [], root=str(tmp_path))
    text = render(plan.stages["evaluate"].jobs[0], "afterok:7")
    lines = text.splitlines()
    best = next(li for li in lines if li.startswith("best_train=$("))
    assert " -m hpc_train workflow best " in best and best.endswith(" train --record)")
    assert any(li.endswith(' evaluate "${best_train}" --split val') for li in lines)
    assert lines.index(best) < next(i for i, li in enumerate(lines) if " -m hpc_train evaluate " in li)


def test_a_command_stage_keeps_the_users_shell_and_quotes_values():
    known = {refs.Ref("train", "run_dir"): refs.literal("/runs/a b"),
             refs.Ref("sweep", "best.run_dir"): (refs.Best("sweep"),)}
    from hpc_train.workflow.script import Shell

    line = shell_line(Shell('rsync -a {train.run_dir}/ "$TMPDIR"/{x,y} && ls {sweep.best.run_dir}', known))
    assert line == 'rsync -a \'/runs/a b\'/ "$TMPDIR"/{x,y} && ls "${best_sweep}"'


def test_dry_run_shows_the_graph_and_every_script(smoke):
    text = dry_run_text(smoke)
    assert "evaluate <- train" in text and "shard_val <- shard_train" in text
    assert text.count("#!/bin/bash") == 6                          # 2 shard_train jobs + 4
    assert "#SBATCH --dependency='afterok:{shard_val}'" in text    # the train job, by submitit
    assert "exec " in text and "hpc_train.job.driver" in text


def test_a_train_stage_problem_names_the_stage_and_the_file(monkeypatch, tmp_path):
    from hpc_train.spec import SpecInvalid

    monkeypatch.chdir(REPO)
    data = yaml.safe_load((REPO / "workflows/smoke.yaml").read_text())
    data["stages"]["train"]["spec"] = str(tmp_path / "bad.yaml")
    (tmp_path / "bad.yaml").write_text("run: {name: x}\noptim: {epochs: -3}\n")
    (tmp_path / "wf.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(SpecInvalid) as caught:
        check(str(tmp_path / "wf.yaml"), [])
    assert str(caught.value).startswith(f"stages.train.spec ({tmp_path / 'bad.yaml'}): optim.epochs: -3 ")

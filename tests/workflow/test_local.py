"""Without Slurm the stages run here in dependency order, in the same workflow directory; status,
resume and `workflow best` read that directory alike. Command stages only: no training here."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from hpc_train import events as run_events
from hpc_train.rundir import RunPaths, append_jsonl
from hpc_train.workflow import events
from hpc_train.workflow.paths import WorkflowPaths
from tests.runs import cli, path_without

STAGES = {
    "stage_in": {"kind": "command", "run": "echo data > {workflow.dir}/in.txt"},
    "convert": {"kind": "command", "after": ["stage_in"], "tasks": 2,
                "run": 'cat {workflow.dir}/in.txt > {workflow.dir}/part-"$SLURM_ARRAY_TASK_ID".txt'},
    "check": {"kind": "command", "after": ["convert"], "run": "test -f {workflow.dir}/ok"},
    "publish": {"kind": "command", "after": ["check"], "run": "echo published > {workflow.dir}/pub.txt"},
    "cleanup": {"kind": "command", "after_any": ["check"], "run": "echo done >> {workflow.dir}/cleanup.txt"},
}


@pytest.fixture
def no_slurm(tmp_path):
    return {**os.environ, "PATH": path_without(tmp_path / "bin")}


def run_dir_of(stdout: str) -> Path:
    return Path(next(li.split(": ", 1)[1] for li in stdout.splitlines() if li.startswith("workflow dir:")))


@pytest.mark.slow
def test_local_run_status_and_resume(tmp_path, no_slurm):
    path = tmp_path / "wf.yaml"
    path.write_text(yaml.safe_dump({"name": "chores", "root": str(tmp_path / "runs"), "stages": STAGES},
                                   sort_keys=False))
    out = cli("workflow", "run", str(path), env=no_slurm)
    assert out.returncode == 1, out.stderr                        # a stage failed
    assert "sbatch is not on PATH: running the stages here" in out.stderr
    wf = run_dir_of(out.stdout)
    assert wf.parent == tmp_path / "runs" and wf.name.startswith("chores-")
    assert (wf / "in.txt").read_text() == "data\n"
    assert sorted(p.name for p in wf.glob("part-*.txt")) == ["part-0.txt", "part-1.txt"]
    assert not (wf / "pub.txt").exists()                          # after check, which failed
    assert (wf / "cleanup.txt").read_text() == "done\n"           # after_any: ran regardless
    assert (wf / "workflow.yaml").is_file() and (wf / "stages" / "convert" / "COMPLETE.1").is_file()

    status = json.loads(cli("workflow", "status", str(wf), "--json", env=no_slurm).stdout)
    states = {s["name"]: s["state"] for s in status["stages"]}
    assert states == {"stage_in": "COMPLETED", "convert": "COMPLETED", "check": "FAILED",
                      "publish": "CANCELLED", "cleanup": "COMPLETED"}
    assert status["failed_stage"] == "check" and status["executor"] == "local"
    assert "exit 1" in next(s for s in status["stages"] if s["name"] == "check")["failure"]

    (wf / "ok").touch()                                           # the fix
    out = cli("workflow", "resume", str(wf), env=no_slurm)
    assert out.returncode == 0, out.stderr
    assert "complete, skipped:   stage_in, convert" in out.stdout
    again = [li.split()[1] for li in out.stdout.splitlines() if li.strip().startswith("again:")]
    assert again == ["check", "publish", "cleanup"]               # the failed stage and all after it
    assert (wf / "pub.txt").is_file() and (wf / "cleanup.txt").read_text() == "done\ndone\n"
    out = cli("workflow", "resume", str(wf), env=no_slurm)        # idempotent
    assert out.returncode == 0 and "nothing to submit" in out.stdout
    assert (wf / "cleanup.txt").read_text() == "done\ndone\n"
    table = cli("workflow", "status", str(wf), env=no_slurm).stdout
    assert "failed stage" not in table and table.count("COMPLETED") == 5


def fake_member(run_dir: Path, state: str, accuracy: float | None) -> None:
    paths = RunPaths(run_dir)
    paths.make_dirs()
    run_events.record(paths, run_events.finished(state, "test", 0, 1.0))
    if accuracy is not None:
        append_jsonl(paths.metrics, {"step": 10, "split": "val", "accuracy": accuracy})


def test_best_member_of_a_sweep_is_recorded(tmp_path):
    paths = WorkflowPaths(tmp_path / "wf")
    paths.root.mkdir()
    members = [{"index": i, "run_dir": str(tmp_path / f"m{i}"), "overrides": {}, "label": ""}
               for i in range(4)]
    for member, (state, accuracy) in zip(members, [("completed", 0.5), ("completed", 0.7),
                                                   ("failed", 0.9), ("completed", None)]):
        fake_member(Path(member["run_dir"]), state, accuracy)
    paths.resolved.write_text(yaml.safe_dump({"name": "s", "order": ["train"], "stages": {"train": {
        "kind": "train", "members": members, "best_by": "val.accuracy", "best_mode": "max"}}}))
    out = cli("workflow", "best", str(paths.root), "train", "--record")
    assert out.returncode == 0, out.stderr
    assert out.stdout == f"{tmp_path / 'm1'}\n"                   # m2 failed: its 0.9 does not count
    chosen = events.best_choice(events.read(paths), "train")
    assert (chosen["index"], chosen["value"], chosen["run_dir"]) == (1, 0.7, str(tmp_path / "m1"))
    out = cli("workflow", "best", str(paths.root), "nope")
    assert out.returncode == 7 and "nope: not a sweep stage" in out.stderr

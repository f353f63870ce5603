"""What `workflow resume` counts as done: a stage's marker and its outputs, not Slurm's word."""

from __future__ import annotations

import json

from hpc_train.workflow import verify
from hpc_train.workflow.paths import WorkflowPaths


def test_a_shard_split_is_done_when_its_manifest_matches_the_files(tmp_path):
    split = tmp_path / "train"
    split.mkdir()
    (split / "shard-00000.h5").write_bytes(b"x" * 10)
    (split / "manifest.json").write_text(json.dumps({"shards": [{"file": "shard-00000.h5", "bytes": 10}]}))
    assert verify.manifest_problem(split) is None
    (split / "shard-00000.h5").write_bytes(b"x" * 9)              # cut short
    assert "not the size the manifest records" in verify.manifest_problem(split)
    (split / "manifest.json").write_text("{")
    assert "manifest.json" in verify.manifest_problem(split)


def test_markers_and_outputs(tmp_path):
    paths = WorkflowPaths(tmp_path)
    export = {"kind": "export", "outputs": {"output": str(tmp_path / "m.pt")}}
    assert "no COMPLETE" in verify.incomplete(paths, "export", export, [])
    paths.stage_dir("export").mkdir(parents=True)
    paths.marker("export").touch()
    assert "m.pt is missing" in verify.incomplete(paths, "export", export, [])
    (tmp_path / "m.pt").touch()
    assert verify.incomplete(paths, "export", export, []) is None
    command = {"kind": "command", "tasks": 2, "outputs": {}}
    paths.stage_dir("cmd").mkdir()
    paths.marker("cmd", 0).touch()
    assert "COMPLETE.1" in verify.incomplete(paths, "cmd", command, [])
    paths.marker("cmd", 1).touch()
    assert verify.incomplete(paths, "cmd", command, []) is None


def test_the_evaluated_run_of_a_best_member_and_its_latest_evaluation(tmp_path):
    record = {"kind": "evaluate", "split": "val", "outputs": {"run_dir": "{train.best.run_dir}"}}
    assert verify.evaluated_run(record, []) is None               # not chosen yet
    history = [{"event": "best_chosen", "stage": "train", "run_dir": str(tmp_path)}]
    assert verify.evaluated_run(record, history) == str(tmp_path)
    for step in (92, 184, 1000):
        (tmp_path / f"eval-val-{step}.json").write_text("{}")
    (tmp_path / "eval-train-5.json").write_text("{}")
    assert [p.name for p in verify.evaluations(str(tmp_path), "val")] == \
        ["eval-val-92.json", "eval-val-184.json", "eval-val-1000.json"]


def test_what_a_later_stage_waits_for_on_resume():
    from hpc_train.workflow import events
    from hpc_train.workflow.resume import current_jobs, waiting_job

    history = [events.stage_submitted("shard", {"array": "10", "manifest": "11"}),
               events.stage_submitted("train", {"sweep": "12"}, {k: f"12_{k}" for k in range(4)}),
               events.stage_submitted("train", {"sweep": "20"}, {1: "20_1", 3: "20_3"}, again=True)]
    assert waiting_job(history, "shard") == "11"                  # the manifest job, last
    assert waiting_job(history, "train") == "12:20"               # both arrays
    assert current_jobs(history, "train") == ["12_0", "12_2", "20_1", "20_3"]


def test_a_stage_cancelled_after_its_work_was_done_is_completed_as_resume_counts_it(tmp_path):
    """A submission failing midway cancels what it submitted: an array whose tasks had already
    written their markers ends CANCELLED in Slurm, yet its work is done (resume skips it)."""
    from hpc_train.scheduler import Job, JobState
    from hpc_train.workflow import events
    from hpc_train.workflow.status import _script_stage

    paths = WorkflowPaths(tmp_path)
    record = {"kind": "command", "tasks": 2, "outputs": {}}
    history = [events.stage_submitted("fetch", {"array": "23"})]
    rows = {f"23_{k}": Job(job_id=f"23_{k}", state=JobState.CANCELLED) for k in (0, 1)}
    paths.stage_dir("fetch").mkdir(parents=True)
    paths.marker("fetch", 0).touch()
    assert _script_stage(paths, "fetch", record, history, rows, local=False).state == "CANCELLED"
    paths.marker("fetch", 1).touch()
    done = _script_stage(paths, "fetch", record, history, rows, local=False)
    assert done.state == "COMPLETED" and "outputs verify" in done.reason

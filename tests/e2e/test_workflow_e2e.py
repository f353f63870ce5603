"""Workflows on the real Slurm: everything submitted at once, chained by Slurm's dependencies.

- command stages (cheap): a failure cancels what waits for it (afterok + --kill-on-invalid-dep),
  `after_any` runs regardless, resume reruns the failed stage and all after it, twice is once;
  a submission failing midway cancels and records what it had submitted; cancel;
- workflows/smoke.yaml: shard array of 2 + val -> train -> evaluate -> export, all COMPLETED; the
  evaluation equals the trainer's last val accuracy; the export loads with weights_only=True and
  gives the checkpoint's outputs;
- workflows/sweep.yaml: 4 members as one array with %2, one member requeued with
  `scontrol requeue <array>_<k>` mid-run completes, status ranks the members, evaluate uses the best;
- a train stage forced to fail: Slurm cancels its dependents, status names the stage and the rank's
  error, resume reruns only it and the stages after it.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from hpc_train.rundir import RunPaths, read_jsonl
from hpc_train.workflow import events as wf_events
from hpc_train.workflow.paths import WorkflowPaths
from hpc_train.scheduler import ACTIVE_STATES
from hpc_train.workflow.status import collect
from tests.runs import cli, describe_failure, events, heartbeat_step, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.slow]


def start(slurm_cluster, *args: str) -> WorkflowPaths:
    out = cli("workflow", *args)
    assert out.returncode == 0, out.stderr
    paths = WorkflowPaths(Path(next(li.split(": ", 1)[1] for li in out.stdout.splitlines()
                                    if li.startswith("workflow dir:"))))
    slurm_cluster.job_ids.extend(job_ids(paths))
    return paths


def job_ids(paths: WorkflowPaths) -> list[str]:
    return wf_events.all_jobs(wf_events.read(paths))


def settle(paths: WorkflowPaths, timeout: float) -> dict:
    """Poll status until no stage (or member) is pending or running; the status as JSON."""
    deadline = time.monotonic() + timeout
    while True:
        status = collect(paths.root).to_json()
        states = [s["state"] for s in status["stages"]] + \
                 [m["state"] for s in status["stages"] for m in s["members"]]
        if not any(state in ACTIVE_STATES or state == "UNKNOWN" for state in states):
            return status
        assert time.monotonic() < deadline, f"still {states} after {timeout} s"
        time.sleep(2)


def states(status: dict) -> dict[str, str]:
    return {s["name"]: s["state"] for s in status["stages"]}


def stage(status: dict, name: str) -> dict:
    return next(s for s in status["stages"] if s["name"] == name)


def sacct(job: str, *fields: str) -> list[list[str]]:
    out = subprocess.run(["sacct", "-X", "-n", "-P", "-j", job, "-o", ",".join(fields)],
                         capture_output=True, text=True, timeout=30).stdout
    return [line.split("|") for line in out.splitlines() if line]


def accounted(array: str, tasks: int, timeout: float = 120) -> list[str]:
    """The array's task ids as sacct lists them, once it lists `tasks` (slurmdbd may lag)."""
    deadline = time.monotonic() + timeout
    while True:
        found = sorted(row[0] for row in sacct(array, "JobID"))
        if len(found) >= tasks or time.monotonic() > deadline:
            return found
        time.sleep(2)


# -- command stages: the engine itself, seconds per job ----------------------------------------

CHORES = {
    "fetch": {"kind": "command", "tasks": 2, "run": 'echo "$SLURM_ARRAY_TASK_ID" > {workflow.dir}/f-"$SLURM_ARRAY_TASK_ID"'},
    "check": {"kind": "command", "after": ["fetch"], "run": "test -f {workflow.dir}/ok"},
    "publish": {"kind": "command", "after": ["check"], "run": "touch {workflow.dir}/published"},
    "report": {"kind": "command", "after_any": ["check"], "run": "echo x >> {workflow.dir}/reported"},
}


def chores_file(tmp_path: Path, **extra) -> str:
    path = tmp_path / "chores.yaml"
    stages = {name: {**spec, **extra.get(name, {})} for name, spec in CHORES.items()}
    path.write_text(yaml.safe_dump({"name": "chores", "root": str(tmp_path / "runs"),
                                    "slurm": {"time": "00:02:00", "mem": "100M"}, "stages": stages},
                                   sort_keys=False))
    return str(path)


def test_a_failure_cancels_what_waits_and_resume_reruns_it_and_after(slurm_cluster, tmp_path):
    paths = start(slurm_cluster, "run", chores_file(tmp_path))
    status = settle(paths, 900)
    assert states(status) == {"fetch": "COMPLETED", "check": "FAILED", "publish": "CANCELLED",
                              "report": "COMPLETED"}, status
    assert "DependencyNeverSatisfied" in stage(status, "publish")["reason"]
    fetch = stage(status, "fetch")["job_ids"][0]
    assert accounted(fetch, 2) == [f"{fetch}_0", f"{fetch}_1"]
    assert status["failed_stage"] == "check"
    table = cli("workflow", "status", str(paths.root)).stdout
    assert "failed stage: check" in table and "workflow resume" in table

    (paths.root / "ok").touch()                                    # the fix
    out = cli("workflow", "resume", str(paths.root))
    assert out.returncode == 0, out.stderr
    slurm_cluster.job_ids.extend(job_ids(paths))
    assert "complete, skipped:   fetch" in out.stdout
    assert [li.split()[1] for li in out.stdout.splitlines() if "again:" in li] == ["check", "publish", "report"]
    again = cli("workflow", "resume", str(paths.root))            # at once: the same jobs are queued
    assert again.returncode == 0 and "nothing to submit" in again.stdout, again.stdout
    status = settle(paths, 900)
    assert set(states(status).values()) == {"COMPLETED"}, status
    assert stage(status, "fetch")["job_ids"] == [fetch]            # not run again
    assert (paths.root / "published").is_file()
    assert (paths.root / "reported").read_text() == "x\nx\n"


def test_a_submission_failing_midway_is_cancelled_and_resumable(slurm_cluster, tmp_path):
    # sbatch refuses the third stage (no such partition): the two before it were submitted.
    out = cli("workflow", "run", chores_file(tmp_path, publish={"slurm": {"partition": "nosuchpartition"}}))
    assert out.returncode == 3, out.stderr
    assert "stage publish: sbatch" in out.stderr and "were cancelled" in out.stderr
    paths = WorkflowPaths(next((tmp_path / "runs").glob("chores-*")))
    history = wf_events.read(paths)
    failure = wf_events.submission_failure(history)
    assert failure["stage"] == "publish" and failure["cancel_error"] is None
    assert sorted(failure["cancelled"]) == sorted(job_ids(paths))
    slurm_cluster.job_ids.extend(job_ids(paths))
    for job in failure["cancelled"]:
        # slurmdbd may record the cancel a moment after scancel returned.
        wait_for(lambda: all(row[0].startswith("CANCELLED") for row in sacct(job, "State")), 60,
                 f"sacct to show job {job} CANCELLED (it shows {sacct(job, 'State')})")

    (paths.root / "ok").touch()
    out = cli("workflow", "resume", str(paths.root), "--set", "publish.slurm.partition=null")
    assert out.returncode == 0, out.stderr
    slurm_cluster.job_ids.extend(job_ids(paths))
    status = settle(paths, 900)
    assert set(states(status).values()) == {"COMPLETED"}, status
    assert status["submission_error"] is None


def test_cancel_stops_every_queued_job(slurm_cluster, tmp_path):
    path = chores_file(tmp_path, fetch={"run": "sleep 60"})
    paths = start(slurm_cluster, "run", path)
    out = cli("workflow", "cancel", str(paths.root))
    assert out.returncode == 0, out.stderr
    assert sorted(out.stdout.split(":", 1)[1].split()) == sorted(job_ids(paths))
    status = settle(paths, 60)
    assert set(states(status).values()) == {"CANCELLED"}, status


# -- the shipped workflows ------------------------------------------------------------------

def test_smoke_workflow_shards_trains_evaluates_and_exports(slurm_cluster, tmp_path):
    import torch

    from hpc_train.evaluate.data import evaluation_data
    from hpc_train.export import load_exported
    from hpc_train.train.saved_run import SavedCheckpoint, choose_step, open_run

    # One epoch instead of two: the same chain at half the CPU (this machine has two cores).
    paths = start(slurm_cluster, "run", "workflows/smoke.yaml", "--root", str(tmp_path),
                  "--set", f"train.run.root={tmp_path}", "--set", "train.optim.epochs=1")
    status = settle(paths, 900)
    run = RunPaths(Path(stage(status, "train")["run_dirs"][0]))
    assert set(states(status).values()) == {"COMPLETED"}, (status, describe_failure(run))
    shard = stage(status, "shard_train")["job_ids"]
    assert accounted(shard[0], 2) == [f"{shard[0]}_0", f"{shard[0]}_1"]
    assert [row[0] for row in sacct(shard[0], "State")] == ["COMPLETED", "COMPLETED"]
    assert (paths.stage_dir("train") / "run").resolve() == run.root
    assert (paths.root / "shards" / "val" / "manifest.json").is_file()
    table = cli("workflow", "status", str(paths.root)).stdout
    assert all(f"{name}\t" in table for name in states(status)) and "failed" not in table

    last_val = [m for m in read_jsonl(run.metrics) if m.get("split") == "val"][-1]
    report = json.loads(next(run.root.glob(f"eval-val-{last_val['step']}.json")).read_text())
    assert report["accuracy"] == last_val["accuracy"]              # exactly the trainer's
    assert stage(status, "evaluate")["metric"] == last_val["accuracy"]

    exported = paths.root / "smoke-model.pt"
    saved = torch.load(exported, weights_only=True)
    model, meta = load_exported(exported)
    assert set(saved) >= {"state_dict", "meta"} and meta["step"] == last_val["step"]
    saved_run, spec = open_run(run.root)
    dataset, _, _ = evaluation_data(spec, "val", None)
    images = torch.stack([dataset[i][0] for i in range(16)])
    expected = SavedCheckpoint(saved_run, spec, choose_step(saved_run, None)).model()(images)
    assert torch.equal(model(images), expected)


def test_sweep_is_one_array_survives_a_member_requeue_and_evaluates_the_best(slurm_cluster, tmp_path):
    # The shipped sweep, with larger batches: fewer steps per member on this 2-core machine.
    paths = start(slurm_cluster, "run", "workflows/sweep.yaml", "--root", str(tmp_path),
                  "--set", f"train.run.root={tmp_path}", "--set", "train.sweep.grid.data.batch_size=[32, 64]")
    array = wf_events.stage_jobs(wf_events.read(paths), "train")["sweep"]
    members = [RunPaths(Path(d)) for d in yaml.safe_load(paths.resolved.read_text())["stages"]["train"]["run_dirs"]]
    assert "#SBATCH --array=0-3%2" in members[0].sbatch.read_text().splitlines()
    # Requeue member 0 (the smaller batch: the longer run) while it trains.
    deadline = time.monotonic() + 600                              # queue wait included
    while heartbeat_step(members[0]) < 2:
        assert time.monotonic() < deadline, describe_failure(members[0])
        running = subprocess.run(["squeue", "-h", "-r", "-j", array, "-t", "RUNNING", "-o", "%i"],
                                 capture_output=True, text=True, timeout=30).stdout.split()
        assert len(running) <= 2, running                          # %2: two members at once
        time.sleep(0.5)
    out = subprocess.run(["scontrol", "requeue", f"{array}_0"], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr
    status = settle(paths, 900)
    assert states(status) == {"train": "COMPLETED", "evaluate": "COMPLETED"}, status

    assert accounted(array, 4) == [f"{array}_{k}" for k in range(4)]
    requeued = events(members[0], "requeued")
    assert [(e["job_id"], e["by"]) for e in requeued] == [(f"{array}_0", "slurm")]
    assert [e["restart"] for e in events(members[0], "started")] == [0, 1]
    assert all(events(m, "finished")[-1]["status"] == "completed" for m in members)
    assert all(not events(m, "requeued") for m in members[1:])     # only the one task was requeued

    train = stage(status, "train")
    accuracy = {m["index"]: m["metric"] for m in train["members"]}
    best = max(accuracy, key=lambda k: (accuracy[k], -k))
    assert train["best"] == best and sorted(m["rank"] for m in train["members"]) == [1, 2, 3, 4]
    chosen = wf_events.best_choice(wf_events.read(paths), "train")
    assert chosen["index"] == best and chosen["run_dir"] == str(members[best].root)
    assert list(members[best].root.glob("eval-val-*.json"))        # evaluate ran on the best member
    assert stage(status, "evaluate")["metric"] == accuracy[best]


# With --heavy: the chores workflow above covers cancel and resume in CI; this one the same with
# the shipped smoke workflow's real train stage.
@pytest.mark.heavy
def test_a_failed_stage_cancels_its_dependents_and_resume_reruns_from_it(slurm_cluster, tmp_path):
    paths = start(slurm_cluster, "run", "workflows/smoke.yaml", "--root", str(tmp_path),
                  "--set", f"train.run.root={tmp_path}", "--set", "train.optim.epochs=1",
                  "--set", "train.launch.env.HPC_TRAIN_FAULT=raise:1:3",
                  "--set", "train.launch.restarts_in_job=0")
    status = settle(paths, 900)
    assert states(status) == {"shard_train": "COMPLETED", "shard_val": "COMPLETED", "train": "FAILED",
                              "evaluate": "CANCELLED", "export": "CANCELLED"}, status
    for name, before in (("evaluate", "train"), ("export", "evaluate")):
        job = stage(status, name)["job_ids"][0]
        assert [row[0] for row in sacct(job, "State")] == ["CANCELLED"]   # by Slurm: nobody else did
        assert stage(status, name)["reason"].startswith(f"cancelled by Slurm: {before} did not complete")
    assert status["failed_stage"] == "train"
    failure = stage(status, "train")["failure"]
    assert failure.startswith("rank 1") and "injected failure on rank 1 at step 3" in failure, failure
    table = cli("workflow", "status", str(paths.root)).stdout
    assert "failed stage: train (rank 1" in table
    shard_jobs = {name: stage(status, name)["job_ids"] for name in ("shard_train", "shard_val")}

    out = cli("workflow", "resume", str(paths.root), "--set", 'train.launch.env.HPC_TRAIN_FAULT=""',
              "--allow-spec-change")
    assert out.returncode == 0, out.stderr
    slurm_cluster.job_ids.extend(job_ids(paths))
    assert "complete, skipped:   shard_train, shard_val" in out.stdout
    assert [li.split()[1] for li in out.stdout.splitlines() if "again:" in li] == ["train", "evaluate", "export"]
    status = settle(paths, 900)
    run = RunPaths(Path(stage(status, "train")["run_dirs"][0]))
    assert set(states(status).values()) == {"COMPLETED"}, (status, describe_failure(run))
    assert {name: stage(status, name)["job_ids"] for name in shard_jobs} == shard_jobs
    assert len(events(run, "resubmitted")) == 1 and events(run, "finished")[-1]["status"] == "completed"
    assert (paths.root / "smoke-model.pt").is_file()

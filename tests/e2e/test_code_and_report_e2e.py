"""A requeued job runs the code it was submitted with, and `report` accounts for the requeue.

Two smoke jobs are submitted from a copy of the project (PYTHONPATH pointing at the copy), one
with the default code snapshot and one with --no-snapshot. While both train, the copy's worker
is edited (its last log line gets a marker) and both jobs are requeued with `scontrol requeue`.
The snapshot job's ranks end without the marker; the other job's, which imports the edited
checkout after its requeue, end with it: the marker tells which code ran.

`report` then reads the snapshot run (stopped once, requeued, finished) from sacct and the run
directory: its figures must agree with the events, and the timeline must be a PNG.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from hpc_train.rundir import RunPaths, read_jsonl
from tests.conftest import REPO
from tests.runs import cli, describe_failure, events, logged_step, wait_for

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
DONE_LINE = 'log.info("rank %d done", identity.rank)'
MARKER = "EDITED-AFTER-SUBMIT"


def _copy_project(target) -> None:
    shutil.copytree(REPO / "hpc_train", target / "hpc_train", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "jobs", target / "jobs")
    (target / "data").symlink_to((REPO / "data").resolve())


def _submit_from(project, root, name: str, *extra: str) -> tuple[str, RunPaths]:
    out = cli("submit", "jobs/smoke.yaml", "--set", f"run.root={root}", "--set", f"run.name={name}",
              "--set", "log.every_steps=1", *extra, cwd=project,
              env={**os.environ, "PYTHONPATH": str(project)})
    assert out.returncode == 0, out.stderr
    job_id = re.search(r"^job id:\s+(\S+)$", out.stdout, re.M).group(1)
    return job_id, RunPaths(Path(re.search(r"^run dir:\s+(.+)$", out.stdout, re.M).group(1)))


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("code")
    project = tmp / "project"
    _copy_project(project)
    worker = project / "hpc_train" / "job" / "worker.py"
    assert DONE_LINE in worker.read_text()
    submitted = {}
    for name, extra in (("snapshot", ()), ("live", ("--no-snapshot",))):
        job_id, paths = _submit_from(project, tmp / "runs", name, *extra)
        slurm_cluster.job_ids.append(job_id)
        submitted[name] = (job_id, paths)

    # Each job: once it trains, the checkout changes (once), then Slurm requeues the job.
    pending = dict(submitted)

    def act():
        for name, (job_id, paths) in list(pending.items()):
            if events(paths, "finished"):
                raise AssertionError(f"{name} finished before it was requeued\n{describe_failure(paths)}")
            if logged_step(paths) >= 6:
                if MARKER not in worker.read_text():
                    worker.write_text(worker.read_text().replace(
                        DONE_LINE, DONE_LINE.replace("done", f"done {MARKER}")))
                subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=30)
                del pending[name]
        return not pending
    wait_for(act, 600, "both jobs to train, then be requeued")
    for job_id, paths in submitted.values():
        state = slurm_cluster.wait_state(job_id, ENDED, timeout=600)
        assert state == "COMPLETED", describe_failure(paths)
    return submitted, project


def _done_lines(paths: RunPaths) -> list[str]:
    return [line for rank in (0, 1) for line in paths.rank_log(rank).read_text().splitlines()
            if f"rank {rank} done" in line]


def test_a_requeued_job_runs_the_code_it_was_submitted_with(jobs):
    submitted, project = jobs
    for name, (job_id, paths) in submitted.items():
        assert [e["restart"] for e in events(paths, "started")] == [0, 1], (name, describe_failure(paths))
    assert MARKER in (project / "hpc_train" / "job" / "worker.py").read_text()

    _, snap = submitted["snapshot"]
    assert len(_done_lines(snap)) == 2 and not any(MARKER in line for line in _done_lines(snap))
    assert MARKER not in (snap.code / "hpc_train" / "job" / "worker.py").read_text()
    # Every start imported the snapshot: the driver's record and each rank's first line say so.
    job_lines = [e for e in read_jsonl(snap.environment) if e["where"] == "job"]
    assert [e["restart"] for e in job_lines] == [0, 1]
    assert {e["code"] for e in job_lines} == {str(snap.code / "hpc_train")}
    starts = [line for line in snap.rank_log(0).read_text().splitlines() if " pid " in line and " code " in line]
    assert len(starts) == 2 and all(line.endswith(f"code {snap.code / 'hpc_train'}") for line in starts)
    [submit_line] = [e for e in read_jsonl(snap.environment) if e["where"] == "submit"]
    assert submit_line["source"] == str(project / "hpc_train") and submit_line["git"] is None
    assert snap.code.resolve().parent == snap.root.parent / ".code"

    # The control: without a snapshot the requeued ranks import the edited checkout.
    _, live = submitted["live"]
    assert not live.code.exists()
    assert all(MARKER in line for line in _done_lines(live)) and len(_done_lines(live)) == 2
    assert {e["code"] for e in read_jsonl(live.environment) if e["where"] == "job"} == {
        str(project / "hpc_train")}


def test_report_of_the_requeued_run_agrees_with_its_events(jobs):
    submitted, _ = jobs
    job_id, paths = submitted["snapshot"]
    out = cli("report", str(paths.root), "--json")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    started = events(paths, "started")
    # Accounting is on: one sacct segment per start of the job, one requeue between them.
    assert doc["usage"]["source"] == "sacct" and doc["job_ids"] == [job_id]
    assert len(doc["segments"]) == len(started) == 1 + doc["requeues"] == 2
    assert [s["state"] for s in doc["segments"]] == ["REQUEUED", "COMPLETED"]
    for segment, start in zip(doc["segments"], started):
        assert segment["start"] <= start["time"] <= segment["end"]
    assert doc["usage"]["core_hours"] == pytest.approx(
        sum(s["cpus"] * s["elapsed"] for s in doc["segments"]) / 3600)
    assert 0 < doc["usage"]["cpu_efficiency"] <= 1.0
    # Checkpoint time is the sum of the events'; the redone steps are those logged before the
    # requeue past the step the next start trained from.
    saved = events(paths, "checkpoint_saved")
    assert doc["checkpoints"] == {"saves": len(saved), "seconds": pytest.approx(sum(e["seconds"] for e in saved))}
    train = [m for m in read_jsonl(paths.metrics) if m.get("split") is None]
    before = max(m["step"] for m in train if m["time"] < started[1]["time"])
    resumed = [e["step"] for e in events(paths, "resumed")] or [0]
    [restart] = doc["restarts"]
    assert (restart["last_step"], restart["resumed_step"]) == (before, resumed[0])
    assert restart["redone_steps"] == before - resumed[0]
    # `scontrol requeue` TERMs every process of the job: the ranks either agreed on a stop and
    # saved at their last step (nothing redone) or mpirun ended them first (the steps since the
    # last periodic checkpoint, here the start, are redone). Both happen; each is told apart by
    # the stop's checkpoint (mpirun may end the ranks between that save and their `stop_saved`).
    stop_saves = [e for e in events(paths, "checkpoint_saved")
                  if e["reason"].startswith("stop") and e["time"] < started[1]["time"]]
    assert (restart["redone_steps"] == 0) == bool(stop_saves), (restart, stop_saves)
    assert restart["stopped"] < restart["started"] <= restart["training"]
    assert doc["last_step"] == 92 and doc["samples"] == 92 * 64
    assert doc["samples_per_hour"]["per"] == "core-hour"
    assert any(line.startswith("GPU utilisation and memory: not sampled") for line in doc["unknown"])

    from PIL import Image

    with Image.open(doc["timeline"]) as image:
        assert image.format == "PNG" and image.size[0] > 600
        image.verify()
    text = cli("report", str(paths.root), "--no-plot").stdout
    assert "segments:" in text and "2  (1 requeue(s))" in text and "not known: GPU utilisation" in text

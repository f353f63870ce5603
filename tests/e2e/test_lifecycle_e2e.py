"""Every way a job ends, on the real Slurm, with the shipped smoke job (HDF5 JPEG shards, random
crops and flips, two data workers per rank, persistent workers):

- stopped three ways (USR2 to the batch shell, `scontrol requeue`, `scancel --signal=TERM --full`)
  it ends COMPLETED with every rank's parameters bit-identical to the uninterrupted run, under
  Horovod and DDP alike, with asynchronous checkpoints (`checkpoint.write: async`, the shipped
  default; the sync writer is covered by tests/train/test_resume_exact.py), and under fsdp;
  so does the shipped ZeRO-3 job (jobs/transformer_zero_cpu.yaml, every rank's DeepSpeed shards);
- a rank frozen with SIGSTOP is named by `status` and `diagnose` while frozen (the driver held
  meanwhile, so its watchdog cannot act first), and the driver's watchdog requeues the job from
  its last checkpoint well before the time limit;
- a rank that freezes on every run ends FAILED after its retries, never TIMEOUT;
- a refused `scontrol requeue` ends the job FAILED with scontrol's words;
- `resume` of a running run is refused and leaves one job in the queue;
- a cancelled job is never recorded as requeued;
- a run tracked by W&B (offline) and MLflow (file store), requeued by USR2, then killed outright
  and resumed with `Run.resume()`, has one curve in each, every step once, under one tracker run.

All jobs are submitted at once by a module fixture; the single node runs two at a time. The
turnaround of each stop (signal to training again) is printed (pytest -s) for the notes.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest

from hpc_train.rundir import RunPaths
from tests.conftest import heavy_params, require, selected_plan
from tests.runs import (ONE_EPOCH, SMOKE_EPOCH_STEPS, await_beat, assert_same_training, cli,
                        describe_failure, events, logged_step, metrics_after, submit, wait_for)

pytestmark = [pytest.mark.slurm, pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}
SMOKE, ZERO = "jobs/smoke.yaml", "jobs/transformer_zero_cpu.yaml"
TOTAL_STEPS = 92            # jobs/smoke.yaml: 2 epochs of 46 steps (the tracked run's two val lines)
# The stopped, straight and frozen runs train one epoch: their stops come by step 28 and no
# assertion of theirs reads a second (46 steps less each, and fewer trained again).
# The ZeRO-3 job trains fast (about 10 steps a second here): three epochs (192 steps), stopped at
# steps where the previous stop's resume is well behind it.
ZERO_LONG, ZERO_STEPS, ZERO_STOPS = ["optim.epochs=3"], 192, (8, 70, 140)
# Logging every step changes no number of the training; it lets the test act at a step and
# compare the loss of every step.
WATCH = ["log.every_steps=1"]
FREEZE = ["launch.stall_seconds=40", "checkpoint.every_steps=10", "launch.restarts_in_job=0",
          "checkpoint.retries_on_failure=1", ONE_EPOCH, *WATCH]     # the requeue path (restarts: test_restart_e2e)
# CI's reduced form (the rest with --heavy): Horovod's run stopped three ways covers the replicated
# path; the sharded backends' stops and resumes are covered under mpirun by tests/train/test_fsdp.py
# and tests/parallel/test_deepspeed.py, and a failure on every run by test_run_state_e2e.py.
HEAVY = {"stopped-ddp", "straight-ddp", "stopped-fsdp", "straight-fsdp", "stopped-zero3",
         "straight-zero3", "frozen-always"}
TRACKED = [*WATCH, "log.trackers=[wandb, mlflow]", "checkpoint.every_steps=10"]
FAKE_SCONTROL = """#!/bin/sh
if [ "$1" = requeue ]; then echo "scontrol: error: requeue refused by the test's stand-in" >&2; exit 1; fi
exec {real} "$@"
"""


def _queue_state(job_id: str) -> str:
    return subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                          text=True, timeout=20).stdout.strip()


def _left_the_queue(job_id: str) -> bool:
    """Slurm lists a job (COMPLETING) until every process of it has ended, the driver's
    included; then no more, and once purged (MinJobAge) squeue knows no such id. An squeue that
    failed otherwise proves nothing."""
    out = subprocess.run(["squeue", "-h", "-j", job_id, "-o", "%T"], capture_output=True,
                         text=True, timeout=20)
    return (out.returncode == 0 and not out.stdout.strip()) or "Invalid job id" in out.stderr


def _driver_of(pid: int) -> int:
    """The driver's process: the ancestor of a rank's (mpirun's parent here, on one node) that
    runs hpc_train.job.driver, the batch script itself."""
    while pid > 1:
        if b"hpc_train.job.driver" in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0"):
            return pid
        status = Path(f"/proc/{pid}/status").read_text().splitlines()
        pid = int(next(line.split()[1] for line in status if line.startswith("PPid:")))
    raise AssertionError("no hpc_train.job.driver process above the rank")


@dataclass
class Job:
    job_id: str
    paths: RunPaths
    acted: Future | None = None      # what the actor saw and did while the job ran

    def observed(self, timeout: float = 900) -> dict:
        return self.acted.result(timeout=timeout)


@pytest.fixture(scope="module")
def jobs(slurm_cluster, tmp_path_factory, request):
    """Submit every job at once; an actor thread per job acts on it while it runs (the jobs take
    under a minute each: acting from the tests one after another would find them finished)."""
    root = tmp_path_factory.mktemp("lifecycle")
    fake = root / "fake-bin"
    fake.mkdir()
    real = subprocess.run(["which", "scontrol"], capture_output=True, text=True).stdout.strip()
    (fake / "scontrol").write_text(FAKE_SCONTROL.format(real=real))
    (fake / "scontrol").chmod(0o755)
    plan = {
        "stopped-horovod": ([ONE_EPOCH, *WATCH], _stop_three_ways),
        "stopped-ddp": (["parallel.backend=ddp", ONE_EPOCH, *WATCH], _stop_three_ways),
        "stopped-fsdp": (["parallel.backend=fsdp", ONE_EPOCH, *WATCH], _stop_three_ways),
        "stopped-zero3": ((ZERO, [*ZERO_LONG, *WATCH]), lambda j, p: _stop_three_ways(j, p, ZERO_STOPS)),
        "frozen-once": (FREEZE, _freeze_one_rank),
        "no-requeue": ([*WATCH, f"slurm.setup=[export PATH={fake}:$PATH]"], _usr2_at_step_8),
        "cancelled": (WATCH, _cancel_at_step_6),
        "tracked": (TRACKED, _requeue_then_kill),
        "frozen-always": ([*FREEZE, "launch.stall_seconds=20", "launch.env.HPC_TRAIN_FAULT=freeze:1:14"], None),
        "straight-horovod": ([ONE_EPOCH, *WATCH], None),
        "straight-ddp": (["parallel.backend=ddp", ONE_EPOCH, *WATCH], None),
        "straight-fsdp": (["parallel.backend=fsdp", ONE_EPOCH, *WATCH], None),
        "straight-zero3": ((ZERO, [*ZERO_LONG, *WATCH]), None),
    }
    plan = selected_plan(request.config, plan, HEAVY)
    submitted = {}
    with ThreadPoolExecutor(max_workers=len(plan)) as actors:
        for name, (job, act) in plan.items():
            spec_file, overrides = job if isinstance(job, tuple) else (SMOKE, job)
            job_id, paths = submit(spec_file, root, f"run.name={name}", *overrides)
            slurm_cluster.job_ids.append(job_id)
            submitted[name] = Job(job_id, paths, actors.submit(act, job_id, paths) if act else None)
        yield submitted


# -- actors: what happens to each job while it runs (threads started by the fixture) -----------

def _stop_three_ways(job_id: str, paths: RunPaths, at_steps=(8, 20, 28)) -> list[dict]:
    """USR2 to the batch shell, then `scontrol requeue`, then TERM to every process; each while
    the run is training past the last one's resume. Returns when and how each stop was sent."""
    stops, since = [], 0.0
    for kind, at_step in zip(("USR2", "scontrol requeue", "TERM --full"), at_steps):
        wait_for(lambda: logged_step(paths, since) >= at_step, 600, f"step {at_step} of {paths.root.name}")
        sent = time.time()
        command = {"USR2": ["scancel", "--batch", "--signal=USR2", job_id],
                   "scontrol requeue": ["scontrol", "requeue", job_id],
                   "TERM --full": ["scancel", "--full", "--signal=TERM", job_id]}[kind]
        subprocess.run(command, check=True, timeout=30)
        stops.append({"kind": kind, "sent": sent, "step": logged_step(paths, since)})
        # The next stop waits for the next run's own training (resumed, then logging again).
        resumed = wait_for(lambda: [e for e in events(paths, "resumed") if e["time"] > sent], 600,
                            f"the resume after {kind}")
        since = resumed[0]["time"]
        stops[-1]["resumed_from"] = resumed[0]["from_checkpoint"]
        stops[-1]["training_again"] = wait_for(
            lambda: next((m["time"] for m in metrics_after(paths, since)), None), 600, "a step")
    return stops


def _freeze_one_rank(job_id: str, paths: RunPaths) -> dict:
    """At step 24: try a second writer (resume), then SIGSTOP rank 1 and ask status and
    diagnose while it is frozen. Nobody continues it: the watchdog must end it.

    Status names a rank once its beat is silent_after(interval) old (12 s here), the watchdog
    acts after launch.stall_seconds (40 s): two clocks. So the driver, its watchdog in it, is
    held (SIGSTOP) until status has named the rank and diagnose has run, however long a loaded
    host makes that; continued, its watchdog finds the stall it would have found anyway."""
    wait_for(lambda: logged_step(paths) >= 24, 600, "step 24")
    seen = {"resume": cli("resume", str(paths.root)),
            "queued": subprocess.run(["squeue", "-h", "-n", "frozen-once", "-o", "%i"], capture_output=True,
                                     text=True, timeout=20).stdout.split()}
    seen["beat"] = await_beat(paths, 1)
    driver = _driver_of(seen["beat"]["pid"])

    def named_by_status():
        out = cli("status", str(paths.root), "--json")
        run = json.loads(out.stdout)["runs"][0] if out.returncode == 0 else {}
        health = run.get("health") or {}
        return (not health.get("ok", True) and 1 in health.get("stalled_ranks", [])
                and seen["beat"]["host"] in health.get("message", "")) and health
    os.kill(driver, signal.SIGSTOP)
    try:
        seen["frozen_at"] = time.time()
        os.kill(seen["beat"]["pid"], signal.SIGSTOP)
        seen["health"] = wait_for(named_by_status, 600, "status to name the frozen rank")
        seen["diagnosis"] = cli("diagnose", str(paths.root)).stdout
        seen["before_the_watchdog"] = _queue_state(job_id) == "RUNNING" and not events(paths, "ranks_stalled")
    finally:
        os.kill(driver, signal.SIGCONT)
    seen["continued_at"] = time.time()
    seen["requeued"] = wait_for(lambda: events(paths, "requeued"), 600, "the requeue")[0]
    return seen


def _usr2_at_step_8(job_id: str, paths: RunPaths) -> float:
    wait_for(lambda: logged_step(paths) >= 8, 600, "step 8")
    subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], check=True, timeout=30)
    return time.time()


def _cancel_at_step_6(job_id: str, paths: RunPaths) -> float:
    wait_for(lambda: logged_step(paths) >= 6, 600, "step 6")
    subprocess.run(["scancel", job_id], check=True, timeout=30)
    return time.time()


def _requeue_then_kill(job_id: str, paths: RunPaths) -> dict:
    """USR2 at step 12 (the driver saves there and requeues); then, in the requeued run, past
    the checkpoint of step 40, SIGKILL to every process of the job: nothing saved, so the resume
    trains again the steps after 40 that the trackers had logged."""
    wait_for(lambda: logged_step(paths) >= 12, 600, "step 12")
    subprocess.run(["scancel", "--batch", "--signal=USR2", job_id], check=True, timeout=30)
    resumed = wait_for(lambda: events(paths, "resumed"), 600, "the resume after USR2")[0]
    wait_for(lambda: [e for e in events(paths, "checkpoint_saved") if e["step"] == 40]
             and logged_step(paths, resumed["time"]) >= 46, 600, "step 46 after checkpoint 40")
    _kill_outright(job_id)
    return {"resumed_from": resumed["from_checkpoint"]}


def _kill_outright(job_id: str) -> None:
    """SIGKILL every process of the job at once, as a dead node or the OOM killer would end it
    (scancel's signals reach the driver as a cancel, and it saves first)."""
    out = subprocess.run(["scontrol", "listpids", job_id], capture_output=True, text=True, timeout=30,
                         check=True).stdout
    pids = [int(line.split()[0]) for line in out.splitlines()[1:] if line.split()[:1] != ["-1"]]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def _ended(slurm_cluster, job: Job, timeout: float = 900) -> str:
    return slurm_cluster.wait_state(job.job_id, ENDED, timeout=timeout)


# -- the tests -----------------------------------------------------------------------------------

@pytest.mark.parametrize("backend", heavy_params(["horovod", "ddp", "fsdp", "zero3"],
                                                 {"ddp", "fsdp", "zero3"}))
def test_a_job_stopped_three_ways_ends_bit_identical(backend, jobs, slurm_cluster):
    job, straight = jobs[f"stopped-{backend}"], jobs[f"straight-{backend}"]
    stops = job.observed()
    for stop in stops:
        print(f"[turnaround] {backend} {stop['kind']}: sent at step {stop['step']}, resumed from "
              f"checkpoint {stop['resumed_from']}, training again after "
              f"{stop['training_again'] - stop['sent']:.1f} s")
    paths = job.paths
    assert _ended(slurm_cluster, job) == "COMPLETED", describe_failure(paths)
    assert _ended(slurm_cluster, straight) == "COMPLETED", describe_failure(straight.paths)

    # Three requeues under one job id, each recorded as what it was. Slurm's own requeue
    # SIGKILLs the driver 5 s (KillWait) after its TERM, which may come before the record:
    # a missing record is allowed there, a wrong one nowhere.
    assert [e["restart"] for e in events(paths, "started")] == [0, 1, 2, 3]
    requeued = {e["restart"]: e for e in events(paths, "requeued")}
    assert (requeued[0]["cause"], requeued[0]["by"]) == ("stop", "driver"), requeued
    assert 1 not in requeued or requeued[1]["by"] == "slurm", requeued
    # TERM reaches the ranks and mpirun alike: the ranks may save first (stop) or be aborted.
    # The driver requeues; seen here once, Slurm had requeued the job just before it (scontrol
    # then refuses with "pending execution"): recorded as Slurm's, never as a failure.
    assert requeued[2]["by"] in ("driver", "slurm") and requeued[2]["cause"] in ("stop", "interrupted")
    assert "REQUEUED" in subprocess.run(["sacct", "-D", "-X", "-n", "-P", "-j", job.job_id, "-o", "State"],
                                        capture_output=True, text=True, timeout=30).stdout
    assert events(paths, "finished")[-1]["status"] == "completed"
    # (Under fsdp and DeepSpeed each rank writes its shards in the training thread, a collective,
    # and the rest in the background.)
    assert {e["mode"] for e in events(paths, "checkpoint_saved")} == {"async"}
    # The USR2 stop saved where the ranks agreed; the others resumed from the last checkpoint.
    assert stops[0]["resumed_from"] == events(paths, "stop_saved")[0]["step"]

    # Same steps, and every rank's parameters bit-identical to the uninterrupted run.
    assert_same_training(paths, straight.paths, ZERO_STEPS if backend == "zero3" else SMOKE_EPOCH_STEPS)


def test_frozen_rank_is_named_then_requeued_from_its_checkpoint(jobs, slurm_cluster):
    job = jobs["frozen-once"]
    seen, paths = job.observed(), job.paths
    # A second writer was refused while the job ran; the queue kept exactly one job.
    refused = seen["resume"]
    assert refused.returncode != 0 and job.job_id in refused.stderr and "RUNNING" in refused.stderr
    assert seen["queued"] == [job.job_id]
    # While frozen, before the driver acted, status and diagnose named the rank and its host.
    host = seen["beat"]["host"]
    assert seen["before_the_watchdog"], seen["health"]
    assert "rank 1" in seen["diagnosis"] and host in seen["diagnosis"], seen["diagnosis"]
    requeued = seen["requeued"]
    print(f"[turnaround] freeze to requeue: {requeued['time'] - seen['frozen_at']:.1f} s, the driver "
          f"held for the first {seen['continued_at'] - seen['frozen_at']:.1f} s (launch.stall_seconds=40)")

    assert _ended(slurm_cluster, job) == "COMPLETED", describe_failure(paths)
    stalled = events(paths, "ranks_stalled")[0]
    assert [r["rank"] for r in stalled["ranks"]] == [1]
    assert stalled["ranks"][0]["host"] == host and stalled["ranks"][0]["state"].startswith("T")
    assert requeued["cause"] == "stall" and requeued["by"] == "driver"
    assert events(paths, "resumed")[0]["from_checkpoint"] >= 20   # every 10 steps; frozen after 24
    assert events(paths, "finished")[-1]["status"] == "completed"
    assert {e["step"] for e in events(paths, "rank_finished")} == {SMOKE_EPOCH_STEPS}
    diagnosis = cli("diagnose", str(paths.root), "--run", "0").stdout
    assert "rank 1" in diagnosis and "T (stopped)" in diagnosis, diagnosis


@pytest.mark.heavy
def test_rank_frozen_on_every_run_ends_failed_after_its_retry(jobs, slurm_cluster):
    job = jobs["frozen-always"]
    assert _ended(slurm_cluster, job) == "FAILED", describe_failure(job.paths)
    assert len(events(job.paths, "ranks_stalled")) == 2
    assert [e["cause"] for e in events(job.paths, "requeued")] == ["stall"]
    finished = events(job.paths, "finished")[-1]
    assert finished["status"] == "failed" and "retries_on_failure=1" in finished["reason"]


def test_refused_scontrol_requeue_fails_the_job_with_its_reason(jobs, slurm_cluster):
    job = jobs["no-requeue"]
    job.observed()
    assert _ended(slurm_cluster, job, 300) == "FAILED", describe_failure(job.paths)
    assert events(job.paths, "stop_saved") and not events(job.paths, "requeued")
    finished = events(job.paths, "finished")[-1]
    assert finished["status"] == "failed" and "stand-in" in finished["reason"], finished


def test_a_cancelled_job_is_not_recorded_as_requeued(jobs, slurm_cluster):
    job = jobs["cancelled"]
    job.observed()
    assert _ended(slurm_cluster, job, 120) == "CANCELLED"
    # Out of the queue: the driver has ended (Slurm's KillWait included), so what it wrote is all.
    wait_for(lambda: _left_the_queue(job.job_id), 300, f"job {job.job_id} to leave the queue")
    assert not events(job.paths, "requeued"), events(job.paths, "requeued")
    # The driver may be killed before it writes; what it does write is the truth.
    assert [e["status"] for e in events(job.paths, "finished")] in ([], ["cancelled"])


def test_a_tracked_run_requeued_then_killed_and_resumed_logs_each_step_once(jobs, slurm_cluster):
    require("wandb")
    require("mlflow")
    import hpc_train
    from hpc_train.runtime.tracker_state import wandb_run_id
    from tests.trackers import mlflow_run, mlflow_steps, wandb_records, wandb_steps

    job = jobs["tracked"]
    seen, paths = job.observed(), job.paths
    assert _ended(slurm_cluster, job) == "FAILED", describe_failure(paths)     # the batch shell killed
    # Slurm may say so while the job is still COMPLETING in the queue: resume waits for it.
    wait_for(lambda: _left_the_queue(job.job_id), 300, f"job {job.job_id} to leave the queue")
    seen["killed_after"] = logged_step(paths)       # the kill lands some steps after step 46 was seen
    assert seen["killed_after"] > 40 and not events(paths, "finished")
    resumed = hpc_train.open_run(paths.root).resume()
    slurm_cluster.job_ids.append(resumed.job_id)
    assert resumed.wait(timeout=900).state == "COMPLETED", describe_failure(paths)
    first, second = [e["from_checkpoint"] for e in events(paths, "resumed")]
    assert first == seen["resumed_from"] and 40 <= second < seen["killed_after"], (first, second, seen)
    print(f"[trackers] killed after step {seen['killed_after']}, resumed from {second}: "
          f"{seen['killed_after'] - second}+ steps trained twice, logged once")

    # metrics.jsonl has the redone steps twice; each tracker, once.
    steps = list(range(1, TOTAL_STEPS + 1))
    evaluated = sorted({m["step"] for m in resumed.metrics() if m.get("split") == "val"})
    assert len(evaluated) == 2 and evaluated[-1] == TOTAL_STEPS, evaluated        # once an epoch
    assert mlflow_steps(paths, "train/loss") == steps
    assert mlflow_steps(paths, "val/accuracy") == evaluated
    run = mlflow_run(paths)
    assert run.info.status == "FINISHED" and run.data.params["log.every_steps"] == "1"
    assert run.data.tags["final_checkpoint"].endswith(f"step-{TOTAL_STEPS:08d}")
    records = wandb_records(paths)
    assert len(list(paths.wandb.glob("offline-run-*"))) == 3           # one per segment
    assert {r["run"]["run_id"] for r in records if r["type"] == "run"} == {wandb_run_id(paths.root)}
    assert wandb_steps(records, "train/loss") == steps
    assert wandb_steps(records, "val/accuracy") == evaluated

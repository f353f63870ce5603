"""status / logs / diagnose on real runs: a Slurm job watched while it runs, is requeued and
completes; real failures (CPU OOM with Gloo's "connection closed", a stalled Horovod rank, a
corrupt HDF5 shard, a resume under a changed spec, an mpirun launch error, a Slurm time limit,
ranks that die without a traceback: os._exit, SIGKILL, a segfault)
produce the logs that the signatures must recognise.

One module fixture runs everything once, concurrently where it can: the two Slurm jobs queue
while the local runs train one after another in a thread. A run on a truncated shard and a run
stopped by USR2 need no Slurm and run on their own.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from hpc_train.inspection.diagnose import diagnose
from hpc_train.launch.mpi import local_run_flags, parse_mpirun_version
from hpc_train.rundir import RunPaths, append_jsonl
from hpc_train.runtime.stop import STOP_EXIT
from tests.conftest import REPO, heavy_requested
from tests.runs import NO_WORKERS, cli, describe_failure, drive, events, local_run, logged_step, schema_problems, submit

pytestmark = [pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]

SMALL = ["data.kind=synthetic", "data.train_samples=512", "data.val_samples=0", "data.image_size=16",
         "data.workers=1", "log.every_steps=1", "optim.max_steps=8",
         "launch.restarts_in_job=0"]                     # each failing run fails once, as it was
# fault kind -> backend: a hard exit, a SIGKILL (what the OOM killer sends), a segfault
SILENT = {"exit": "horovod", "kill": "ddp", "segv": "horovod"}
ENDED = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY"}


def status_json(run_dir: Path, *extra: str) -> dict:
    out = cli("status", str(run_dir), "--json", *extra, timeout=60)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["runs"][0]


def _env(**extra: str) -> str:
    return "launch.env={" + ", ".join(f"{k}: '{v}'" for k, v in {"OMP_NUM_THREADS": "1", **extra}.items()) + "}"


def _local_runs(root: Path, results: dict, with_heavy: bool) -> None:
    """The failing runs, one after another (two cores): each leaves real logs behind. The
    corrupt-superblock run only with the heavy tests (its parameter below is heavy)."""
    try:
        oom = local_run(root, *SMALL, "parallel.backend=ddp", _env(HPC_TRAIN_FAULT="oom:1:3"), name="oom")
        results["oom"] = (oom, drive(oom))
        stall = local_run(root, *SMALL, _env(HPC_TRAIN_FAULT="sleep:1:3:25",
                                             HOROVOD_STALL_CHECK_TIME_SECONDS="2"), name="stall")
        seen = []
        watcher = threading.Thread(target=_watch_stall, args=(stall, seen), daemon=True)
        watcher.start()
        results["stall"] = (stall, drive(stall), seen)
        watcher.join(timeout=30)
        for kind, backend in SILENT.items():      # ranks that die without a traceback
            silent = local_run(root, *SMALL, f"parallel.backend={backend}",
                               _env(HPC_TRAIN_FAULT=f"{kind}:1:3"), name=kind)
            results[kind] = (silent, drive(silent))
        if not with_heavy:
            return
        shards = root / "corrupt-shards"
        shutil.copytree(REPO / "data/demo-shards", shards)
        for shard in (shards / "train").glob("shard-*.h5"):
            with open(shard, "r+b") as handle:         # overwrite the HDF5 superblock signature
                handle.write(b"\0" * 64)
        corrupt = local_run(root, f"data.path={shards}", "optim.max_steps=4", "data.workers=0",
                            name="corrupt")
        results["corrupt"] = (corrupt, drive(corrupt))
    except BaseException as exc:  # noqa: BLE001 - reported by the tests that need the runs
        results["error"] = exc


def _watch_stall(paths: RunPaths, seen: list) -> None:
    """`status` while rank 1 sleeps inside a step, from the start of training until it names
    rank 1 (or the run ends); keeps every answer. (Before: a start-up of 100 s on a loaded
    machine, where a rank's beat can go stale while it imports, and status names that rank.)"""
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and not events(paths, "finished"):
        if events(paths, "training_started"):
            status = status_json(paths.root)
            seen.append(status)
            if 1 in status["health"]["stalled_ranks"]:
                return
        time.sleep(1)


def _mpi_launch_error(root: Path) -> RunPaths:
    """A real mpirun asked for more ranks than the host offers (no --oversubscribe)."""
    paths = RunPaths(root / "mpi-launch")
    paths.make_dirs()
    info = parse_mpirun_version(subprocess.run(["mpirun", "--version"], capture_output=True, text=True,
                                                check=False).stdout)
    flags = local_run_flags(info.flavour, as_root=os.geteuid() == 0, oversubscribe=False)
    out = subprocess.run(["mpirun", "-np", "64", "--host", "localhost:1", *flags, "true"],
                         capture_output=True, text=True, timeout=60, check=False)
    (paths.submitit / "7_0_log.err").write_text(out.stdout + out.stderr)
    append_jsonl(paths.events, {"time": time.time(), "event": "finished", "status": "failed",
                                "returncode": out.returncode})
    return paths


@pytest.fixture(scope="module")
def runs(slurm_cluster, tmp_path_factory, request):
    root = tmp_path_factory.mktemp("inspect")
    # One epoch (46 steps): requeued after its first checkpoint, then trained to the end.
    job_id, life = submit("jobs/smoke.yaml", root, "run.name=life", "optim.epochs=1", NO_WORKERS,
                          "log.every_steps=4", "checkpoint.every_steps=12")
    slurm_cluster.job_ids.append(job_id)
    timelimit = RunPaths(root / "timelimit")
    timelimit.make_dirs()
    limit_id = slurm_cluster.sbatch("--time=1", "--ntasks=1", "--cpus-per-task=1",
                                    f"--output={timelimit.root}/slurm-%j.out", "--wrap", "sleep 300")
    append_jsonl(timelimit.events, {"time": time.time(), "event": "submitted", "job_id": limit_id,
                                    "executor": "slurm"})
    results: dict = {"life": life, "timelimit": timelimit, "mpi": _mpi_launch_error(root)}
    worker = threading.Thread(target=_local_runs, args=(root, results, heavy_requested(request.config)),
                              daemon=True)
    worker.start()

    # `status` (a CLI process, 0.3 core-seconds) each time the run logs a new step, and every
    # 10 s while it logs none (queued, starting, requeued): before, every 2 s, whatever happened.
    snapshots, requeued, asked_at, step_seen = [], False, 0.0, None
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline:
        step = logged_step(life)
        if step == step_seen and time.monotonic() - asked_at < 10:
            time.sleep(0.5)
            continue
        step_seen, asked_at = step, time.monotonic()
        state = status_json(life.root)
        snapshots.append(state)
        if not requeued and events(life, "checkpoint_saved"):
            subprocess.run(["scontrol", "requeue", job_id], check=True, timeout=30)
            requeued = True
        if state["state"] in ENDED:
            break
    results["life_snapshots"] = snapshots
    slurm_cluster.wait_state(limit_id, ENDED, timeout=300)
    worker.join(timeout=3600)     # catches a hang only: each run has its own bound
    # A resume under a changed spec: the checkpoints were made with 1 epoch.
    changed = RunPaths(root / "changed")
    shutil.copytree(life.root, changed.root)
    assert "epochs: 1\n" in changed.spec.read_text()
    changed.spec.write_text(changed.spec.read_text().replace("epochs: 1\n", "epochs: 3\n"))
    results["spec"] = (changed, drive(changed))
    return results


@pytest.mark.slurm
def test_status_follows_a_slurm_run_through_a_requeue_to_completion(runs):
    life, snapshots = runs["life"], runs["life_snapshots"]
    running = [s for s in snapshots if s["state"] == "RUNNING" and s["step"]]
    assert len({s["step"] for s in running}) >= 2, snapshots          # a growing step...
    assert running[-1]["step"] > running[0]["step"]
    assert all(s["throughput"]["recent"] > 0 and s["state_source"] == "squeue" for s in running)
    assert any(s["eta_seconds"] is not None for s in running)          # ...with a rate and an ETA
    final = snapshots[-1]
    assert final["state"] == "COMPLETED", describe_failure(life)
    assert final["requeues"] >= 1 and final["requeue_reasons"], final
    last = [json.loads(line) for line in life.metrics.read_text().splitlines()
            if "split" not in json.loads(line)][-1]
    assert (final["step"], final["loss"]) == (last["step"], last["loss"]) == (final["total_steps"], last["loss"])
    assert final["accuracy"] is not None and final["checkpoint_step"] == final["total_steps"]
    # Accounting off (no sacct, no squeue): the events alone still say COMPLETED.
    assert status_json(life.root, "--no-slurm")["state"] == "COMPLETED"


@pytest.mark.slurm
def test_logs_split_the_requeued_runs_and_merge_ranks(runs):
    life = runs["life"]
    first = cli("logs", str(life.root), "--all-ranks", "--run", "0").stdout.splitlines()
    second = cli("logs", str(life.root), "--all-ranks", "--run", "1").stdout.splitlines()
    everything = cli("logs", str(life.root), "--all-ranks").stdout.splitlines()
    assert first and second and len(first) + len(second) == len(everything)
    for part in (first, second):                 # each run starts with both ranks' start lines
        assert {line.split()[0] for line in part[:2]} == {"[rank"}
        assert any("[rank 1]" in line and "rank 1/2" in line for line in part)
    assert any("resumed from step" in line for line in second)
    assert not any("resumed from step" in line for line in first)
    only = cli("logs", str(life.root), "--rank", "1", "--grep", "done").stdout.splitlines()
    assert only and all("rank 1 done" in line for line in only)


@pytest.mark.slurm
def test_the_first_failed_rank_is_found_from_the_logs(runs, tmp_path):
    assert "error" not in runs, runs.get("error")
    oom, returncode = runs["oom"]
    assert returncode != 0
    # Remove the events' word on it: the logs alone must name rank 1.
    blind = RunPaths(tmp_path / "blind")
    shutil.copytree(oom.root, blind.root)
    blind.events.write_text("".join(line + "\n" for line in oom.events.read_text().splitlines()
                                    if '"rank_failed"' not in line))
    result = diagnose(blind)
    assert result.first_failure.rank == 1 and result.event_rank is None
    assert "can't allocate memory" in result.first_failure.exception
    ids = [s["id"] for s in result.signatures]
    assert "cpu_oom" in ids and "connection_closed" in ids        # rank 0 lost its Gloo peer
    out = cli("diagnose", str(oom.root))
    assert out.returncode == 0
    assert "first failed rank: 1" in out.stdout and "DefaultCPUAllocator" in out.stdout
    assert "rank_failed event: agrees" in out.stdout


@pytest.mark.slurm
def test_a_stalled_rank_is_reported_with_its_number(runs):
    assert "error" not in runs, runs.get("error")
    stall, returncode, seen = runs["stall"]
    assert returncode == 0, describe_failure(stall)
    live = [s for s in seen if 1 in s["health"]["stalled_ranks"]]
    # Rank 1 is named. On a loaded machine rank 0's beat may have gone stale too (its heartbeat
    # thread starved of CPU), and status then names it as well: a claim about the machine, not
    # about rank 1 (diagnose, below, names the one Horovod waited for).
    assert live, seen
    message = live[0]["health"]["message"]
    assert message.startswith("stalled rank(s): ") and re.search(r"(^|; |: )1 (on |\(Horovod)", message), message
    result = diagnose(stall)
    assert result.stalled_ranks == [1]
    assert "stalled_collective" in [s["id"] for s in result.signatures]


@pytest.mark.slurm
@pytest.mark.parametrize("kind, how", [("exit", "exit code 1"), ("kill", "signal 9 (Killed)"),
                                       ("segv", "signal 11 (Segmentation fault)")])
def test_a_rank_that_dies_without_a_traceback_is_named_by_mpiruns_report(runs, kind, how):
    assert "error" not in runs, runs.get("error")
    paths, returncode = runs[kind]
    assert returncode != 0
    result = diagnose(paths)
    assert (result.found_by, result.first_failure.rank) == ("mpirun", 1), describe_failure(paths)
    assert how in result.first_failure.exception and result.launcher["rank"] == 1
    assert 1 not in result.failed_ranks                   # rank 1: no traceback, no event
    if result.event_rank is not None:
        # A peer saw the connection reset and recorded it before mpirun ended it: a consequence.
        # (Seen since the workers fork from a server: forked from the rank, they inherited its
        # sockets, and the peer, we think, hung on them until mpirun ended it.)
        assert result.event_rank != 1
        assert "connection_closed" in [s["id"] for s in result.signatures]
    if kind == "segv":           # faulthandler's report, from the rank's own log
        assert "Fatal Python error: Segmentation fault" in result.first_failure.traceback
        assert "in at_step" in result.first_failure.traceback
        assert "native_crash" in [s["id"] for s in result.signatures]
    out = cli("diagnose", str(paths.root))
    host = socket.gethostname()        # the local driver ran both ranks here
    assert out.returncode == 0 and f"first failed rank: 1 on {host} (it left no traceback" in out.stdout
    failure = status_json(paths.root, "--no-slurm")["diagnosis"]["first_failure"]
    assert (failure["rank"], failure["host"]) == (1, host)


@pytest.mark.slurm
# A shard whose HDF5 superblock is overwritten: heavy. test_a_truncated_shard_is_named_by_diagnose
# (CI) covers the corrupt_shard signature on a shard that does not open, raised in a data worker.
@pytest.mark.parametrize("name, signature", [
    pytest.param("corrupt", "corrupt_shard", marks=pytest.mark.heavy), ("spec", "spec_mismatch"),
    ("mpi", "mpi_launch"), ("timelimit", "slurm_time_limit")])
def test_real_failures_match_their_signatures(runs, name, signature):
    assert "error" not in runs, runs.get("error")
    found = runs[name]
    paths = found[0] if isinstance(found, tuple) else found
    if isinstance(found, tuple):
        assert found[1] != 0, describe_failure(paths)
    out = cli("diagnose", str(paths.root), "--json")
    assert out.returncode == 0, out.stderr
    ids = [s["id"] for s in json.loads(out.stdout)["signatures"]]
    assert signature in ids, (ids, describe_failure(paths))


def test_a_truncated_shard_is_named_by_diagnose(tmp_path):
    """The smoke job on demo shards with one train shard cut to half its size (an interrupted
    copy): the rank fails in a DataLoader worker (torch re-raises its DataError), and diagnose
    names the shard file in the first failure and in the corrupt_shard signature."""
    shards = tmp_path / "shards"
    shutil.copytree(REPO / "data/demo-shards", shards)
    victim = shards / "train" / "shard-00001.h5"
    with open(victim, "r+b") as handle:
        handle.truncate(victim.stat().st_size // 2)
    paths = local_run(tmp_path, f"data.path={shards}", "data.workers=2", "optim.max_steps=6",
                      _env(), name="truncated")
    assert drive(paths) != 0, describe_failure(paths)
    assert events(paths, "finished")[-1]["status"] == "failed"
    result = diagnose(paths)
    assert result.found_by == "traceback", describe_failure(paths)
    assert str(victim) in result.first_failure.exception
    assert "(raised in DataLoader worker process" in result.first_failure.exception
    assert result.event_rank == result.first_failure.rank and result.stop is None and result.stall is None
    [shard] = [s for s in result.signatures if s["id"] == "corrupt_shard"]
    assert shard["file"] == str(victim) and str(victim) in shard["line"]
    text = cli("diagnose", str(paths.root), "--no-slurm")
    assert text.returncode == 0, text.stderr
    assert f"exception: hpc_train.errors.DataError: {victim}: cannot open as a shard" in text.stdout
    assert f"  file: {victim}" in text.stdout
    out = cli("diagnose", str(paths.root), "--json", "--no-slurm")
    assert [s["file"] for s in json.loads(out.stdout)["signatures"] if s["id"] == "corrupt_shard"] == [str(victim)]
    status = status_json(paths.root, "--no-slurm")
    assert status["state"] == "FAILED" and str(victim) in status["diagnosis"]["first_failure"]["exception"]
    assert schema_problems({"runs": [status]}, json.loads((REPO / "docs/status-schema.json").read_text())) == []


def test_a_deliberate_stop_is_not_a_failed_rank(tmp_path):
    """USR2 to the driver: the ranks agree, save and exit with STOP_EXIT (75), which mpirun reports
    as "Exit code: 75". diagnose says the run stopped on purpose and names no failed rank."""
    paths = local_run(tmp_path, *SMALL, "optim.max_steps=40", _env(), name="stopped")
    assert drive(paths, signal_at_step=3, signum=signal.SIGUSR2) == STOP_EXIT, describe_failure(paths)
    result = diagnose(paths)
    assert result.launcher is not None and result.launcher["how"] == f"exit code {STOP_EXIT}", describe_failure(paths)
    assert result.first_failure is None and result.found_by is None and result.failed_ranks == []
    saved = events(paths, "stop_saved")[-1]
    assert (result.stop["reason"], result.stop["step"]) == ("SIGUSR2", saved["step"])
    assert result.stop["ending"] == "finished stopped"           # local: not requeued
    out = cli("diagnose", str(paths.root), "--no-slurm")
    assert "stopped on purpose: SIGUSR2" in out.stdout and "first failed rank" not in out.stdout
    status = status_json(paths.root, "--no-slurm")
    assert status["state"] == "STOPPED" and status["diagnosis"]["first_failure"] is None

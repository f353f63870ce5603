"""`report`'s pure parts on recorded data (tests/samples/report: a real smoke run requeued once
before its first checkpoint), on hand-made sacct rows and event lists, and the command on a run
directory with a stand-in sacct that fails or answers."""

from __future__ import annotations

import json
import os
import shutil
import time
from datetime import datetime
from pathlib import Path

import pytest

from hpc_train.inspection import efficiency
from hpc_train.inspection.report import build_report
from hpc_train.inspection.report_text import print_report
from hpc_train.rundir import RunPaths, append_jsonl, read_jsonl
from hpc_train.scheduler import accounting
from tests.conftest import REPO
from tests.runs import cli, path_without

SAMPLES = REPO / "tests" / "samples" / "report"
SACCT = (SAMPLES / "sacct_requeued.txt").read_text()
EVENTS = read_jsonl(SAMPLES / "events_requeued.jsonl")
METRICS = read_jsonl(SAMPLES / "metrics_requeued.jsonl")
PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(autouse=True)
def utc(monkeypatch):
    """sacct prints local time; the recorded text was made on a UTC machine."""
    monkeypatch.setenv("TZ", "UTC")
    time.tzset()
    yield
    monkeypatch.undo()
    time.tzset()


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_recorded_sacct_gives_one_segment_per_start_with_its_steps():
    first, second = accounting.parse_segments(SACCT)
    assert (first.state, first.start, first.end, first.elapsed) == (
        "REQUEUED", at("2026-11-30T11:10:39"), at("2026-11-30T11:11:00"), 21)
    assert (second.state, second.elapsed, second.cpus, second.gpus, second.nodes) == ("COMPLETED", 85, 2, 0, 1)
    assert first.req_mem == second.req_mem == 2 * 1024 ** 3
    assert (first.total_cpu, second.total_cpu) == (0.281, 53.096)
    assert [s.name for s in second.steps] == ["batch"]
    assert first.max_rss is None and second.max_rss == 3301704 * 1024   # a 21 s step was not sampled


def test_sacct_rows_of_other_shapes():
    text = "\n".join([
        "9|CANCELLED by 0|None|2026-01-01T00:00:10|0|0||4G||00:00:00|0|None assigned",
        "10|RUNNING|2026-01-01T00:00:00|Unknown|3600|8|billing=8,cpu=8,gres/gpu:a100=4,gres/gpu=4,node=2|500Mc||1-02:03:04.5|2|g[1-2]",
        "10.batch|RUNNING|2026-01-01T00:00:00|Unknown|3600|4|cpu=4|||00:10.000|1|g1",
        "10.0|RUNNING|2026-01-01T00:00:05|Unknown|3595|8|cpu=8|||01:00:00|2|g[1-2]",
        "11|COMPLETED|2026-01-01T02:00:00|2026-01-01T03:00:00|3600|4|cpu=4,gres/gpu:v100=2,gres/gpu:a100=1|4000||00:01:00|1|h",
        "12|COMPLETED|2026-01-01T04:00:00|2026-01-01T05:00:00|3600|2|cpu=2,node=2|4G||00:01:00|2|n[1-2]",
        "13|COMPLETED|2026-01-01T06:00:00|2026-01-01T07:00:00|3600|2|cpu=2,node=2|3Gn||00:01:00|2|n[1-2]",
        "11.0|COMPLETED|2026-01-01T02:00:00|2026-01-01T03:00:00|3600|4|cpu=4||1.5G|00:01:00|1|h",
    ])
    running, done, total, per_node = accounting.parse_segments(text)   # job 9 never started: no segment
    assert running.end is None and running.gpus == 4 and running.node_list == "g[1-2]"
    assert running.req_mem == 500 * 1024 ** 2 * 8 // 2   # 500 MiB per CPU, 8 CPUs on 2 nodes (old form)
    assert running.total_cpu == 86400 + 2 * 3600 + 3 * 60 + 4.5
    assert [s.name for s in running.steps] == ["batch", "0"] and running.steps[1].total_cpu == 3600
    assert done.gpus == 3 and done.req_mem == 4000 * 1024 ** 2 and done.max_rss == int(1.5 * 1024 ** 3)
    assert total.req_mem == 2 * 1024 ** 3                # 22.05 prints the job's total: 2 nodes of 2G
    assert per_node.req_mem == 3 * 1024 ** 3             # older releases: per node
    assert accounting.parse_segments("") == [] and accounting.parse_memory("") is None


def test_usage_from_recorded_sacct():
    usage = efficiency.usage_from_sacct(accounting.parse_segments(SACCT))
    assert usage.core_hours == pytest.approx(2 * (21 + 85) / 3600)
    assert usage.gpu_hours == 0 and usage.source == "sacct"
    assert usage.cpu_efficiency == pytest.approx((0.281 + 53.096) / (2 * 106))
    assert (usage.peak_rss, usage.req_mem) == (3301704 * 1024, 2 * 1024 ** 3)


def test_restart_of_the_recorded_run_lost_its_seven_steps():
    windows = efficiency.windows_from_sacct(accounting.parse_segments(SACCT))
    [restart] = efficiency.restarts(windows, EVENTS, METRICS)
    second_training = [e for e in EVENTS if e["event"] == "training_started"][1]["time"]
    assert restart.wait == at("2026-11-30T11:11:25") - at("2026-11-30T11:11:00") == 25
    assert restart.training == second_training and restart.startup == second_training - at("2026-11-30T11:11:25")
    assert (restart.last_step, restart.resumed_step, restart.redone_steps) == (7, 0, 7)
    step_times = sorted(m["step_time"] for m in METRICS if m.get("split") is None)
    assert restart.redone_seconds == pytest.approx(7 * step_times[len(step_times) // 2])
    assert restart.kind == efficiency.REQUEUE
    assert restart.lost == pytest.approx(restart.wait + restart.startup + restart.redone_seconds)


def test_windows_from_events_alone():
    first, second = efficiency.windows_from_events(EVENTS, cpus=2, gpus=0)
    requeued = next(e for e in EVENTS if e["event"] == "requeued")
    finished = next(e for e in EVENTS if e["event"] == "finished")
    assert (first.state, first.end, second.state, second.end) == ("REQUEUED", requeued["time"],
                                                                  "COMPLETED", finished["time"])
    usage = efficiency.usage_from_windows([first, second], now=0)
    assert usage.core_hours == pytest.approx(2 * ((first.end - first.start) + (second.end - second.start)) / 3600)
    assert usage.cpu_efficiency is None and usage.source == "spec and events"


def test_checkpoints_and_work_of_the_recorded_run():
    assert efficiency.checkpoint_time(EVENTS) == (3, pytest.approx(0.23 + 0.219 + 0.241))
    assert efficiency.samples_trained(EVENTS, METRICS)[:2] == (92, 64)


def test_samples_trained_follow_the_trainers_count_across_a_resize():
    # 2 ranks x 32 for 15 steps, then 4 ranks x 32: 15 x 64 + 38 x 128, not 53 x 128.
    events = [_event(1.0, "training_started", global_batch=64), _event(9.0, "training_started", global_batch=128)]
    metrics = [{"time": 5.0, "step": 15, "samples": 960}, {"time": 20.0, "step": 53, "samples": 960 + 38 * 128},
               {"time": 21.0, "split": "val", "step": 53, "samples": 1000}]
    assert efficiency.samples_trained(events, metrics) == (53, 128, 960 + 38 * 128)


def _event(t, name, **fields):
    return {"time": t, "event": name, **fields}


def test_resume_from_a_checkpoint_and_a_start_that_never_trained():
    events = [
        _event(100, "started", job_id="1"), _event(110, "training_started", global_batch=8),
        _event(150, "checkpoint_saved", step=40, seconds=2.0), _event(160, "requeued", cause="interrupted"),
        _event(200, "started", job_id="1"), _event(230, "requeued", cause="failure"),      # never trained
        _event(300, "started", job_id="1"), _event(320, "resumed", step=40),
        _event(400, "finished", status="failed"),
        _event(5000, "started", job_id="2"), _event(5010, "resumed", step=60),            # a resume
        _event(5100, "finished", status="completed"),
    ]
    metrics = [{"time": 155, "step": 48, "step_time": 0.5}, {"time": 390, "step": 64, "step_time": 0.5}]
    windows = efficiency.windows_from_events(events, cpus=4, gpus=1)
    assert [w.state for w in windows] == ["REQUEUED", "REQUEUED", "FAILED", "COMPLETED"]
    never, again, resumed = efficiency.restarts(windows, events, metrics)
    assert (never.resumed_step, never.redone_steps, never.startup) == (None, None, None)
    assert (again.last_step, again.resumed_step, again.redone_steps, again.redone_seconds) == (48, 40, 8, 4.0)
    assert again.wait == 70 and again.startup == 20 and again.lost == 70 + 20 + 4.0
    assert resumed.kind == efficiency.RESUME and resumed.wait == 4600 and resumed.lost == 10 + 2.0    # 64 -> 60
    assert efficiency.usage_from_windows(windows, now=0).gpu_hours == pytest.approx((60 + 30 + 100 + 100) / 3600)


def test_restarts_inside_a_job_are_one_segment_and_lose_no_queue_wait():
    events = [
        _event(100, "started", job_id="1", launch=0), _event(110, "training_started", global_batch=8),
        _event(150, "checkpoint_saved", step=40, seconds=2.0),
        _event(170, "restarted", cause="failure", attempt=1, budget=2),
        _event(171, "started", job_id="1", launch=1), _event(178, "resumed", step=40),
        _event(200, "restarted", cause="stall", attempt=2, budget=2),
        _event(201, "started", job_id="1", launch=2), _event(206, "resumed", step=40),
        _event(300, "requeued", cause="failure"),
        _event(330, "started", job_id="1", launch=0), _event(340, "resumed", step=40),
        _event(400, "finished", status="completed"),
    ]
    metrics = [{"time": 165, "step": 48, "step_time": 0.5}, {"time": 390, "step": 64, "step_time": 0.5}]
    windows = efficiency.windows_from_events(events, cpus=4, gpus=0)
    assert [(w.start, w.end, w.state) for w in windows] == [(100, 300, "REQUEUED"), (330, 400, "COMPLETED")]
    first, second, requeue = efficiency.restarts(windows, events, metrics)
    assert (first.kind, first.cause, first.after, first.wait, first.startup) == ("in job", "failure", 0, 1, 7)
    assert (first.last_step, first.resumed_step, first.redone_seconds, first.lost) == (48, 40, 4.0, 12.0)
    assert (second.kind, second.cause, second.startup) == ("in job", "stall", 5)
    assert (requeue.kind, requeue.wait, requeue.startup) == ("requeue", 30, 10)


def test_a_job_resized_by_slurm_after_a_node_died_is_not_a_requeue():
    # sacct after a node crash under --no-kill (recorded on the 3-node cluster): the job before
    # Slurm took the node out (RESIZING, 3 CPUs) and the same job after it; the ranks had
    # restarted in the job on the spare before that.
    events = [_event(100, "started", job_id="60", launch=0), _event(103, "training_started", global_batch=64),
              _event(110, "checkpoint_saved", step=20, seconds=0.1),
              _event(112, "node_lost", nodes=["hpcn2"]), _event(112, "restarted", cause="node_failure"),
              _event(112.1, "started", job_id="60", launch=1), _event(114, "resumed", step=20),
              _event(177, "finished", status="completed")]
    windows = [efficiency.Window("60", 100, 131, "RESIZING", 3, 0),
               efficiency.Window("60", 131, 177, "COMPLETED", 2, 0)]
    metrics = [{"time": 111, "step": 20, "step_time": 0.1}]
    [restart] = efficiency.restarts(windows, events, metrics)
    assert (restart.kind, restart.cause) == ("in job", "node_failure")


def test_report_counts_the_restarts_in_the_job_by_cause(tmp_path, capsys):
    paths = RunPaths.new(tmp_path, "restarted")
    for event in [_event(100, "started", launch=0), _event(110, "training_started", global_batch=8),
                  _event(170, "restarted", cause="failure"), _event(171, "started", launch=1),
                  _event(178, "resumed", step=40), _event(400, "finished", status="completed")]:
        append_jsonl(paths.events, event)
    report = build_report(paths, slurm=False, now=500, plot=False)
    assert report.requeues == 0 and report.to_json()["restarts_in_job"] == {"failure": 1}
    print_report(report)
    out = capsys.readouterr().out
    assert "restarts in job:        1  (failure 1)" in out and "in 0\tin job (failure)\t1s\t7s" in out


def test_gpu_summary_of_samples():
    samples = [{"host": "n1", "gpu": 0, "util": 80, "mem_used": 10, "mem_total": 100},
               {"host": "n1", "gpu": 1, "util": 60, "mem_used": 30, "mem_total": 100},
               {"host": "n2", "gpu": 0, "util": 100, "mem_used": 20, "mem_total": 100}]
    assert efficiency.gpu_summary(samples) == {"samples": 3, "gpus": 3, "mean_util": 80,
                                               "peak_mem": 30, "mem_total": 100}
    assert efficiency.gpu_summary([]) is None


def recorded_run(tmp_path: Path) -> RunPaths:
    paths = RunPaths.new(tmp_path / "runs", "smoke")
    shutil.copy(SAMPLES / "events_requeued.jsonl", paths.events)
    shutil.copy(SAMPLES / "metrics_requeued.jsonl", paths.metrics)
    shutil.copy(REPO / "jobs" / "smoke.yaml", paths.spec)
    return paths


def with_sacct(monkeypatch, tmp_path: Path, script: str) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "sacct").write_text(script)
    (bin_dir / "sacct").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")


def test_report_from_recorded_sacct_writes_a_timeline(tmp_path, monkeypatch, capsys):
    paths = recorded_run(tmp_path)
    with_sacct(monkeypatch, tmp_path, f"#!/bin/sh\ncat {SAMPLES / 'sacct_requeued.txt'}\n")
    report = build_report(paths, now=0)
    assert len(report.windows) == 2 and report.requeues == 1 and report.usage.source == "sacct"
    assert report.samples == 92 * 64 and report.samples_per_hour == (
        pytest.approx(92 * 64 / report.usage.core_hours), "core-hour")
    assert report.lost_seconds["checkpoint_saves"] == pytest.approx(0.69)
    assert any("GPU utilisation" in line and "no GPUs allocated" in line for line in report.unknown)
    assert not any("peak memory" in line or "CPU efficiency" in line for line in report.unknown)
    assert paths.timeline.read_bytes()[:8] == PNG and report.timeline == str(paths.timeline)
    assert json.loads(json.dumps(report.to_json()))["restarts"][0]["redone_steps"] == 7
    print_report(report)
    out = capsys.readouterr().out
    assert "CPU efficiency:" in out and "25.2%" in out and "7 step(s)" in out


@pytest.mark.parametrize("script, why", [
    ("#!/bin/sh\necho 'sacct: error: Problem talking to the database: Connection refused' >&2; exit 1\n",
     "sacct failed (sacct: error: Problem talking to the database"),
    ("#!/bin/sh\nexit 0\n", "sacct has no record of job 174"),
])
def test_report_without_accounting_says_what_it_could_not_know(script, why, tmp_path, monkeypatch):
    paths = recorded_run(tmp_path)
    with_sacct(monkeypatch, tmp_path, script)
    report = build_report(paths, now=0)
    assert report.unknown[0].startswith(f"accounting: {why}")
    assert report.usage.source == "spec and events" and report.usage.cpu_efficiency is None
    assert len(report.windows) == 2 and report.restarts[0].redone_steps == 7
    assert paths.timeline.read_bytes()[:8] == PNG


@pytest.mark.slow
def test_report_command_without_sacct_on_path(tmp_path):
    paths = recorded_run(tmp_path)
    env = {**os.environ, "PATH": path_without(tmp_path / "bin", ("sacct",))}
    out = cli("report", str(paths.root), env=env)
    assert out.returncode == 0, out.stderr
    assert "not known: accounting: sacct failed" in out.stdout and "core-hours:" in out.stdout
    document = json.loads(cli("report", str(paths.root), "--json", "--no-plot", env=env).stdout)
    assert document["requeues"] == 1 and document["checkpoints"]["saves"] == 3


def test_report_names_the_last_runs_slowest_rank_and_counts_warnings(tmp_path, monkeypatch, capsys):
    from hpc_train import events
    from hpc_train.rundir import append_jsonl

    paths = recorded_run(tmp_path)
    last_start = max(e["time"] for e in EVENTS if e["event"] == "started")
    append_jsonl(paths.events, events.stamped(events.straggler("rank 1 ...", rank=1), environ={},
                                              now=last_start + 5))
    paths.heartbeat.mkdir(parents=True, exist_ok=True)
    for rank, busy in ((0, 0.05), (1, 0.2)):
        paths.rank_heartbeat(rank).write_text(json.dumps(
            {"rank": rank, "host": f"n{rank}", "pid": 1, "step": 90, "phase": "saved",
             "progress": last_start + 9, "time": last_start + 9,
             "times": {"step": 0.25, "data": 0.01, "busy": busy, "steps": 32}}))
    with_sacct(monkeypatch, tmp_path, "#!/bin/sh\nexit 0\n")
    report = build_report(paths, now=0, plot=False)
    assert (report.slowest["rank"], report.slowest["host"], report.straggler_warnings) == (1, "n1", 1)
    assert json.loads(json.dumps(report.to_json()))["slowest"]["ratio"] == 4.0
    print_report(report)
    out = capsys.readouterr().out
    assert "slowest rank:" in out and "rank 1 on n1: 4.0x" in out and "straggler warnings:     1" in out


def test_report_of_a_run_that_never_started(tmp_path, monkeypatch):
    paths = RunPaths.new(tmp_path / "runs", "queued")
    shutil.copy(REPO / "jobs" / "smoke.yaml", paths.spec)
    paths.events.write_text(json.dumps({"time": 1.0, "event": "submitted", "job_id": "5",
                                        "executor": "slurm", "spec_hash": "x"}) + "\n")
    with_sacct(monkeypatch, tmp_path, "#!/bin/sh\nexit 0\n")
    report = build_report(paths, now=10)
    assert report.windows == [] and report.usage.core_hours == 0 and report.samples_per_hour is None
    assert any("never started" in line for line in report.unknown) and not paths.timeline.exists()


@pytest.mark.parametrize("spec, name", [
    ({"model": {"name": "gpt"}}, "sequences"), ({"data": {"kind": "text"}}, "sequences"),
    ({"model": {"name": "hf_lm.model:byte_gpt2"}, "task": {"name": "causal_lm"}}, "sequences"),
    ({"model": {"name": "resnet50"}}, "images"), (None, "images"), ({"task": "odd"}, "images"),
])
def test_a_sample_is_a_sequence_for_a_language_model_and_an_image_otherwise(spec, name):
    from hpc_train.inspection.report import _sample_name

    assert _sample_name(spec) == name

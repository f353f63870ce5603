"""Pure pieces of inspection (log parsing, health, rate/ETA, Slurm parsers) and the commands on a
synthetic run directory (the benchmark's generator): merging, runs, schema, plot, render."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hpc_train.bench.inspect import make_run
from hpc_train.inspect import logs
from hpc_train.inspect.health import Beat, assess
from hpc_train.inspect.logparse import run_index, stamp_time, timed_lines, tracebacks
from hpc_train.inspect.runstate import state_from_events, step_rate, summarize, throughput, total_steps
from hpc_train.inspect.slurm_state import parse_sacct, parse_squeue
from hpc_train.rundir import read_jsonl
from hpc_train.runtime.faults import Fault, parse_fault
from tests.conftest import REPO
from tests.jsonschema_mini import validate
from tests.runs import cli


def test_timestamps_carry_to_continuation_lines_and_tracebacks_are_blocks():
    texts = ["preamble from a C library",
             "2026-11-29 18:17:53,607 rank 1 hpc_train.worker ERROR rank 1 failed:",
             "Traceback (most recent call last):", '  File "x.py", line 3, in f', "    g()",
             "ValueError: bad", "", "During handling of the above exception, another exception occurred:",
             "", "Traceback (most recent call last):", '  File "y.py", line 1', "KeyError: 'k'",
             "2026-11-29 18:17:54,001 rank 1 after"]
    lines = list(timed_lines(1, texts))
    assert lines[0].time == 0.0
    assert lines[2].time == lines[1].time == stamp_time(texts[1])
    assert lines[-1].time - lines[1].time == pytest.approx(0.394)
    found = tracebacks(lines)
    assert [t.exception for t in found] == ["ValueError: bad", "KeyError: 'k'"]
    assert found[0].rank == 1 and found[0].time == lines[1].time and "g()" in found[0].text


def test_run_index_by_start_times():
    starts = [100.0, 200.0]
    assert [run_index(t, starts) for t in (0.0, 100.0, 150.0, 200.5, 1e9)] == [0, 0, 0, 1, 1]
    assert run_index(5.0, []) == 0


def test_health_finds_lagging_and_quiet_ranks():
    now = 1000.0
    ok = assess({0: Beat(40, 990), 1: Beat(40, 990)}, 990, now, True, 600)
    assert ok.ok and ok.stalled_ranks == []
    lag = assess({0: Beat(40, 990), 1: Beat(36, 950), 2: Beat(40, 990)}, 990, now, True, 600)
    assert lag.stalled_ranks == [1] and "1 (step 36)" in lag.message
    quiet = assess({0: Beat(40, 100), 1: Beat(40, 100)}, 100, now, True, 600)
    assert not quiet.ok and quiet.stalled_ranks == [] and "no progress for 15.0 min" in quiet.message
    waiting = assess({0: Beat(4, 995), 1: Beat(4, 995)}, 995, now, True, 600, waiting_ranks=[1])
    assert waiting.stalled_ranks == [1]
    assert assess({0: Beat(1, 0)}, None, now, False, 600).message == "not running"


def test_rate_eta_throughput_and_total_steps():
    train = [{"time": 10.0 + i, "step": 4 * i, "samples_per_s": 100.0 + i} for i in range(20)]
    assert step_rate(train, since=0) == pytest.approx(4.0)
    assert step_rate([{"time": 1, "step": 4, "step_time": 0.5}], since=0) == 2.0
    flow = throughput(train)
    assert (flow.field, flow.unit, flow.recent, flow.mean) == ("samples_per_s", "samples/s", 119.0, 109.5)
    events = [{"time": 1, "event": "training_started", "total_steps": 92, "steps_per_epoch": 46},
              {"time": 2, "event": "spec_change_allowed"}]
    assert total_steps(events, {"optim": {"epochs": 3}}) == 138
    assert total_steps(events[:1], {"optim": {"epochs": 3}}) == 92


def test_state_from_events_and_slurm_parsers():
    assert state_from_events([{"event": "submitted"}]) == "PENDING"
    assert state_from_events([{"event": "submitted"}, {"event": "started"}]) == "RUNNING"
    assert state_from_events([{"event": "started"}, {"event": "requeued"}]) == "PENDING"
    assert state_from_events([{"event": "finished", "status": "completed"}]) == "COMPLETED"
    assert parse_squeue("RUNNING|None\n").state == "RUNNING"
    assert parse_squeue("") is None
    info = parse_sacct("63|CANCELLED by 0|0:15\n")
    assert (info.state, info.reason, info.source) == ("CANCELLED", "0:15", "sacct")
    assert parse_sacct("sacct: error: Problem talking to the database\n") is None


def test_new_fault_kinds_parse():
    assert parse_fault("oom:1:3") == Fault("oom", 1, 3)
    assert parse_fault("exit:0:7") == Fault("exit", 0, 7)
    assert parse_fault("kill:1:2") == Fault("kill", 1, 2) and parse_fault("segv:0:1") == Fault("segv", 0, 1)
    with pytest.raises(ValueError):
        parse_fault("oom:1")


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    return make_run(tmp_path_factory.mktemp("synthetic"), ranks=3, metric_lines=200)


def test_logs_merge_ranks_by_time_and_split_runs(synthetic):
    merged = list(logs.select(synthetic, None, None))
    assert [line.time for line in merged] == sorted(line.time for line in merged)
    assert {line.rank for line in merged} == {0, 1, 2}
    first, last = list(logs.select(synthetic, None, 0)), list(logs.select(synthetic, None, -1))
    assert len(first) + len(last) == len(merged)
    assert all("step" not in line.text or int(line.text.split("step ")[1].split("/")[0]) <= 1000
               for line in first)
    grep = list(logs.select(synthetic, [0], 1, r"step 20\d\d/"))
    assert grep and all(line.rank == 0 and "step 20" in line.text for line in grep)
    out = cli("logs", str(synthetic.root), "--all-ranks", "--run", "1", "--grep", "done")
    assert out.stdout.splitlines() == [f"[rank {r}] " + t for r, t in
                                       sorted((line.rank, line.text) for line in last if "done" in line.text)]
    bad = cli("logs", str(synthetic.root), "--run", "5")
    assert bad.returncode == 7 and "2 run(s)" in bad.stderr


def test_status_json_validates_against_the_documented_schema(synthetic):
    out = cli("status", str(synthetic.root), "--json", "--no-slurm", "--baseline", str(synthetic.root))
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    schema = json.loads((REPO / "docs/status-schema.json").read_text())
    assert validate(document, schema) == []
    run = document["runs"][0]
    assert (run["state"], run["requeues"], run["requeue_reasons"]) == ("COMPLETED", 1, ["SIGUSR2"])
    assert (run["step"], run["total_steps"], run["checkpoint_step"]) == (2000, 2000, 2000)
    assert run["efficiency"] == pytest.approx(1.0)      # its own per-rank mean as the baseline
    broken = dict(run, state=7)
    assert validate({"runs": [broken]}, schema)


def test_status_plain_when_piped_and_all_lists_runs(synthetic):
    out = cli("status", str(synthetic.root), "--no-slurm")
    assert out.returncode == 0 and "\x1b[" not in out.stdout
    assert "state:      COMPLETED" in out.stdout and "1,003 recent" in out.stdout
    listing = cli("status", "--all", "--root", str(synthetic.root.parent), "--no-slurm")
    assert listing.stdout.splitlines()[1].startswith("bench-inspect\t42\tCOMPLETED")
    by_job = cli("status", "42", "--root", str(synthetic.root.parent), "--no-slurm", "--json")
    assert json.loads(by_job.stdout)["runs"][0]["run_dir"] == str(synthetic.root)


def test_status_running_run_has_eta_and_diagnosis_for_a_failure(tmp_path):
    paths = make_run(tmp_path, ranks=2, metric_lines=50)
    kept = [line for line in paths.events.read_text().splitlines() if '"finished"' not in line]
    paths.events.write_text("\n".join(kept) + "\n")
    now = json.loads(paths.metrics.read_text().splitlines()[-1])["time"] + 1
    status = summarize(paths, read_jsonl(paths.events), read_jsonl(paths.metrics),
                       {0: Beat(500, now - 1), 1: Beat(500, now - 1)}, (250, now - 60), now)
    assert status.state == "RUNNING" and status.eta_seconds == 0 and status.checkpoint_age_seconds == 60
    log = paths.rank_log(1)
    log.write_text(log.read_text() + time.strftime("%Y-%m-%d %H:%M:%S,000", time.localtime(now))
                   + " rank 1 x ERROR rank 1 failed:\nTraceback (most recent call last):\n  File \"t\"\n"
                   "hpc_train.errors.CheckpointError: the run's spec changed since its checkpoint: a\n")
    out = cli("diagnose", str(paths.root), "--json", "--no-slurm")
    result = json.loads(out.stdout)
    assert result["first_failure"]["rank"] == 1 and result["runs"] == 2 and result["run"] == 1
    assert [s["id"] for s in result["signatures"]] == ["spec_mismatch"]


def test_plot_has_four_panels_and_writes_a_png(synthetic, tmp_path):
    from PIL import Image

    from hpc_train.inspect.plot import plot_run

    figure = plot_run(synthetic, tmp_path / "run.png")
    assert len(figure.axes) == 4
    assert [ax.get_ylabel() for ax in figure.axes] == ["loss", "accuracy (val)", "learning rate", "images/s"]
    assert any(line.get_linestyle() == "--" for line in figure.axes[0].lines)   # the requeue mark
    with Image.open(tmp_path / "run.png") as image:
        image.verify()
    out = cli("plot", str(synthetic.root), "-o", str(tmp_path / "cli.png"))
    assert out.returncode == 0 and Image.open(tmp_path / "cli.png").size[0] > 0


def test_readme_inspect_section_commands_exist():
    readme = (REPO / "README.md").read_text()
    section = readme.split("## Inspect a run", 1)[1].split("\n## ", 1)[0]
    for command in ("status", "logs", "diagnose", "plot"):
        assert f"python -m hpc_train {command}" in section
    assert Path(REPO / "docs/inspection.md").is_file()

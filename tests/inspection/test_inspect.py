"""Pure pieces of inspection (log parsing, health, rate/ETA, Slurm parsers) and the commands on a
synthetic run directory (the benchmark's generator): merging, runs, schema, plot, render. Event
lists are built with hpc_train.events' constructors, heartbeats in runtime/heartbeat.py's format."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from hpc_train import events
from hpc_train.bench.inspect import make_run
from hpc_train.inspection import logs
from hpc_train.inspection.health import assess, stalled_now
from hpc_train.inspection.logparse import run_index, stack_dump, stamp_time, timed_lines, tracebacks
from hpc_train.inspection.summary import RunFiles, step_rate, summarize, throughput, total_steps
from hpc_train.job import watchdog
from hpc_train.rundir import RunPaths, read_jsonl
from hpc_train.runtime import heartbeat
from hpc_train.runtime.faults import Fault, parse_fault
from hpc_train.runtime.heartbeat import STACK_DUMP_HEADER, Beat, beat_interval
from tests.conftest import REPO
from tests.runs import cli, schema_problems


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


SAMPLES = REPO / "tests" / "samples"


def test_a_dataloader_workers_error_is_the_exception_and_names_the_shard():
    # Recorded from a real run on a truncated shard: torch re-raises the worker's DataError
    # ("Caught DataError in DataLoader worker process 0. Original Traceback ...").
    lines = list(timed_lines(1, (SAMPLES / "corrupt_shard_worker.log").read_text().splitlines()))
    found = tracebacks(lines)
    assert len(found) == 2                                  # logged by the worker, then uncaught
    assert found[0].exception == (
        "hpc_train.errors.DataError: /scratch/demo-shards/train/shard-00001.h5: cannot open as a "
        "shard: Unable to synchronously open file (truncated file: eof = 938760, sblock->base_addr = "
        "0, stored_eof = 1877520) (raised in DataLoader worker process 0)")
    assert "Caught DataError in DataLoader worker process 0." in found[0].text
    assert found[0].text.endswith("stored_eof = 1877520)")
    # A plain traceback right after a finished one still starts its own block.
    plain = ["Traceback (most recent call last):", '  File "x"', "ValueError: a",
             "Traceback (most recent call last):", '  File "y"', "KeyError: b"]
    assert [t.exception for t in tracebacks(timed_lines(0, plain))] == ["ValueError: a", "KeyError: b"]


def test_stack_dump_is_the_last_dump_up_to_the_next_log_line():
    texts = ["2026-11-30 08:00:00,000 rank 1 x INFO step 2/8",
             f"{STACK_DUMP_HEADER} for 150 s on rank 1 at step 2 (phase train); Python stacks follow",
             "Current thread 0x00007f0b7627eb80 (most recent call first):",
             '  File "/w/old.py", line 1 in old', "",
             "2026-11-30 08:05:00,000 rank 1 x INFO step 3/8",
             f"{STACK_DUMP_HEADER} for 151 s on rank 1 at step 3 (phase train); Python stacks follow",
             "Thread 0x00007f0b7551c6c0 (most recent call first):",
             '  File "/w/trainer.py", line 177 in train_epoch', '  File "/w/worker.py", line 71 in main',
             "", "Current thread 0x00007f0b7627eb80 (most recent call first):",
             '  File "/w/heartbeat.py", line 88 in _dump_if_stuck', "",
             "2026-11-30 08:06:00,000 rank 1 x INFO later", '  File "not/a/dump.py", line 1 in x']
    dump = stack_dump(timed_lines(1, texts))
    assert dump.splitlines()[0].startswith(f"{STACK_DUMP_HEADER} for 151 s")
    assert "line 177 in train_epoch" in dump and "old.py" not in dump and "not/a/dump" not in dump
    assert dump.endswith("in _dump_if_stuck")
    assert stack_dump(timed_lines(1, texts[:1])) is None


def test_run_index_by_start_times():
    starts = [100.0, 200.0]
    assert [run_index(t, starts) for t in (0.0, 100.0, 150.0, 200.5, 1e9)] == [0, 0, 0, 1, 1]
    assert run_index(5.0, []) == 0


def beat(rank: int, step: int, progress: float, alive: float, host: str = "vm") -> Beat:
    """A heartbeat as runtime/heartbeat.py writes it: progress = last move, alive = this write."""
    return Beat(rank, step, "train", progress, alive, 4240 + rank, host, first_step_time=LAUNCHED + 30)


NOW, LAUNCHED = 10_000.0, 9_000.0      # the run started 1000 s ago; launch.stall_seconds 300


def test_health_names_a_frozen_rank_while_it_is_frozen():
    # rank 1 stopped beating 40 s ago (silent after 3 beats of 5 s): stalled at once, though
    # rank 0 progressed a second ago.
    beats = {0: beat(0, 40, NOW - 1, NOW - 1), 1: beat(1, 40, NOW - 45, NOW - 40, host="n07")}
    frozen = assess(beats, NOW - 1, NOW, True, 600, world_size=2, launched=LAUNCHED)
    assert not frozen.ok and frozen.stalled_ranks == [1]
    assert frozen.message.startswith("stalled rank(s): 1 on n07 pid 4241 at step 40 (train), 45 s")
    assert "no heartbeat for 40 s: the process is not running" in frozen.message
    assert frozen.stalled == [{"rank": 1, "host": "n07", "pid": 4241, "step": 40, "phase": "train",
                               "idle_seconds": 45.0,
                               "why": "no heartbeat for 40 s: the process is not running"}]
    # It beats again (SIGCONT): no longer shown. A beat 12 s old is within three missed beats.
    thawed = {0: beats[0], 1: beat(1, 40, NOW - 1, NOW - 1)}
    assert assess(thawed, NOW - 1, NOW, True, 600, world_size=2, launched=LAUNCHED).message == "ok"
    late = {0: beats[0], 1: beat(1, 40, NOW - 17, NOW - 12)}
    assert assess(late, NOW - 1, NOW, True, 600, world_size=2, launched=LAUNCHED).ok


def test_health_names_ranks_behind_once_nobody_progresses_for_half_the_stall_bound():
    beats = {0: beat(0, 40, NOW - 160, NOW - 2), 1: beat(1, 36, NOW - 170, NOW - 2),
             2: beat(2, 40, NOW - 160, NOW - 2)}
    behind = assess(beats, NOW - 160, NOW, True, 600, world_size=3, launched=LAUNCHED)
    assert behind.stalled_ranks == [1] and "1 on vm pid 4241 at step 36" in behind.message
    assert "behind the others at step 36" in behind.message
    # 100 s without progress is less than half of launch.stall_seconds=300: a slow step, no alarm
    early = {r: beat(r, b.step, NOW - 100, NOW - 2) for r, b in beats.items()}
    assert assess(early, NOW - 100, NOW, True, 600, world_size=3, launched=LAUNCHED).ok
    # ...but it is with launch.stall_seconds=120 (the run's `started` event says which)
    short = assess(early, NOW - 100, NOW, True, 600, world_size=3, launched=LAUNCHED, stall_seconds=120)
    assert short.stalled_ranks == [1]
    # every rank alive at the same step: no single culprit, all are named
    same = {r: beat(r, 40, NOW - 200, NOW - 2) for r in range(2)}
    hang = assess(same, NOW - 200, NOW, True, 600, world_size=2, launched=LAUNCHED)
    assert hang.stalled_ranks == [0, 1] and "all ranks at the same step" in hang.message


def test_health_quiet_waiting_missing_and_not_running():
    alive = {0: beat(0, 40, NOW - 900, NOW - 1), 1: beat(1, 40, NOW - 900, NOW - 1)}
    quiet = assess(alive, NOW - 900, NOW, True, 600, world_size=2, launched=0.0, stall_seconds=3000)
    assert not quiet.ok and quiet.stalled_ranks == [] and "no progress for 15.0 min" in quiet.message
    fresh = {0: beat(0, 4, NOW - 5, NOW - 1), 1: beat(1, 4, NOW - 5, NOW - 1)}
    waiting = assess(fresh, NOW - 5, NOW, True, 600, [1], world_size=2, launched=LAUNCHED)
    assert waiting.stalled_ranks == [1] and "1 (Horovod lists it missing" in waiting.message
    # rank 2 never beat in this run: named once the run went half the start-up bound
    # (launch.start_seconds, 600 s: rank 2 has not begun its first step) without progress, its
    # idle time counted from the launch
    two = {r: beat(r, 4, NOW - 5, NOW + 199) for r in range(2)}
    assert assess(two, NOW - 5, NOW + 200, True, 600, world_size=3, launched=LAUNCHED).ok
    two = {r: beat(r, 4, NOW - 5, NOW + 299) for r in range(2)}
    missing = assess(two, NOW - 5, NOW + 300, True, 600, world_size=3, launched=LAUNCHED)
    assert missing.stalled_ranks == [2]
    assert missing.stalled[0]["idle_seconds"] == 1300.0 and missing.stalled[0]["host"] is None
    assert assess({0: beat(0, 1, 0, 0)}, None, NOW, False, 600).message == "not running"


@pytest.mark.parametrize("beats", [
    {0: beat(0, 40, NOW - 400, NOW - 1), 1: beat(1, 40, NOW - 400, NOW - 60)},     # frozen
    {0: beat(0, 40, NOW - 400, NOW - 1), 1: beat(1, 39, NOW - 410, NOW - 1)},      # behind
    {0: beat(0, 40, NOW - 400, NOW - 1), 1: beat(1, 40, NOW - 400, NOW - 1)},      # all
    {0: beat(0, 40, NOW - 400, NOW - 1)},                                          # one missing
])
def test_status_names_the_ranks_the_driver_would_tear_down(beats):
    driver = watchdog.find_stall(beats, 2, LAUNCHED, NOW, 300, beat_interval(300))
    status = stalled_now(beats, 2, LAUNCHED, NOW, 300)
    assert driver is not None
    assert [(r.rank, r.why) for r in status] == [(r.rank, r.why) for r in driver.ranks]


def test_read_beats_reads_this_runs_beats_in_the_new_format(tmp_path):
    paths = RunPaths(tmp_path / "run")
    paths.make_dirs()
    paths.rank_heartbeat(0).write_text(json.dumps({"rank": 0, "host": "vm", "pid": 7, "step": 5,
                                                   "phase": "train", "progress": 95.0, "time": 99.0}))
    paths.rank_heartbeat(1).write_text(json.dumps({"step": 5, "time": 99.0, "pid": 8}))  # old format
    paths.rank_heartbeat(2).write_text(json.dumps({"rank": 2, "step": 1, "progress": 1.0, "time": 2.0}))
    (paths.heartbeat / ".rank-00003.tmp").write_text("{")
    assert heartbeat.read_beats(paths.heartbeat) == {0: Beat(0, 5, "train", 95.0, 99.0, 7, "vm"),
                                                     2: Beat(2, 1, "?", 1.0, 2.0)}
    assert list(heartbeat.read_beats(paths.heartbeat, since=50.0)) == [0]   # rank 2's: an earlier run's
    assert (watchdog.read_beats, watchdog.parse_beat, watchdog.Beat) == (
        heartbeat.read_beats, heartbeat.parse_beat, Beat)        # one reader, next to the writer


def test_summarize_uses_the_runs_own_stall_bound_and_world(tmp_path):
    paths = RunPaths(tmp_path / "run")
    history = [events.stamped(events.submitted("7", "slurm", "h"), environ={}, now=LAUNCHED - 10),
               events.stamped(events.started(["vm"], 2, None, [], 20.0), environ={}, now=LAUNCHED)]
    # launch.stall_seconds=20: beats every 2 s, silent after 10 s; rank 1's is 12 s old
    beats = {0: beat(0, 9, NOW - 1, NOW - 1), 1: beat(1, 9, NOW - 12, NOW - 12)}
    status = summarize(RunFiles(paths, history, [], beats, None), NOW)
    assert (status.state, status.job_id, status.world_size) == ("RUNNING", "7", 2)
    assert status.health.stalled_ranks == [1]
    history[1] = events.stamped(events.started(["vm"], 2, None, [], 300.0), environ={}, now=LAUNCHED)
    assert summarize(RunFiles(paths, history, [], beats, None), NOW).health.ok     # silent after 15 s there
    # Requeued, and Slurm shows the job RUNNING before the driver's next `started`: no ranks run
    # yet, so the last run's beats do not make a stall.
    from hpc_train.scheduler import Job, JobState

    history[1] = events.stamped(events.started(["vm"], 2, None, [], 20.0), environ={}, now=LAUNCHED)
    history.append(events.stamped(events.requeued("SIGUSR2", events.CAUSE_STOP, "driver", "", 75, 9.0),
                                  environ={}, now=NOW - 5))
    between = summarize(RunFiles(paths, history, [], beats, None), NOW,
                        Job("7", JobState.RUNNING, source="squeue"))
    assert between.state == "RUNNING" and between.health.ok and between.health.stalled_ranks == []


def test_status_names_the_slowest_rank_and_its_node_and_an_auto_stall_bound(tmp_path):
    from hpc_train.inspection.text import status_rows
    from hpc_train.runtime.heartbeat import RankTimes

    paths = RunPaths(tmp_path / "run")
    history = [events.stamped(events.started(["vm", "n07"], 2, None, [], "auto"), environ={},
                              now=LAUNCHED)]

    def beats(idle, longest=0.3):
        return {r: Beat(r, 9, "train", NOW - idle, NOW - 1, 10 + r, host,
                        RankTimes(0.3, data, busy, 32, longest_step=longest), LAUNCHED + 30)
                for r, host, data, busy in ((0, "vm", 0.01, 0.1), (1, "n07", 0.2, 0.3))}

    status = summarize(RunFiles(paths, history, [], beats(20), None, spec={}), NOW)
    assert (status.slowest["rank"], status.slowest["host"], status.slowest["over"]) == (1, "n07", True)
    assert status.slowest["on_data"] and status.slowest["warn"] == 1.5      # the default
    # auto: a 60 s bound (5 x 0.3 s, at least the floor), ranks named after half of it
    assert status.health.ok
    assert not summarize(RunFiles(paths, history, [], beats(40), None), NOW).health.ok
    assert summarize(RunFiles(paths, history, [], beats(40, None), None), NOW).health.ok  # no step yet
    row = dict(status_rows(status))["slowest"]
    assert row.startswith("rank 1 on n07: 3.0x") and "STRAGGLER (over launch.straggler_warn=1.5)" in row
    quiet = summarize(RunFiles(paths, history, [], beats(20), None,
                               spec={"launch": {"straggler_warn": None}}), NOW)
    assert not quiet.slowest["over"] and "STRAGGLER" not in dict(status_rows(quiet))["slowest"]


def test_summarize_names_the_waiting_ranks_and_a_quiet_run(tmp_path):
    history = [events.stamped(events.submitted("7", "slurm", "h"), environ={}, now=LAUNCHED - 10),
               events.stamped(events.started(["vm"], 2, None, [], 300.0), environ={}, now=LAUNCHED)]
    beats = {r: beat(r, 9, NOW - 100, NOW - 1) for r in (0, 1)}     # alive; moved 100 s ago
    run = RunFiles(RunPaths(tmp_path / "run"), history, [], beats, None, waiting_ranks=[1])
    health = summarize(run, NOW).health
    assert not health.ok and health.stalled_ranks == [1] and "no progress" not in health.message
    quiet = summarize(run, NOW, quiet_seconds=60).health
    assert "no progress for 1.7 min" in quiet.message


def test_status_counts_the_restarts_in_the_job_from_the_run_state(tmp_path):
    from hpc_train import run_state
    from hpc_train.inspection.text import status_rows

    paths = RunPaths.new(tmp_path, "restarted")
    for cause in (events.CAUSE_FAILURE, events.CAUSE_STALL, events.CAUSE_FAILURE):
        run_state.update(paths, lambda s: s.with_restart_in_job(cause))
    status = summarize(RunFiles.read(paths), NOW)
    assert status.restarts_in_job == {"failure": 2, "stall": 1}
    assert ("restarts", "3  (failure 2, stall 1) in the job") in status_rows(status)
    assert ("restarts", "0 in the job") in status_rows(summarize(RunFiles.read(RunPaths.new(tmp_path, "x")), NOW))


FAKE_SLURM = {
    "squeue": "#!/bin/sh\necho '7|COMPLETING|None|1:00|2026-12-01T10:00:00|2|hpcn[1-2]'\n",
    "scontrol": "#!/bin/sh\necho 'NodeName=hpcn1 NodeAddr=10.0.0.1 State=ALLOCATED Weight=1'\n"
                "echo 'NodeName=hpcn2 NodeAddr=10.0.0.2 State=ALLOCATED+NOT_RESPONDING Weight=1'\n",
}


def test_status_names_a_node_of_the_job_that_is_not_responding(tmp_path, monkeypatch):
    from hpc_train.inspection.cli import build_status
    from hpc_train.inspection.text import status_rows
    from tests.runs import path_without

    paths = RunPaths.new(tmp_path / "runs", "dead-node")
    (paths.events).write_text(json.dumps(events.stamped(events.submitted("7", "slurm", "h"), environ={},
                                                         now=LAUNCHED)) + "\n")
    monkeypatch.setenv("PATH", path_without(tmp_path / "bin", replacements=FAKE_SLURM))
    status = build_status(paths.root)
    assert status.state == "COMPLETING" and status.lost_nodes == {"hpcn2": "ALLOCATED+NOT_RESPONDING"}
    assert ("nodes", "hpcn2 not responding or down (Slurm: ALLOCATED+NOT_RESPONDING)") in status_rows(status)


def test_rate_eta_throughput_and_total_steps():
    train = [{"time": 10.0 + i, "step": 4 * i, "samples_per_s": 100.0 + i} for i in range(20)]
    assert step_rate(train, since=0) == pytest.approx(4.0)
    assert step_rate([{"time": 1, "step": 4, "step_time": 0.5}], since=0) == 2.0
    flow = throughput(train)
    assert (flow.field, flow.unit, flow.recent, flow.mean) == ("samples_per_s", "samples/s", 119.0, 109.5)
    history = [events.stamped(events.training_started(total_steps=92, steps_per_epoch=46), environ={}, now=1),
               events.stamped(events.spec_change_allowed("a", "b", ["optim.epochs"]), environ={}, now=2)]
    assert total_steps(history, {"optim": {"epochs": 3}}) == 138
    assert total_steps(history[:1], {"optim": {"epochs": 3}}) == 92


def test_state_from_events():
    def at(*made):
        return [events.stamped(e, environ={}, now=float(i)) for i, e in enumerate(made)]

    submitted = events.submitted("7", "slurm", "h")
    started = events.started(["vm"], 2, None, [], 300.0)
    assert events.state(at(submitted)) == "PENDING"
    assert events.state(at(submitted, started)) == "RUNNING"
    assert events.state(at(started, events.requeued("SIGUSR2", events.CAUSE_STOP, "driver", "", 75, 1.0))) == "PENDING"
    assert events.state(at(events.finished("completed", "done", 0, 1.0))) == "COMPLETED"
    assert events.state(at(events.finished("timeout", "limit", 1, 1.0))) == "TIMEOUT"


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
    assert schema_problems(document, schema) == []
    run = document["runs"][0]
    assert (run["state"], run["requeues"], run["requeue_reasons"]) == ("COMPLETED", 1, ["SIGUSR2"])
    assert (run["step"], run["total_steps"], run["checkpoint_step"]) == (2000, 2000, 2000)
    assert run["efficiency"] == pytest.approx(1.0)      # its own per-rank mean as the baseline
    broken = dict(run, state=7)
    assert schema_problems({"runs": [broken]}, schema)


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
    status = summarize(RunFiles(paths, read_jsonl(paths.events), read_jsonl(paths.metrics),
                                {0: beat(0, 500, now - 1, now - 1), 1: beat(1, 500, now - 1, now - 1)},
                                (250, now - 60)), now)
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

    from hpc_train.inspection.plot import plot_run

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


def test_status_shows_a_frozen_rank_of_a_running_run_and_validates(tmp_path, monkeypatch, capsys):
    """A run RUNNING by its events whose rank 1 stopped beating 60 s ago, rank 0 alive: health and
    the diagnosis name rank 1 with host and pid. `status` runs here with its clock held at `now`,
    so the silence it reports is exact; `diagnose` runs as its own process, on the real clock."""
    from hpc_train.cli import main
    from hpc_train.rundir import append_jsonl

    now = time.time()
    paths = RunPaths(tmp_path / "run")
    paths.make_dirs()
    for made, at in ((events.submitted("7", "local", "h"), now - 130),
                     (events.started(["vm", "n07"], 2, None, ["mpirun"], 300.0), now - 120)):
        append_jsonl(paths.events, events.stamped(made, environ={}, now=at))
    for rank, host, alive in ((0, "vm", now - 1), (1, "n07", now - 60)):
        paths.rank_heartbeat(rank).write_text(json.dumps(
            {"rank": rank, "host": host, "pid": 4240 + rank, "step": 12, "phase": "train",
             "progress": now - 65, "time": alive}))
    with monkeypatch.context() as held:
        held.setattr(time, "time", lambda: now)
        assert main(["status", str(paths.root), "--json", "--no-slurm"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert schema_problems(document, json.loads((REPO / "docs/status-schema.json").read_text())) == []
    run = document["runs"][0]
    assert run["state"] == "RUNNING" and run["health"]["stalled_ranks"] == [1]
    [stalled] = run["health"]["stalled"]
    assert (stalled["rank"], stalled["host"], stalled["pid"], stalled["step"]) == (1, "n07", 4241, 12)
    assert stalled["why"].startswith("no heartbeat for 60 s:"), stalled["why"]
    assert "1 on n07 pid 4241 at step 12" in run["health"]["message"]
    stall = run["diagnosis"]["stall"]
    assert stall["source"] == "heartbeats" and [r["rank"] for r in stall["ranks"]] == [1]
    assert run["diagnosis"]["signatures"][0]["id"] == "rank_stalled"
    text = cli("diagnose", str(paths.root), "--no-slurm").stdout
    assert "stalled now (from the heartbeats" in text and "rank 1 on n07 pid 4241 at step 12" in text

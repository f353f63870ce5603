"""A rank that dies without a traceback is named by mpirun's report (pure parsing and the rule
that decides between it and the tracebacks); a deliberate stop (STOP_EXIT) is not a failure; a
stall the driver recorded, or a frozen rank of a running run, is diagnosed with the rank's state
and stacks. The driver output below was recorded from real runs on this machine (Open MPI 4.1.4,
faults exit:1:3 and kill:1:3, and ranks exiting 75); tests/test_inspect_e2e.py produces the
failures again and diagnoses the real run directories. Events are built with hpc_train.events'
constructors."""

from __future__ import annotations

import json
import time

import pytest

from hpc_train import events
from hpc_train.inspection.diagnose import Failure, diagnose, silent_failure
from hpc_train.inspection.launcher import RankExit, exit_hint, rank_exits
from hpc_train.inspection.logparse import Line, Traceback, stamp_time
from hpc_train.inspection.text import diagnosis_text
from hpc_train.scheduler import Job, JobState
from hpc_train.rundir import RunPaths, append_jsonl
from hpc_train.runtime.heartbeat import STACK_DUMP_HEADER
from hpc_train.runtime.stop import STOP_EXIT
from tests.conftest import REPO
from tests.runs import cli, schema_problems

STARTING = ("2026-11-29 20:49:44,092 driver INFO starting 2 ranks: /usr/bin/mpirun -np 2 -H vm:2 "
            "-x HPC_TRAIN_FAULT=exit:1:3 /work/main/.venv/bin/python -m hpc_train.job.worker /runs/x")
BANNER = """--------------------------------------------------------------------------
Primary job  terminated normally, but 1 process returned
a non-zero exit code. Per user-direction, the job has been aborted.
--------------------------------------------------------------------------
--------------------------------------------------------------------------"""
EXIT_REPORT = f"""{STARTING}
{BANNER}
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[7526,1],1]
  Exit code:    1
--------------------------------------------------------------------------
2026-11-29 20:49:56,756 driver INFO ranks exited 1: failed (ranks failed (mpirun exit 1))"""
SIGNAL_REPORT = f"""{STARTING}
{BANNER}
mpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 (Killed).
--------------------------------------------------------------------------
2026-11-29 20:50:12,414 driver INFO ranks exited 137: failed (ranks failed (mpirun exit 137))"""


def parse(text: str, source: str = "1_0_log.err") -> list[RankExit]:
    return rank_exits((source, line) for line in text.splitlines())


def test_open_mpi_reports_of_an_exit_code_and_a_signal():
    started = stamp_time(STARTING)
    [code] = parse(EXIT_REPORT)
    assert (code.rank, code.how, code.started) == (1, "exit code 1", started)
    assert code.line == "Process name: [[7526,1],1] Exit code:    1"
    [signal] = parse(SIGNAL_REPORT)
    assert (signal.rank, signal.how, signal.started) == (1, "signal 9 (Killed) on node vm", started)


def test_other_launcher_spellings_and_lines_that_are_not_reports():
    prte = [("prterun noticed that process rank 3 with PID 77 on node n07 exited on signal 11 "
             "(Segmentation fault)."), "  Process name: [prterun-n07-1234@1,5]", "  Exit code:    9"]
    assert [(e.rank, e.how) for e in parse("\n".join(prte))] == [
        (3, "signal 11 (Segmentation fault) on node n07"), (5, "exit code 9")]
    # An exit code that does not follow its process name, and a report split over two files.
    assert parse("  Process name: [[1,1],0]\nsomething else\n  Exit code:    1") == []
    split = [("a.err", "  Process name: [[1,1],0]"), ("b.err", "  Exit code:    1")]
    assert rank_exits(split) == []
    assert parse("step 3/8 loss 2.2\nrank 1 done") == []


def test_hints_follow_the_way_the_rank_died():
    assert "OOM killer" in exit_hint("signal 9 (Killed) on node vm")
    assert "faulthandler" in exit_hint("signal 11 (Segmentation fault) on node vm")
    assert "outside" in exit_hint("signal 15 (Terminated) on node vm")
    assert "os._exit" in exit_hint("exit code 1")


def _traceback(rank: int, exception: str, at: float = 10.0) -> Traceback:
    return Traceback(rank, at, f"Traceback (most recent call last):\n  File \"x\"\n{exception}", exception)


ENDED = RankExit(1, "signal 9 (Killed) on node vm", "1_0_log.err", "mpirun noticed ...", None)
LOGS = {0: [Line(5.0, 0, "step 2/8")], 1: [Line(4.0, 1, "rank 1/2 (local 1) pid 9 on vm")]}


@pytest.mark.parametrize("per_rank, expected", [
    ({}, 1),                                                                     # nobody raised
    ({0: [_traceback(0, "RuntimeError: Connection closed by peer [127.0.0.1]:1")]}, 1),  # a consequence
    ({0: [_traceback(0, "ValueError: bad batch")]}, None),    # rank 0 raised for a reason of its own
    ({1: [_traceback(1, "MemoryError")]}, None),              # the reported rank has a traceback
])
def test_the_reported_rank_is_the_failure_only_when_no_traceback_explains_more(per_rank, expected):
    found = silent_failure(per_rank, ENDED, LOGS)
    assert (found.rank if found else None) == expected
    if found:
        assert found == Failure(1, 4.0, "no traceback: the rank ended with signal 9 (Killed) on node vm "
                                        "(mpirun's report)", "rank 1/2 (local 1) pid 9 on vm")
    assert silent_failure(per_rank, None, LOGS) is None


def _run_dir(tmp_path, starts: list[float]) -> RunPaths:
    paths = RunPaths(tmp_path / "run")
    paths.make_dirs()
    for start in starts:
        append_jsonl(paths.events, events.stamped(events.started(["vm"], 2, None, [], 300.0),
                                                  environ={"SLURM_JOB_ID": "1"}, now=start))
    append_jsonl(paths.events, events.stamped(events.finished("failed", "ranks failed (mpirun exit 1)", 1, 30.0),
                                              environ={"SLURM_JOB_ID": "1"}, now=starts[-1] + 30))
    for rank in (0, 1):
        stamp = time.strftime("%Y-%m-%d %H:%M:%S,000", time.localtime(starts[-1] + 1))
        paths.rank_log(rank).write_text(f"{stamp} rank {rank} hpc_train.worker INFO rank {rank}/2\n")
    return paths


def test_diagnose_names_a_silent_rank_from_the_driver_log_of_its_own_run(tmp_path):
    start = stamp_time(STARTING)
    paths = _run_dir(tmp_path, [start])
    (paths.submitit / "1_0_log.err").write_text(SIGNAL_REPORT + "\n")
    result = diagnose(paths)
    assert (result.found_by, result.first_failure.rank, result.failed_ranks) == ("mpirun", 1, [])
    assert result.launcher["rank"] == 1 and "OOM killer" in result.launcher["hint"]
    text = diagnosis_text(result)
    assert "first failed rank: 1 on vm (it left no traceback; mpirun named it in the driver log)" in text
    assert "signal 9 (Killed)" in text and "rank 1/2" in text
    # The same report read for a later run (a requeue started after it) says nothing about that run.
    later = _run_dir(tmp_path / "later", [start, start + 100])
    (later.submitit / "1_0_log.err").write_text(EXIT_REPORT + "\n")
    again = diagnose(later)
    assert again.first_failure is None and again.launcher is None
    assert diagnose(later, run=0).launcher["how"] == "exit code 1"


def test_status_json_with_a_launcher_report_validates_against_the_schema(tmp_path):
    paths = _run_dir(tmp_path, [stamp_time(STARTING)])
    (paths.submitit / "1_0_log.err").write_text(EXIT_REPORT + "\n")
    out = cli("status", str(paths.root), "--json", "--no-slurm")
    assert out.returncode == 0, out.stderr
    document = json.loads(out.stdout)
    assert schema_problems(document, json.loads((REPO / "docs/status-schema.json").read_text())) == []
    assert document["runs"][0]["diagnosis"]["found_by"] == "mpirun"


# -- a deliberate stop is not a failure -------------------------------------------------------

# Open MPI 4.1.4 on this machine, two ranks that exit with STOP_EXIT (recorded with `mpirun -np 2
# python -c "import sys; sys.exit(75)"`).
STOP_REPORT = f"""{STARTING}
{BANNER}
mpirun detected that one or more processes exited with non-zero status, thus causing
the job to be terminated. The first process to do so was:

  Process name: [[17632,1],1]
  Exit code:    75
--------------------------------------------------------------------------
2026-11-29 20:50:30,101 driver INFO ranks exited 75: requeue (SIGUSR2)"""


def _stamp(at: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S,000", time.localtime(at))


def _events_run(tmp_path, made: list[tuple[dict, float]], logs: dict[int, str] | None = None) -> RunPaths:
    """A run directory whose events come from hpc_train.events' constructors, stamped at times."""
    paths = RunPaths(tmp_path / "run")
    paths.make_dirs()
    for event, at in made:
        append_jsonl(paths.events, events.stamped(event, environ={}, now=at))
    for rank, text in (logs or {}).items():
        paths.rank_log(rank).write_text(text)
    return paths


def test_exit_code_75_is_a_stop_in_mpiruns_report():
    [stop] = parse(STOP_REPORT)
    assert (stop.rank, stop.how, stop.stopped) == (1, f"exit code {STOP_EXIT}", True)
    assert not parse(EXIT_REPORT)[0].stopped
    assert "stopped on purpose" not in exit_hint("exit code 1")
    assert "STOP_EXIT" in exit_hint(stop.how) and "not a failure" in exit_hint(stop.how)
    assert silent_failure({}, stop, LOGS) is None


def test_a_run_stopped_by_usr2_and_requeued_is_not_a_failed_rank(tmp_path):
    start = stamp_time(STARTING)
    paths = _events_run(tmp_path, [
        (events.started(["vm"], 2, None, ["mpirun"], 300.0), start),
        (events.stop_saved(40, "SIGUSR2"), start + 10),
        (events.stop_requested("SIGUSR2", "driver signal"), start + 11),
        (events.requeued("SIGUSR2", events.CAUSE_STOP, "driver", "", STOP_EXIT, 12.0), start + 12)],
        {r: f"{_stamp(start + 1)} rank {r} hpc_train.worker INFO rank {r}/2\n"
            f"{_stamp(start + 10)} rank {r} hpc_train.worker INFO rank {r} stopped (SIGUSR2) after "
            f"saving; exit 75\n" for r in (0, 1)})
    (paths.submitit / "1_0_log.err").write_text(STOP_REPORT + "\n")
    result = diagnose(paths)
    assert result.first_failure is None and result.found_by is None
    assert result.stop == {"reason": "SIGUSR2", "step": 40, "ending": "requeued (cause stop, by driver)",
                           "detail": "SIGUSR2"}
    assert result.launcher["how"] == "exit code 75"
    text = diagnosis_text(result)
    assert "stopped on purpose: SIGUSR2 at step 40 (checkpoint saved); then requeued (cause stop" in text
    assert "first failed rank" not in text and "exit code 75 = STOP_EXIT, stopped on purpose" in text


def test_mpiruns_stop_exit_alone_is_a_stop_and_a_real_failure_still_is_one(tmp_path):
    start = stamp_time(STARTING)
    # The events of the stop were lost (a full disk): mpirun's exit code 75 still says it.
    paths = _events_run(tmp_path / "lost", [(events.started(["vm"], 2, None, [], 300.0), start)],
                        {0: f"{_stamp(start + 1)} rank 0 x INFO rank 0/2\n"})
    (paths.submitit / "1_0_log.err").write_text(STOP_REPORT + "\n")
    lost = diagnose(paths)
    assert lost.first_failure is None and lost.stop["reason"] is None and lost.stop["step"] is None
    failed = _events_run(tmp_path / "failed", [(events.started(["vm"], 2, None, [], 300.0), start),
                                               (events.finished("failed", "ranks failed", 1, 9.0), start + 9)],
                         {0: f"{_stamp(start + 1)} rank 0 x INFO rank 0/2\n"})
    (failed.submitit / "1_0_log.err").write_text(EXIT_REPORT + "\n")
    result = diagnose(failed)
    assert result.stop is None and (result.found_by, result.first_failure.rank) == ("mpirun", 1)


# -- stalls ------------------------------------------------------------------------------------

STUCK = "  File \"/work/main/hpc_train/train/trainer.py\", line 177 in train_epoch"


def _dump(at: float, step: int, frame: str) -> str:
    return (f"{_stamp(at)} rank 1 hpc_train.trainer INFO step {step}/8 loss 2.2\n"
            f"{STACK_DUMP_HEADER} for 31 s on rank 1 at step {step} (phase train); Python stacks of "
            "every thread follow\n"
            "Thread 0x00007f0b7551c6c0 (most recent call first):\n"
            f"{frame}\n  File \"/work/main/hpc_train/job/worker.py\", line 71 in main\n\n"
            "Current thread 0x00007f0b7627eb80 (most recent call first):\n"
            "  File \"/work/main/hpc_train/runtime/heartbeat.py\", line 88 in _dump_if_stuck\n\n")


def _stalled_run(tmp_path, ending: dict, signal_report: bool = True) -> RunPaths:
    start = stamp_time(STARTING)
    rank1 = (_dump(start - 500, 1, "  File \"/old/run.py\", line 1 in old")      # an earlier run's
             + f"{_stamp(start + 1)} rank 1 hpc_train.worker INFO rank 1/2\n"
             + _dump(start + 20, 2, "  File \"/first/dump.py\", line 1 in first")
             + _dump(start + 40, 3, STUCK))
    paths = _events_run(tmp_path, [
        (events.started(["vm"], 2, None, [], 60.0), start - 600),
        (events.started(["vm"], 2, None, [], 60.0), start),
        (events.ranks_stalled("no rank progressed for 61 s (launch.stall_seconds=60)",
                              [{"rank": 1, "host": "vm", "pid": 4242, "step": 3, "phase": "train",
                                "idle_seconds": 61.0, "state": "T (stopped)",
                                "why": "no heartbeat for 61 s: the process is not running"},
                               # a rank that never beat: the watchdog records `now` as its idle time
                               {"rank": 0, "host": None, "pid": None, "step": None, "phase": None,
                                "idle_seconds": start + 70, "state": None,
                                "why": "no heartbeat from this run"}], 61.0),
         start + 70),
        (ending, start + 75)],
        {0: f"{_stamp(start + 1)} rank 0 x INFO rank 0/2\n"
            # the teardown's consequence on rank 0, after the stall: not the cause
            f"{_stamp(start + 72)} rank 0 x ERROR rank 0 failed:\nTraceback (most recent call last):\n"
            "  File \"x\"\nRuntimeError: Horovod has been shut down\n", 1: rank1})
    if signal_report:
        (paths.submitit / "1_0_log.err").write_text(
            f"{STARTING}\nmpirun noticed that process rank 1 with PID 0 on node vm exited on signal 9 "
            "(Killed).\n")
    return paths


def test_a_recorded_stall_names_the_rank_its_state_and_its_last_stacks(tmp_path):
    paths = _stalled_run(tmp_path, events.requeued("stall: no rank progressed", events.CAUSE_STALL,
                                                   "driver", "", 143, 75.0))
    result = diagnose(paths)
    assert result.first_failure is None and result.found_by is None     # the teardown killed rank 1
    assert result.stop is None and result.stalled_ranks == [0, 1] and result.stall["source"] == "driver"
    rank, never = result.stall["ranks"]
    assert never["idle_seconds"] == 70.0 and never["stacks"] is None   # capped at the run's age
    assert (rank["rank"], rank["host"], rank["pid"], rank["step"], rank["phase"], rank["state"]) == (
        1, "vm", 4242, 3, "train", "T (stopped)")
    assert STUCK in rank["stacks"] and "/first/dump.py" not in rank["stacks"] and "/old/" not in rank["stacks"]
    assert rank["stacks"].startswith(f"{STACK_DUMP_HEADER} for 31 s on rank 1 at step 3")
    first = result.signatures[0]
    assert first["id"] == "rank_stalled" and first["title"] == "a rank stopped progressing"
    assert first["fix"].startswith("the driver tore the ranks down and started them again from the "
                                   "last checkpoint: in the job (launch.restarts_in_job), else by")
    assert "rank 1 on vm pid 4242 step 3 (train, state T (stopped))" in first["line"]
    assert [s["id"] for s in result.signatures].count("rank_stalled") == 1
    text = diagnosis_text(result)
    assert "stalled: no rank progressed for 61 s" in text and "process state T (stopped)" in text
    assert STUCK in text and "first failed rank" not in text
    assert "signal 9 (Killed) on node vm, in the driver's teardown of the stalled ranks" in text
    assert "then: requeued (cause stall, by driver)" in text


def test_a_stalled_run_ended_by_the_time_limit_is_a_stall_first(tmp_path):
    paths = _stalled_run(tmp_path, events.finished("timeout", "stall: ...; not requeued: Slurm is "
                                                   "ending the job", 143, 75.0))
    (paths.submitit / "1_0_log.err").write_text("slurmstepd: error: *** JOB 7 ON vm CANCELLED AT "
                                                "2026-11-29T21:00:00 DUE TO TIME LIMIT ***\n")
    result = diagnose(paths, slurm=Job("7", JobState.TIMEOUT, exit_code="0:15", source="sacct"))
    ids = [s["id"] for s in result.signatures]
    assert ids[0] == "rank_stalled" and "slurm_time_limit" not in ids
    assert "Slurm's time limit ended the job: a consequence of the stall" in result.signatures[0]["line"]
    assert "not requeued" in result.signatures[0]["fix"] and "raise slurm.time" not in diagnosis_text(result)


def test_a_running_runs_frozen_rank_is_named_from_the_heartbeats(tmp_path):
    start = stamp_time(STARTING)
    paths = _events_run(tmp_path, [(events.started(["vm"], 2, None, [], 300.0), start)],
                        {1: f"{_stamp(start + 1)} rank 1 x INFO rank 1/2\n"})
    for rank, alive in ((0, start + 99), (1, start + 50)):
        paths.rank_heartbeat(rank).write_text(json.dumps(
            {"rank": rank, "host": "vm", "pid": 10 + rank, "step": 7, "phase": "train",
             "progress": start + 45, "time": alive}))
    result = diagnose(paths, now=start + 100)
    assert result.stall["source"] == "heartbeats" and result.stalled_ranks == [1]
    [rank] = result.stall["ranks"]
    assert (rank["host"], rank["pid"], rank["step"]) == ("vm", 11, 7)
    assert "no heartbeat for 50 s" in rank["why"] and rank["stacks"] is None
    assert result.signatures[0]["source"] == "heartbeats"
    assert diagnose(paths, now=start + 60).stall is None          # 10 s without a beat is not frozen
    finished = _events_run(tmp_path / "done", [(events.started(["vm"], 2, None, [], 300.0), start),
                                               (events.finished("completed", "ok", 0, 99.0), start + 99)])
    assert diagnose(finished, now=start + 100).stall is None      # only while RUNNING


def test_srun_reports_name_the_task_its_node_and_how_it_ended():
    driver = [("log.err", STARTING.replace("/usr/bin/mpirun -np 2 -H vm:2", "srun --mpi=pmix")),
              ("log.err", "srun: error: hpcn2: task 1: Exited with exit code 1"),
              ("log.err", "srun: error: hpcn1: task 0: Killed"),
              ("log.err", "srun: error: hpcn2: tasks 2-3: Segmentation fault (core dumped)"),
              ("log.err", f"srun: error: hpcn1: task 0: Exited with exit code {STOP_EXIT}")]
    found = rank_exits(driver)
    assert [(e.rank, e.how, e.node, e.launcher) for e in found] == [
        (1, "exit code 1", "hpcn2", "srun"),
        (0, "signal 9 (Killed) on node hpcn1", "hpcn1", "srun"),
        (2, "signal 11 (Segmentation fault) on node hpcn2", "hpcn2", "srun"),
        (0, f"exit code {STOP_EXIT}", "hpcn1", "srun")]
    assert found[0].started == stamp_time(STARTING) and found[-1].stopped
    assert "OOM killer" in exit_hint(found[1].how) and "native code" in exit_hint(found[2].how)


def test_a_rank_names_its_node_in_its_first_line():
    from hpc_train.inspection.logparse import rank_host, timed_lines

    stamp = "2026-11-30 12:26:02,316 rank 1 hpc_train.worker INFO "
    assert rank_host(timed_lines(1, [stamp + "rank 1/2 (local 0) pid 7 on hpcn2, code /r/code/hpc_train"])) == "hpcn2"
    assert rank_host(timed_lines(1, [stamp + "rank 1/2 (local 0) pid 7 on vm"])) == "vm"
    assert rank_host(timed_lines(1, [stamp + "step 20/92 epoch 0 loss 1.4"])) is None


@pytest.mark.parametrize("standing", ["starting", "exiting"])
def test_ranks_ended_after_a_stop_too_early_to_obey_or_already_saved_stopped(tmp_path, standing):
    start = stamp_time(STARTING)
    why = "the ranks did not stop within 15 s of the forwarded stop (it came while they still started)"
    reason = f"SIGUSR2 (the ranks were ended: {why})"
    paths = _events_run(tmp_path, [
        (events.started(["vm"], 2, None, ["mpirun"], 300.0), start),
        (events.ranks_stalled(why, [{"rank": r, "host": "vm", "pid": 10 + r, "step": 30,
                                     "phase": "data", "idle_seconds": 1.0, "state": None,
                                     "why": "alive but not progressing"} for r in (0, 1)],
                              17.0, standing), start + 20),
        (events.stop_requested("SIGUSR2", "driver signal"), start + 21),
        (events.requeued(reason, events.CAUSE_INTERRUPTED, "driver", "", 143, 21.0), start + 21)],
        {0: f"{_stamp(start + 1)} rank 0 x INFO rank 0/2\n"
            # the teardown's consequence: not a failure
            f"{_stamp(start + 22)} rank 0 x ERROR rank 0 failed:\nTraceback (most recent call last):\n"
            "  File \"x\"\nRuntimeError: Horovod has been shut down\n"})
    result = diagnose(paths)
    assert result.stall is None and result.first_failure is None
    assert "rank_stalled" not in [s["id"] for s in result.signatures]
    assert result.stop["reason"] == "SIGUSR2" and result.stop["detail"] == reason
    assert "stopped on purpose: SIGUSR2" in diagnosis_text(result)

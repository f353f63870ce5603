"""A rank that dies without a traceback is named by mpirun's report (pure parsing and the rule
that decides between it and the tracebacks). The driver output below was recorded from real runs
on this machine (Open MPI 4.1.4, faults exit:1:3 and kill:1:3); tests/test_inspect_e2e.py
produces it again and diagnoses the real run directories."""

from __future__ import annotations

import json
import time

import pytest

from hpc_train.inspect.diagnose import Failure, diagnose, silent_failure
from hpc_train.inspect.launcher import RankExit, exit_hint, rank_exits
from hpc_train.inspect.logparse import Line, Traceback, stamp_time
from hpc_train.inspect.render import diagnosis_text
from hpc_train.rundir import RunPaths, append_jsonl
from tests.conftest import REPO
from tests.jsonschema_mini import validate
from tests.runs import cli

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
        append_jsonl(paths.events, {"time": start, "event": "started", "job_id": "1"})
    append_jsonl(paths.events, {"time": starts[-1] + 30, "event": "finished", "status": "failed"})
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
    assert "first failed rank: 1 (it left no traceback; mpirun named it in the driver log)" in text
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
    assert validate(document, json.loads((REPO / "docs/status-schema.json").read_text())) == []
    assert document["runs"][0]["diagnosis"]["found_by"] == "mpirun"

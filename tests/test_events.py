"""The event vocabulary: constructors, queries, and lines written whole or not at all."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from hpc_train import events
from hpc_train.rundir import RunPaths, read_jsonl
from hpc_train.runtime.faults import EVENTS_FAULT_ENV
from tests.conftest import REPO


def at(event: dict, t: float, **environ) -> dict:
    return events.stamped(event, environ=environ, now=t)


def test_every_event_is_documented_in_the_run_directory_contract():
    doc = (REPO / "docs" / "run-directory.md").read_text()
    assert [name for name in events.ALL if f"| `{name}` |" not in doc] == []


def test_stamped_events_carry_the_job_and_restart():
    record = at(events.stop_saved(10, "SIGUSR2"), 5.0, SLURM_JOB_ID="42", SLURM_RESTART_COUNT="2")
    assert record == {"time": 5.0, "event": "stop_saved", "job_id": "42", "restart": 2,
                      "step": 10, "reason": "SIGUSR2"}
    assert "job_id" not in at(events.stop_saved(10, "x"), 5.0)


def test_record_refuses_a_name_outside_the_vocabulary(tmp_path):
    paths = RunPaths(tmp_path)
    with pytest.raises(ValueError, match="not an event"):
        events.record(paths, {"event": "requeud"})
    with pytest.raises(ValueError, match="unknown finished status"):
        events.finished("requeued", "x", 0, 1.0)


def test_queries_answer_from_the_right_events():
    history = [
        at(events.submitted("7", "slurm", "h0"), 1.0),
        at(events.started(["n1"], 2, None, [], 300), 2.0),
        at(events.stop_saved(10, "SIGUSR2"), 3.0),
        at(events.requeued("SIGUSR2", events.CAUSE_STOP, "driver", "", 75, 1.0), 4.0),
        at(events.started(["n1"], 2, None, [], 300), 5.0),
        at(events.stop_saved(20, "deadline"), 6.0),
        at(events.spec_change_allowed("h0", "h1", ["optim.epochs"]), 7.0),
        at(events.resubmitted("8", "local"), 8.0),
    ]
    assert events.run_starts(history) == [2.0, 5.0]
    assert events.stop_reason_since(history, 5.0) == "deadline"
    assert events.stop_reason_since(history, 6.5) is None
    assert events.spec_changed_after(history, 6.5) and not events.spec_changed_after(history, 7.0)
    assert events.job_ids(history) == ["7", "8"]
    assert events.last_submission(history) == ("8", "local")
    assert events.state(history) == "PENDING"
    assert events.state([*history, at(events.finished("timeout", "x", None, 1.0), 9.0)]) == "TIMEOUT"


def test_a_restart_in_the_job_ends_a_run_but_not_the_jobs_segment():
    history = [
        at(events.started(["n1"], 2, None, [], 300), 1.0),
        at(events.restarted("ranks failed (mpirun exit 137)", events.CAUSE_FAILURE, 1, 2, 137, 5.0), 2.0),
        at(events.started(["n1"], 2, None, [], 300, launch=1), 3.0),
        at(events.requeued("SIGUSR2", events.CAUSE_STOP, "driver", "", 75, 1.0), 4.0),
        at(events.started(["n1"], 2, None, [], 300), 5.0),
    ]
    assert events.run_starts(history) == [1.0, 3.0, 5.0]           # every start of the ranks
    assert [e["time"] for e in events.job_starts(history)] == [1.0, 5.0]
    first = events.in_window(history, 1.0, 5.0)
    assert events.ending(first)["event"] == "restarted"
    assert events.job_ending(first)["event"] == "requeued"
    assert events.ending_words(events.ending(first)) == "restarted in the job (cause failure, 1 of 2)"
    assert not events.was_requeued(events.ending(first)) and not events.ended_by_stop(events.ending(first))


def test_try_record_survives_a_write_that_fails(tmp_path, monkeypatch):
    paths = RunPaths(tmp_path / "gone")             # no such directory: the write fails
    assert events.try_record(paths, events.stop_saved(1, "x")) is False
    # The test-only fault: every write fails, with the directory there.
    monkeypatch.setenv(EVENTS_FAULT_ENV, "1")
    with pytest.raises(OSError, match=EVENTS_FAULT_ENV):
        events.record(RunPaths(tmp_path), events.stop_saved(1, "x"))
    assert events.try_record(RunPaths(tmp_path), events.stop_saved(1, "x")) is False
    assert not (tmp_path / "events.jsonl").exists()


_FULL_DISK_WRITER = """
import os, resource, signal, sys
from pathlib import Path
from hpc_train import events
from hpc_train.rundir import RunPaths
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)      # past the limit: a short write, then EFBIG
paths = RunPaths(Path(sys.argv[1]))
events.record(paths, events.stop_saved(1, "first"))
size = paths.events.stat().st_size
resource.setrlimit(resource.RLIMIT_FSIZE, (size + 40, size + 40))
ok = events.try_record(paths, events.rank_failed(0, "x" * 10, "y" * 200))
print(ok, paths.events.stat().st_size == size)
"""


def test_a_line_that_does_not_fit_leaves_nothing_behind(tmp_path):
    out = subprocess.run([sys.executable, "-c", _FULL_DISK_WRITER, str(tmp_path)], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "True"]      # not written, and no torn half line
    assert [json.loads(line)["event"] for line in (tmp_path / "events.jsonl").read_text().splitlines()] \
        == ["stop_saved"]
    events.record(RunPaths(tmp_path), events.stop_saved(2, "after"))
    assert [e["step"] for e in read_jsonl(tmp_path / "events.jsonl")] == [1, 2]

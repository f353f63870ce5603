"""The run state: read tolerant of a missing or damaged file, updated whole under a lock, derived
from the events of a run made before it existed."""

from __future__ import annotations

import json
import logging
import subprocess
import sys

import pytest

from hpc_train import events, run_state
from hpc_train.run_state import RunState
from hpc_train.rundir import RunPaths, append_jsonl
from hpc_train.runtime.faults import EVENTS_FAULT_ENV
from tests.conftest import REPO


def test_a_run_without_a_state_starts_fresh_and_updates_are_kept(tmp_path):
    paths = RunPaths(tmp_path)
    assert run_state.read(paths) == RunState()
    run_state.update(paths, lambda s: s.with_retry(events.CAUSE_FAILURE))
    run_state.update(paths, lambda s: s.with_retry(events.CAUSE_STALL).with_consent("h0", "h1"))
    new = run_state.update(paths, lambda s: s.with_pipeline_cut([4, 2]).with_restart_in_job("stall"))
    assert run_state.read(paths) == new == RunState({"failure": 1, "stall": 1}, (("h0", "h1"),), (4, 2),
                                                    {"stall": 1})
    assert new.failed_runs() == 2 and new.allows("h0", "h1") and not new.allows("h1", "h0")
    assert RunState().with_retry(events.CAUSE_STOP).failed_runs() == 0   # stops spend no retry
    assert sorted(p.name for p in tmp_path.iterdir()) == [".state.lock", "state.json"]  # no temp


def test_consents_chain_across_resumes_whose_runs_saved_nothing():
    # A -> B (a resume with a change; its run died before a checkpoint), then B -> C: the
    # checkpoint still has spec A, and both changes were consented to.
    state = RunState().with_consent("A", "B").with_consent("B", "C").with_consent("X", "Y")
    assert state.allows("A", "B") and state.allows("A", "C") and state.allows("B", "C")
    assert not state.allows("C", "A") and not state.allows("A", "Y") and not state.allows(None, "B")
    assert RunState().with_consent(None, "B").allows(None, "B")     # a checkpoint with no spec hash


def test_keys_of_another_version_are_kept_by_an_update(tmp_path):
    paths = RunPaths(tmp_path)
    paths.run_state.write_text(json.dumps({"retries": {"node_failure": 2}, "later_key": 3}))
    run_state.update(paths, lambda s: s.with_retry(events.CAUSE_FAILURE))
    saved = json.loads(paths.run_state.read_text())
    assert saved["later_key"] == 3 and saved["retries"] == {"node_failure": 2, "failure": 1}


def _legacy_events(paths: RunPaths) -> None:
    for event in (events.pipeline_cut([4, 2], "time"),
                  events.requeued("r", events.CAUSE_STOP, "driver", "", 75, 1.0),
                  events.requeued("r", events.CAUSE_FAILURE, "driver", "", 1, 1.0),
                  events.spec_change_allowed("h0", "h1", ["optim.epochs"]),
                  events.requeued("r", events.CAUSE_STALL, "driver", "", 1, 1.0),
                  events.pipeline_cut([3, 3], "time")):
        append_jsonl(paths.events, events.stamped(event, environ={}))


def test_a_run_made_before_the_state_file_is_read_from_its_events_until_updated(tmp_path):
    paths = RunPaths(tmp_path)
    _legacy_events(paths)
    legacy = RunState({"failure": 1, "stall": 1}, (("h0", "h1"),), (4, 2))   # the first cut
    assert run_state.read(paths) == legacy
    run_state.update(paths, lambda s: s.with_consent("h1", "h2"))
    paths.events.unlink()                                     # from now on the file alone
    assert run_state.read(paths) == legacy.with_consent("h1", "h2")


@pytest.mark.parametrize("text", ["{\"retries\": {\"failure\": 1", "[1, 2]", "{\"retries\": [1]}",
                                  "{\"pipeline_cut\": \"ab\"}", "{\"consented_specs\": [1]}"])
def test_a_damaged_state_is_reported_and_replaced_by_the_next_update(tmp_path, caplog, text):
    paths = RunPaths(tmp_path)
    paths.run_state.write_text(text)
    with caplog.at_level(logging.WARNING, logger="hpc_train.run_state"):
        assert run_state.read(paths) == RunState()
    assert f"the run state {paths.run_state} is damaged" in caplog.text
    run_state.update(paths, lambda s: s.with_retry(events.CAUSE_FAILURE))
    assert run_state.read(paths) == RunState({"failure": 1})


def test_a_damaged_state_of_an_older_run_falls_back_to_its_events(tmp_path):
    paths = RunPaths(tmp_path)
    _legacy_events(paths)
    paths.run_state.write_bytes(b"\xff\x00")
    assert run_state.read(paths).failed_runs() == 2


_COUNTER = """
import sys
from pathlib import Path
from hpc_train import run_state
from hpc_train.rundir import RunPaths
paths = RunPaths(Path(sys.argv[1]))
sys.stdin.readline()                        # both processes start their updates together
for _ in range(int(sys.argv[2])):
    run_state.update(paths, lambda s: s.with_retry(sys.argv[3]))
"""


def test_concurrent_updates_from_two_processes_lose_nothing(tmp_path, monkeypatch):
    monkeypatch.setenv(EVENTS_FAULT_ENV, "1")     # the run state does not depend on the events
    counters = [subprocess.Popen([sys.executable, "-c", _COUNTER, str(tmp_path), "60", cause],
                                 cwd=REPO, stdin=subprocess.PIPE, text=True)
                for cause in (events.CAUSE_FAILURE, events.CAUSE_STALL)]
    for counter in counters:
        counter.stdin.write("go\n")
        counter.stdin.close()
    assert [counter.wait(timeout=120) for counter in counters] == [0, 0]
    assert run_state.read(RunPaths(tmp_path)).retries == {"failure": 60, "stall": 60}

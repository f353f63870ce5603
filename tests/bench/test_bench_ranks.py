"""A benchmark's ranks start and are supervised as a job's: results in rank order, a failed rank
and a hung one reported, not waited for."""

from __future__ import annotations

import pytest

from hpc_train.bench.ranks import run_here
from hpc_train.errors import LaunchError
from hpc_train.job.watchdog import process_state

pytestmark = pytest.mark.mpi
STUB = "tests.bench.stub_rank"


def test_the_ranks_results_come_back_in_rank_order(mpirun_argv):
    results = run_here("bench-test", STUB, {"do": "report"}, 3)
    assert [(r["rank"], r["size"]) for r in results] == [(0, 3), (1, 3), (2, 3)]
    assert len({r["port"] for r in results}) == 1        # the driver's rendezvous port, for all


def test_a_failed_rank_fails_the_benchmark(mpirun_argv):
    with pytest.raises(LaunchError, match=r"bench-test: the ranks failed \(exit \d+, 1/2 results\)"):
        run_here("bench-test", STUB, {"do": "fail"}, 2)


def test_the_watchdog_ends_ranks_that_stop_progressing(mpirun_argv, tmp_path):
    """The ranks hang for 120 s before any step, then would return their results: the
    watchdog's stall (start-up's bound: they never stepped) and no result say they were ended
    while hanging, not waited for; and none is left running."""
    stalled = r"no rank progressed for \d+ s \(launch.start_seconds=6\), 0/2 results"
    with pytest.raises(LaunchError, match=stalled):
        run_here("bench-test", STUB, {"do": "hang", "pids": str(tmp_path)}, 2,
                 {"launch": {"stall_seconds": 5, "start_seconds": 6}})
    pids = [int(path.read_text()) for path in tmp_path.glob("rank-*.pid")]
    assert len(pids) == 2 and not [pid for pid in pids if _running(pid)], pids


def _running(pid: int) -> bool:
    state = process_state(pid)            # None: gone; a zombie has ended too
    return state is not None and not state.startswith("Z")


"""parallel.horovod reaches the ranks: a 2-rank Horovod run started by the real driver and mpirun
logs the variables Horovod was given, and writes its timeline and autotune log into the run
directory."""

from __future__ import annotations

import ast
import re

import pytest

from tests.runs import describe_failure, drive, local_run

pytestmark = [pytest.mark.mpi, pytest.mark.horovod, pytest.mark.slow]


def test_knobs_reach_every_rank_and_the_timeline_lands_in_the_run_directory(tmp_path):
    paths = local_run(tmp_path, "optim.max_steps=6", "data.workers=1", "parallel.horovod.timeline=true",
                      "parallel.horovod.autotune=true", "parallel.horovod.cycle_time_ms=2.5",
                      "parallel.horovod.fusion_threshold_mb=16", name="knobs")
    assert drive(paths) == 0, describe_failure(paths)
    for rank in (0, 1):
        line = re.search(r"horovod 2 ranks, knobs (\{.*\})", paths.rank_log(rank).read_text()).group(1)
        knobs = ast.literal_eval(line)   # the dict as the rank logged it
        assert knobs == {"HOROVOD_FUSION_THRESHOLD": str(16 * 2**20), "HOROVOD_CYCLE_TIME": "2.5",
                         "HOROVOD_TIMELINE": str(paths.horovod_timeline()), "HOROVOD_AUTOTUNE": "1",
                         "HOROVOD_AUTOTUNE_LOG": str(paths.horovod_autotune_log()),
                         # One core per rank: the driver's few-core tuning (the cycle is the spec's).
                         "OMPI_MCA_mpi_yield_when_idle": "1"}
    timeline = paths.horovod_timeline().read_text()
    # Chrome trace events, one per line; Horovod leaves the array open (chrome://tracing and
    # Perfetto read it as it is).
    assert timeline.startswith("[") and '"NEGOTIATE_ALLREDUCE"' in timeline and '"ph": "X"' in timeline
    header = paths.horovod_autotune_log().read_text().splitlines()[0]
    assert "cycle_time_ms" in header and "tensor_fusion_threshold" in header

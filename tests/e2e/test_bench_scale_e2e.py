"""`bench scale` on the 8-node Slurm: its CI form at 2 nodes (every measurement once, about a
minute and a half here), the whole 2, 4, 8 on request (--heavy). Every figure measured (present
and positive), the stall named no sooner than its bound; nothing it submitted is left in the
queue. How fast is the benchmark's to report, not the test's to bound."""

from __future__ import annotations

import json
import subprocess

import pytest

from hpc_train.bench.scale import HEADER, STALL_SECONDS, Row
from hpc_train.doctor.nodes import JOB_NAME
from tests.runs import cli

pytestmark = [pytest.mark.slurm, pytest.mark.multinode, pytest.mark.slow]

# Every figure of a row: seconds, and the driver's CPU seconds per second.
FIGURES = [f.name for f in Row.__dataclass_fields__.values() if f.name != "nodes"]


def _bench(slurm_nodes, tmp_path, counts: str) -> dict:
    out = cli("bench", "scale", "--nodes", counts, "--out", str(tmp_path / "scale"), "--json",
              "--timeout", "240", env=slurm_nodes.env, timeout=1800)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    left = subprocess.run(["squeue", "-h", "-o", "%j"], capture_output=True, text=True, timeout=30,
                          env=slurm_nodes.env).stdout.split()
    assert not [name for name in left if name.startswith(("scale-", JOB_NAME))], left
    return json.loads(out.stdout)


def _assert_measured(document: dict, counts: list[int]) -> None:
    rows = document["rows"]
    assert [row["nodes"] for row in rows] == counts
    for row in rows:
        assert set(row) == {f.name for f in Row.__dataclass_fields__.values()}, row
        for name in FIGURES:
            assert isinstance(row[name], (int, float)) and row[name] > 0, (name, row)
        # Logic, not speed: the watchdog names a stall only once no rank progressed for its bound.
        assert row["stall_named"] >= STALL_SECONDS, row
    assert len(HEADER) == len(Row.__dataclass_fields__)


def test_bench_scale_at_two_nodes(slurm_nodes, tmp_path):
    _assert_measured(_bench(slurm_nodes, tmp_path, "2"), [2])


@pytest.mark.heavy
def test_bench_scale_at_two_four_and_eight_nodes(slurm_nodes, tmp_path):
    document = _bench(slurm_nodes, tmp_path, "2,4,8")
    _assert_measured(document, [2, 4, 8])
    print(json.dumps(document, indent=2))

"""`bench pipeline` runs real ranks and reports every (remat, M) row (timing itself is not asserted)."""

import json

import pytest

from hpc_train.bench.pipeline import render
from tests.runs import cli

TINY = ("--layers", "2", "--dim", "32", "--heads", "2", "--seq-len", "16", "--batch", "8",
        "--steps", "2", "--warmup", "1")


def _auto_cut(**sizes) -> list[int]:
    """The stage sizes balance "auto" (by parameter count, deterministic) gives for 2 stages."""
    from hpc_train.models.gpt import gpt
    from hpc_train.parallel.pipeline.balance import balance_blocks
    from hpc_train.parallel.pipeline.stage import parameter_costs

    seq_len = sizes.pop("seq_len")
    return balance_blocks(parameter_costs(gpt(256, seq_len=seq_len, **sizes)), 2)


@pytest.mark.mpi
@pytest.mark.slow
def test_bench_pipeline_reports_bubble_and_memory_per_stage(mpirun_argv, capsys):
    out = cli("bench", "pipeline", *TINY, "--device", "cpu", "--json", timeout=300)
    assert out.returncode == 0, out.stderr
    report = json.loads(out.stdout)
    rows = report["rows"]
    assert [(r["remat"], r["microbatches"]) for r in rows] == [
        (remat, m) for remat in (False, True) for m in (1, 2, 4, 8)]
    assert report["settings"]["blocks_per_stage"] == _auto_cut(layers=2, dim=32, heads=2, seq_len=16)
    for row in rows:
        m = row["microbatches"]
        assert row["formula"] == 1 / (m + 1)                    # (K-1)/(M+K-1), K = 2
        assert row["micro_batch"] == 8 // m
        assert [s["stage"] for s in row["stages"]] == [0, 1]
        assert row["step_s"] >= row["schedule_s"] > 0
        for stage in row["stages"]:
            assert 0 <= stage["bubble"] < 1                     # busy time lies inside the schedule
            assert stage["peak_saved_bytes"] > 0
        assert row["bubble"] == pytest.approx(sum(s["bubble"] for s in row["stages"]) / 2)
    # Memory is deterministic: remat keeps only block inputs, far less on every stage, every M.
    plain = {r["microbatches"]: r for r in rows if not r["remat"]}
    for row in (r for r in rows if r["remat"]):
        for with_remat, without in zip(row["stages"], plain[row["microbatches"]]["stages"]):
            assert with_remat["peak_saved_bytes"] < without["peak_saved_bytes"]
    check = report["check"]
    assert check["max_abs_difference"] == pytest.approx(
        max(abs(r["difference"]) for r in rows if r["microbatches"] >= 4))
    assert check["within"] == (check["max_abs_difference"] <= 0.10)

    render(report, tty=False)                                   # Markdown: header, rule, every row
    table = [line for line in capsys.readouterr().out.splitlines() if line.startswith("|")]
    assert table[0].startswith("| remat | M | step ms | schedule ms | bubble | formula | diff |")
    assert len(table) == 2 + len(rows)


def test_bench_pipeline_refuses_a_batch_that_micro_batches_do_not_divide():
    out = cli("bench", "pipeline", "--batch", "6", "--microbatches", "1,4")
    assert out.returncode == 1
    assert "--batch 6 does not split into [4] equal micro-batches" in out.stderr

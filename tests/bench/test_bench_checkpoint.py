"""`bench checkpoint` runs and reports both sides of its ratio (timing itself is not asserted)."""

import json

import pytest

from tests.runs import cli


@pytest.mark.slow
def test_bench_checkpoint_reports_ours_and_baselines(tmp_path):
    out = cli("bench", "checkpoint", "--model", "resnet_tiny", "--rounds", "2", "--dir", str(tmp_path),
              "--json")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["rounds"] == 2 and result["model"] == "resnet_tiny"
    for key in ("sync_s", "async_blocked_s", "async_total_s", "bare_torch_save_s",
                "bare_torch_save_fsync_s", "loop_rate_while_writing"):
        assert result[key] > 0
    assert result["async_blocked_s"] <= result["async_total_s"]
    for ours, ratio in (("sync_s", "sync_vs_bare"), ("async_blocked_s", "async_blocked_vs_bare"),
                        ("async_total_s", "async_total_vs_bare")):
        # Ratios come from the unrounded medians; the times are rounded to 4 places (and a tiny
        # model's save takes milliseconds): allow for that rounding and the ratio's own.
        bare = result["bare_torch_save_s"]
        assert result[ratio] == pytest.approx(result[ours] / bare, rel=0.01,
                                              abs=0.00005 * (1 + result[ours] / bare) / bare + 0.0005)
    assert list(tmp_path.iterdir()) == []            # the benchmark cleans up after itself


@pytest.mark.slow
@pytest.mark.mpi
def test_bench_checkpoint_sharded_reports_every_ranks_part_and_rank_0_alone(tmp_path):
    out = cli("bench", "checkpoint", "--sharded", "--ranks", "2", "--rounds", "2", "--dir",
              str(tmp_path), "--json", timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout)
    assert (result["ranks"], result["rounds"], result["spec"]) == (2, 2, "jobs/transformer_zero_cpu.yaml")
    assert result["model_options"] == {"layers": 4, "dim": 64, "heads": 4}    # the spec's GPT
    assert len(result["part_s_per_rank"]) == 2 and min(result["part_s_per_rank"]) > 0
    assert result["part_slowest_s"] == max(result["part_s_per_rank"])
    assert 0 < result["part_slowest_s"] <= result["sharded_complete_s"]       # the part, then the rest
    assert result["whole_bare_fsync_s"] > 0 and result["whole_sync_s"] > 0
    assert result["state_mb"] > 0
    assert list(tmp_path.iterdir()) == []

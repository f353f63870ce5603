"""The signature table and its matcher (pure), against recorded samples and small inputs."""

from __future__ import annotations

from pathlib import Path

import pytest

from hpc_train.inspect.signatures import SIGNATURES, match_signatures, missing_ranks

SAMPLES = Path(__file__).parent / "samples"


def ids(lines, source="x") -> list[str]:
    return [m.signature.id for m in match_signatures((source, line) for line in lines)]


@pytest.mark.parametrize("sample, expected", [
    ("cuda_oom.log", "cuda_oom"), ("nccl_timeout.log", "collective_timeout"),
    ("node_failure.out", "node_failure"), ("preemption.out", "slurm_preemption"),
    ("slurm_oom_kill.out", "cpu_oom")])
def test_recorded_samples_match_exactly_their_signature(sample, expected):
    assert ids((SAMPLES / sample).read_text().splitlines()) == [expected]


def test_every_signature_has_a_fix_and_a_unique_id():
    assert len({s.id for s in SIGNATURES}) == len(SIGNATURES)
    assert all(s.fix and s.patterns and s.title for s in SIGNATURES)


def test_first_occurrence_of_each_signature_in_order_with_its_source():
    found = match_signatures([("a.log", "ordinary line"), ("b.log", "boom: Connection closed by peer [::1]"),
                              ("c.log", "DataError: /x/shard-00001.h5: cannot open as a shard: bad"),
                              ("d.log", "again: Connection closed by peer"), ("sacct", "State=TIMEOUT")])
    assert [(m.signature.id, m.source) for m in found] == [
        ("connection_closed", "b.log"), ("corrupt_shard", "c.log"), ("slurm_time_limit", "sacct")]


def test_ordinary_training_lines_match_nothing():
    assert ids(["2026-11-29 18:18:07,555 rank 0 hpc_train.trainer INFO step 20/92 loss 1.4 219 img/s",
                "rank 1 done", "resumed from step 92", "checkpoint saved: step 50 (periodic)"]) == []


def test_missing_ranks_reads_horovods_stall_warning():
    text = ["[2026-11-29 18:55:05.908484: W stall_inspector.cc:107] One or more tensors ...",
            "Missing ranks:", "1: [allreduce.noname.230]", "3: [allreduce.noname.230, broadcast.x]",
            "2026-11-29 18:55:06,000 rank 0 later 5: [not a rank list]"]
    assert missing_ranks(text) == [1, 3]
    assert missing_ranks(["1: [allreduce.a]"]) == []          # only under the heading

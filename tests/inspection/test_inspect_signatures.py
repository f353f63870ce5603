"""The signature table and its matcher (pure), against recorded samples and small inputs."""

from __future__ import annotations


import pytest

from hpc_train.inspection.signatures import SIGNATURES, match_signatures, missing_ranks
from tests.conftest import REPO

SAMPLES = REPO / "tests" / "samples"


def ids(lines, source="x") -> list[str]:
    return [m.signature.id for m in match_signatures((source, line) for line in lines)]


@pytest.mark.parametrize("sample, expected", [
    ("cuda_oom.log", "cuda_oom"), ("nccl_timeout.log", "collective_timeout"),
    ("node_failure.out", "node_failure"), ("preemption.out", "slurm_preemption"),
    ("slurm_oom_kill.out", "cpu_oom"), ("enospc_checkpoint.log", "disk_full"),
    ("corrupt_shard_worker.log", "corrupt_shard")])
def test_recorded_samples_match_exactly_their_signature(sample, expected):
    assert ids((SAMPLES / sample).read_text().splitlines()) == [expected]


@pytest.mark.parametrize("lines", [
    ["ORTE has lost communication with a remote daemon.", "  Remote daemon: [[4,0],1] on node hpcn2"],
    ["srun: error: Node failure on hpcn2", "srun: error: hpcn2: tasks 1: Killed"],
    ["node_lost: hpcn2 (Slurm shows hpcn2 ALLOCATED+NOT_RESPONDING)"],
])
def test_a_dead_node_is_a_node_failure_not_a_launch_problem(lines):
    assert ids(lines) == ["node_failure"]
    assert ids(["An ORTE daemon has unexpectedly failed after launch"]) == ["mpi_launch"]


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
    # A rank a few seconds late at step 1 on a loaded node, then rank 1 stalled: the last says.
    earlier = ["Missing ranks:", "0: [allreduce.noname.4]", "step 2 ..."]
    assert missing_ranks(earlier + ["Missing ranks:", "1: [allreduce.noname.30]"]) == [1]


def test_a_full_disk_during_a_checkpoint_save_is_disk_full_with_a_fix():
    # Recorded: torch.save into an open file on a device that answers ENOSPC.
    [found] = match_signatures(("rank-00000.log", line)
                               for line in (SAMPLES / "enospc_checkpoint.log").read_text().splitlines())
    assert found.signature.id == "disk_full" and found.signature.title == "disk full (ENOSPC)"
    assert found.line == "OSError: [Errno 28] No space left on device"
    for words in ("free space", "checkpoint.keep_last", "run.root"):
        assert words in found.signature.fix
    assert ids(["errno 28 in prose", "saved 28 MB"]) == []


def test_a_corrupt_shard_names_its_file_and_code_lines_of_a_traceback_never_match():
    lines = (SAMPLES / "corrupt_shard_worker.log").read_text().splitlines()
    [found] = match_signatures(("rank-00001.log", line) for line in lines)
    assert found.line.startswith("hpc_train.errors.DataError: /scratch/demo-shards/train/shard-00001.h5: "
                                 "cannot open as a shard: Unable to synchronously open file (truncated")
    assert found.file == "/scratch/demo-shards/train/shard-00001.h5"
    # The source line under a frame quotes the message's format, not a message: no match there.
    frame = ['  File "/w/hpc_train/data/shard_dataset.py", line 145, in _shard',
             '    raise DataError(f"{self.files[k]}: cannot open as a shard: {exc}") from None']
    assert ids(frame) == [] and ids(frame[1:]) == ["corrupt_shard"]
    decode = ("hpc_train.errors.DataError: /d/train/shard-00003.h5 record 7 (global index 99, key "
              "n01/x.JPEG): cannot decode: OSError: x")
    record = match_signatures([("r", decode)])
    assert record[0].file == "/d/train/shard-00003.h5"
    assert match_signatures([("r", "Connection closed by peer")])[0].file is None


def test_the_drivers_watchdog_line_is_a_stall():
    line = ("2026-11-30 08:20:01,004 driver ERROR watchdog: no rank progressed for 61 s "
            "(launch.stall_seconds=60); stalled: rank 1 on vm pid 4242 step 3 (no heartbeat for 61 s: "
            "the process is not running, state T (stopped))")
    [found] = match_signatures([("local_0_log.err", line)])
    assert found.signature.id == "rank_stalled" and found.signature.title == "a rank stopped progressing"
    assert found.signature.fix.startswith("the driver tore the ranks down and started them again from "
                                          "the last checkpoint")

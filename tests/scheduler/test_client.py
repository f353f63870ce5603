"""The Slurm client's calls: the retry policy for a controller briefly unreachable (what is sent
again and what never is), the bound on every call, and the real Slurm's answers (marked slurm)."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from hpc_train import scheduler
from hpc_train.errors import SubmitError

FIXTURES = Path(__file__).parent / "fixtures" / "22.05"


@pytest.fixture
def fake(tmp_path, monkeypatch):
    """fake(name, *replies): a stand-in Slurm command answering one reply per call (the last one
    repeats); a reply is (exit status, stdout, stderr). Returns how many times it was called."""
    monkeypatch.setattr(scheduler, "PAUSE", 0.01)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")

    def make(name: str, *replies: tuple[int, str, str]):
        count = tmp_path / f"{name}.calls"
        count.unlink(missing_ok=True)
        lines = ["#!/bin/sh", f'n=$(($(cat {count} 2>/dev/null || echo 0) + 1)); echo $n > {count}']
        for index, (status, out, err) in enumerate(replies, 1):
            test = "true" if index == len(replies) else f'[ "$n" -eq {index} ]'
            lines.append(f"if {test}; then printf '%s' '{out}'; printf '%s' '{err}' >&2; exit {status}; fi")
        (bin_dir / name).write_text("\n".join(lines) + "\n")
        (bin_dir / name).chmod(0o755)
        return lambda: int(count.read_text()) if count.exists() else 0
    return make


ROW = "30|RUNNING|None|0:02|N/A|1|vm\n"
UNREACHABLE = "squeue: error: Unable to contact slurm controller (connect failure)"


def test_a_query_is_asked_again_while_the_controller_is_unreachable(fake):
    calls = fake("squeue", (1, "", UNREACHABLE), (1, "", "Socket timed out on send/recv operation"), (0, ROW, ""))
    assert [j.job_id for j in scheduler.queue(["30"])] == ["30"] and calls() == 3


def test_a_real_refusal_is_not_asked_again(fake):
    calls = fake("squeue", (1, "", "slurm_load_jobs error: Invalid job id specified"))
    assert scheduler.queue(["30"]) == [] and calls() == 1
    calls = fake("sacct", (1, "", "sacct: error: Problem talking to the database"))
    assert scheduler.accounted(["30"]) is None and calls() == 1


def test_sbatch_is_sent_again_only_when_it_never_reached_slurm(fake):
    parsable = (FIXTURES / "sbatch_parsable.txt").read_text()
    calls = fake("sbatch", (1, "", "sbatch: error: " + UNREACHABLE[15:]), (0, parsable, ""))
    assert scheduler.submit(["x.sh"], "the test job") == "24" and calls() == 2
    fake("sbatch", (0, "123;cluster2\n", ""))
    assert scheduler.submit(["x.sh"], "the test job") == "123"
    fake("sbatch", (0, "", ""))
    with pytest.raises(SubmitError, match="sbatch refused the test job: exit 0"):
        scheduler.submit(["x.sh"], "the test job")
    calls = fake("sbatch", (1, "", "sbatch: error: Socket timed out on send/recv operation"))
    with pytest.raises(SubmitError, match="may have been submitted all the same") as refused:
        scheduler.submit(["y.sh"], "the test job")
    assert calls() == 1 and "sbatch refused the test job: sbatch: error: Socket timed out" in str(refused.value)
    fake("sbatch", (1, "", "sbatch: error: invalid partition specified: nope"))
    with pytest.raises(SubmitError) as refused:
        scheduler.submit(["--partition=nope", "y.sh"], "the test job")
    assert str(refused.value) == "sbatch refused the test job: sbatch: error: invalid partition specified: nope"


def test_every_call_is_bounded_retries_included(fake, tmp_path):
    """A squeue that would answer (nothing) only after 30 s: the call gives up at its bound, the
    one try killed there (it never answered: None, not []) and none sent after it, since the
    bound covers the tries and their pauses together."""
    fake("squeue", (0, "", ""))
    started = tmp_path / "squeue.pids"
    (Path(os.environ["PATH"].split(os.pathsep)[0]) / "squeue").write_text(
        f"#!/bin/sh\necho $$ >> {started}\nexec sleep 30\n")
    assert scheduler.queue(["30"], timeout=1.5) is None
    [pid] = [int(line) for line in started.read_text().split()]
    with pytest.raises(ProcessLookupError):     # killed at the bound, not waited for
        os.kill(pid, 0)


def test_commands_and_small_answers(fake, monkeypatch, tmp_path):
    fake("scancel", (0, "", ""))
    assert scheduler.cancel(["30"]) is None and scheduler.cancel([]) is None
    fake("scancel", (1, "", "scancel: error: Invalid job id 31"))
    assert scheduler.cancel(["31"]) == "scancel: error: Invalid job id 31"
    fake("sinfo", (0, "debug* up 1 idle\ngpu up 2 mixed\n", ""))
    assert scheduler.partitions() == (["debug* up 1 idle", "gpu up 2 mixed"], None)
    fake("sinfo", (0, (FIXTURES / "sinfo_memory.txt").read_text() + "3000+\n", ""))
    assert scheduler.smallest_memory("debug") == 3000
    fake("scontrol", (0, (FIXTURES / "scontrol_ping.txt").read_text(), ""))
    assert scheduler.controller_problem({}) is None
    assert scheduler.controller_problem({"SLURM_CONF": str(tmp_path / "none")}).endswith("is not a file")
    fake("squeue", (0, "30|RUNNING|None|0:02|2026-12-01T15:17:33|1|vm\n", ""))
    assert scheduler.job_end_time("30", {"SLURM_JOB_END_TIME": "123"}) == 123.0
    assert scheduler.job_end_time("30", {}) is not None
    assert scheduler.installed()
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert not scheduler.installed()
    assert scheduler.partitions() == ([], "sinfo not on PATH")


@pytest.mark.slurm
def test_the_real_slurm_through_the_client(slurm_cluster, tmp_path):
    # It runs until cancelled (its limit, too, far beyond the test): RUNNING, then CANCELLED.
    job = scheduler.submit(["--time=5", "--mem=100", f"--output={tmp_path}/out", "--wrap", "sleep 600"],
                           "the client's test job")
    slurm_cluster.job_ids.append(job)
    deadline = time.monotonic() + 300          # catches a hang: the shared cluster may queue it
    while (live := scheduler.live_state(job)) is None or live.state != "RUNNING":
        assert time.monotonic() < deadline, f"job {job}: {live}"
        time.sleep(1)
    shown = scheduler.show_job(job)
    assert (shown.job_id, shown.state, shown.restarts, shown.node_count) == (job, "RUNNING", 0, 1)
    assert scheduler.job_end_time(job, {}) > time.time()
    assert scheduler.cancel([job]) is None and scheduler.cancel([job]) is None    # safe to repeat
    slurm_cluster.wait_state(job, {"CANCELLED"})
    assert scheduler.live_state(job).state in ("CANCELLED", "COMPLETING")

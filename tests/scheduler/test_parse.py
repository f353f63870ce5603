"""The Slurm client's parsers on recorded outputs of two Slurm generations: fixtures/22.05 recorded
on this machine (record_fixtures.sh), fixtures/24.11 and 25.11 transcribed from Slurm's sources
and manuals (their READMEs say from where). Arrays, requeued and multi-node jobs, unknown fields
and an unknown state included."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path


from hpc_train.job.requeue import requeue_path
from hpc_train.scheduler import FAILED_STATES, JobState, accounting
from hpc_train.scheduler.parse import (array_tasks, job_state, parse_duration, parse_sacct,
                                       parse_show_job, parse_squeue, parse_time)

FIXTURES = Path(__file__).parent / "fixtures"


def read(name: str) -> str:
    return (FIXTURES / name).read_text()


def at(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def test_times_and_durations_in_every_form_slurm_prints_or_reads():
    assert parse_time("2026-11-29T17:05:00\n") == at("2026-11-29T17:05:00")
    assert [parse_time(t) for t in ("N/A", "Unknown", "None", "")] == [None] * 4
    printed = ("1-02:03:04", "02:03:04", "03:04", "5:03", "00:00.002", "00:10:00.250", "100:00")
    assert [parse_duration(t) for t in printed] == [93784, 7384, 184, 303, 0.002, 600.25, 6000]
    assert [parse_duration(t) for t in ("45", "1-02", "1-02:30")] == [2700, 93600, 95400]  # a bare number: minutes
    assert [parse_duration(t) for t in ("UNLIMITED", "INVALID", "Unknown", "N/A", "Partition_Limit", "",
                                        "45.123", "1:60:00", "1-24", "30\n")] == [None] * 10


def test_states_ids_and_small_answers():
    assert job_state("CANCELLED by 0") is job_state("CANCELLED+") is JobState.CANCELLED
    assert job_state("") is job_state("RECONFIGURING") is JobState.UNKNOWN
    assert array_tasks("42_[0-1]") == ["42_0", "42_1"] and array_tasks("42_3") == ["42_3"]
    assert array_tasks("42_[1-3,5]%2") == array_tasks("42_[1-3,5%2]") == ["42_1", "42_2", "42_3", "42_5"]
    assert array_tasks("821+0") == ["821+0"]


def test_scontrol_show_job_22_05_through_a_requeue():
    running = parse_show_job(read("22.05/scontrol_show_job_running.txt"))
    assert (running.job_id, running.state, running.restarts, running.nodes) == ("30", "RUNNING", 0, "vm")
    completing = parse_show_job(read("22.05/scontrol_show_job_requeued_completing.txt"))
    assert (completing.state, completing.restarts) == ("COMPLETING", 1)
    assert requeue_path(running, 0) == "driver" and requeue_path(completing, 0) == "slurm"
    pending = parse_show_job(read("22.05/scontrol_show_job_requeued_pending.txt"))
    assert (pending.state, pending.reason, pending.restarts, pending.nodes) == ("PENDING", "BeginTime", 1, "")
    assert pending.state.active and pending.end_time == at("2026-12-01T15:17:46")
    done = parse_show_job(read("22.05/scontrol_show_job_requeued_done.txt"))
    assert (done.state, done.restarts, done.elapsed, done.reason) == ("COMPLETED", 1, 6.0, "")
    failed = parse_show_job(read("22.05/scontrol_show_job_failed.txt"))
    assert (failed.state, failed.exit_code, failed.reason) == ("FAILED", "3:0", "NonZeroExitCode")
    task = parse_show_job(read("22.05/scontrol_show_job_array_task_pending.txt"))
    assert (task.job_id, task.state, task.reason, task.end_time) == ("27_3", "PENDING", "JobArrayTaskLimit", None)
    assert parse_show_job(read("22.05/scontrol_show_job_array_task.txt")).job_id == "26_1"
    assert parse_show_job("slurm_load_jobs error: Invalid job id specified") is None


def test_scontrol_show_job_of_newer_releases():
    job = parse_show_job(read("24.11/scontrol_show_job_multinode_requeued.txt"))
    assert (job.state, job.restarts, job.node_count, job.nodes) == ("RUNNING", 2, 2, "gpu[01-02]")
    assert job.elapsed == 93784 and job.end_time == at("2025-03-03T09:00:12")
    het = parse_show_job(read("24.11/scontrol_show_job_het_pending.txt"))
    assert (het.job_id, het.state, het.reason, het.node_count) == ("821", "PENDING", "Resources", None)
    expedited = parse_show_job(read("25.11/scontrol_show_job_expedited.txt"))
    assert (expedited.state, expedited.restarts) == (JobState.EXPEDITING, 1) and expedited.state.active
    # the man page's form without -o: one field group per line
    manual = ("JobId=71701 Name=hostname\n   UserId=da(1000) GroupId=da(1000)\n"
              "   JobState=COMPLETED Reason=None Dependency=(null)\n"
              "   TimeLimit=UNLIMITED Requeue=1 Restarts=0 BatchFlag=0 ExitCode=0:0\n"
              "   NodeList=snowflake0\n")
    assert parse_show_job(manual).state == "COMPLETED" and parse_show_job(manual).nodes == "snowflake0"


def test_squeue_rows_of_both_generations():
    old = {j.job_id: j for j in parse_squeue(read("22.05/squeue_live.txt"))}
    assert set(old) == {"27_2", "27_3", "29", "30"}
    assert (old["27_2"].state, old["27_2"].reason, old["27_2"].end_time) == ("PENDING", "JobArrayTaskLimit", None)
    assert (old["30"].state, old["30"].elapsed, old["30"].nodes, old["30"].source) == ("RUNNING", 2, "vm", "squeue")
    assert old["29"].reason == "BeginTime" and old["29"].end_time == at("2026-12-01T16:17:17")
    [grouped] = [j for j in parse_squeue(read("22.05/squeue_live_unexpanded.txt")) if "[" in j.job_id]
    assert array_tasks(grouped.job_id) == ["27_2", "27_3"]
    [requeued] = parse_squeue(read("22.05/squeue_requeued.txt"))
    assert (requeued.state, requeued.reason) == ("PENDING", "BeginTime")
    new = {j.job_id: j for j in parse_squeue(read("24.11/squeue_live.txt"))}
    assert (new["812"].elapsed, new["812"].node_count, new["812"].nodes) == (93784, 2, "gpu[01-02]")
    assert new["821+1"].state == "PENDING" and array_tasks("815_[4-7%2]") == ["815_4", "815_5", "815_6", "815_7"]
    assert new["831"].state == "COMPLETING" and new["831"].state.active


def test_sacct_rows_of_both_generations():
    old = {j.job_id: j for j in parse_sacct(read("22.05/sacct_jobs.txt"))}
    assert (old["25"].state, old["25"].exit_code) == ("FAILED", "3:0") and old["25"].state in FAILED_STATES
    assert (old["29"].state, old["29"].word, old["29"].nodes) == ("CANCELLED", "CANCELLED", "")
    assert (old["30"].state, old["30"].elapsed, old["24"].state) == ("COMPLETED", 6, "REQUEUED")
    assert [j.job_id for j in parse_sacct(read("22.05/sacct_jobs.txt"))].count("27_3") == 1
    [never] = parse_sacct(read("22.05/sacct_jobs_array_never_started.txt"))
    assert (never.job_id, never.state) == ("35", "CANCELLED")
    rows = parse_sacct(read("24.11/sacct_jobs.txt"))
    assert [j.state for j in rows if j.job_id == "812"] == ["REQUEUED", "RUNNING"]    # the last is current
    new = {j.job_id: j for j in rows}
    assert {new[i].state for i in ("815_2", "823", "824")} == {"OUT_OF_MEMORY", "TIMEOUT", "NODE_FAIL"}
    assert new["822"].state == "CANCELLED" and new["823"].exit_code == "0:15"


def test_accounting_segments_of_both_generations():
    old = accounting.parse_segments(read("22.05/sacct_segments.txt"))
    first, second = [s for s in old if s.job_id == "30"]
    assert (first.state, second.state, first.elapsed, second.elapsed) == ("REQUEUED", "COMPLETED", 2, 6)
    assert [s.name for s in second.steps] == ["batch", "0"] and second.req_mem == 100 * 1024 ** 2
    assert "29" not in {s.job_id for s in old}                 # cancelled while pending: never started
    new = accounting.parse_segments(read("24.11/sacct_segments.txt"))
    assert [s.job_id for s in new] == ["812", "812"]           # pending het components never started
    before, now = new
    assert (before.gpus, before.nodes, before.req_mem) == (8, 2, 32 * 1024 ** 3)
    assert before.max_rss == 5123456 * 1024 and [s.name for s in before.steps] == ["batch", "extern"]
    assert now.end is None and now.total_cpu == 86400 and now.max_rss == 30 * 1024 ** 3


def test_unknown_states_and_fields_read_clearly():
    rows = {j.job_id: j for j in parse_squeue(read("25.11/squeue_live.txt"))}
    assert rows["9001"].state is JobState.EXPEDITING and rows["9001"].label == "EXPEDITING"
    unknown = rows["9002"]
    assert unknown.state is JobState.UNKNOWN and not unknown.state.active
    assert unknown.label == "UNKNOWN (RECONFIGURING: a state this hpc_train does not know)"
    assert rows["9003"].state == "RUNNING" and rows["9003"].elapsed == 3 * 3600 + 121  # extra cell ignored
    odd = parse_show_job("JobId=5 JobState=WEIRD Restarts=many NumNodes=? RunTime=soon\n")
    assert (odd.state, odd.restarts, odd.node_count, odd.elapsed) == (JobState.UNKNOWN, 0, None, None)
    assert "WEIRD" in odd.label
    assert parse_sacct("sacct: error: Problem talking to the database\n") == []
    assert parse_squeue("squeue: error: Invalid user\n") == []

"""What a preemption does to a job, from scontrol's own words (pure; the real cluster's answer in
tests/doctor/test_doctor.py's doctor run and tests/e2e/test_preemption_e2e.py)."""

from __future__ import annotations

from hpc_train.scheduler.policy import Preemption, for_partition, parse_preemption, preemption_words

CONFIG = """Configuration data as of 2026-12-06T22:20:01
KillWait                = 5 sec
PreemptMode             = REQUEUE
PreemptType             = preempt/partition_prio
PreemptExemptTime       = 00:00:00
"""
PARTITIONS = (
    "PartitionName=debug AllowGroups=ALL Default=YES QoS=N/A GraceTime=30 Hidden=NO MaxNodes=UNLIMITED "
    "Nodes=hpcn[1-8] PriorityJobFactor=1 PriorityTier=1 PreemptMode=REQUEUE State=UP TotalCPUs=16\n"
    "PartitionName=urgent AllowGroups=ALL Default=NO QoS=N/A GraceTime=0 Hidden=NO "
    "Nodes=hpcn[1-8] PriorityJobFactor=1 PriorityTier=2 PreemptMode=OFF State=UP TotalCPUs=16\n")


def test_each_partition_with_the_clusters_settings():
    debug, urgent = parse_preemption(CONFIG, PARTITIONS)
    assert debug == Preemption("debug", "preempt/partition_prio", "REQUEUE", 30.0, 5.0, 1, True)
    assert urgent.mode == "OFF" and not urgent.configured and urgent.tier == 2 and not urgent.default
    assert for_partition([debug, urgent], None) is debug
    assert for_partition([debug, urgent], "urgent") is urgent
    assert for_partition([debug, urgent], "gpu") is None


def test_a_cluster_without_preemption():
    [plain] = parse_preemption("KillWait = 30 sec\nPreemptMode = OFF\nPreemptType = preempt/none\n",
                               "PartitionName=batch Default=YES GraceTime=0 State=UP\n")
    assert not plain.configured
    assert preemption_words(plain) == "partition batch: no preemption (PreemptMode OFF); KillWait 30 s"


def test_the_words_set_the_runs_longest_save_against_what_slurm_allows():
    debug = parse_preemption(CONFIG, PARTITIONS)[0]
    assert preemption_words(debug) == ("partition debug: PreemptMode REQUEUE (preempt/partition_prio), "
                                       "GraceTime 30 s, KillWait 5 s")
    assert preemption_words(debug, 1.25).endswith("longest save took 1.2 s, within the grace")
    assert "longer than the grace" in preemption_words(debug, 45.0)
    no_grace = Preemption("p", "preempt/qos", "CANCEL", 0.0, 5.0)
    assert "longer than KillWait" in preemption_words(no_grace, 6.0)

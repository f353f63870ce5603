"""A node's death told from a fault of the code (pure): from the launcher's words and Slurm's
view of the allocation's nodes; and `scontrol show node` read."""

from __future__ import annotations

import pytest

from hpc_train.job.node_fault import NodeFault, node_fault
from hpc_train.scheduler.parse import node_lost, parse_show_nodes

# Open MPI 4.1's report (help-errmgr-base.txt, node-died) after a node crash on the 2-node cluster.
ORTE_LOST = ["--------------------------------------------------------------------------",
             "ORTE has lost communication with a remote daemon.",
             "",
             "  HNP daemon   : [[47601,0],0] on node hpcn1",
             "  Remote daemon: [[47601,0],1] on node hpcn2",
             "",
             "This is usually due to either a failure of the TCP network"]
RANK_RAISED = ["Primary job  terminated normally, but 1 process returned",
               "mpirun detected that one or more processes exited with non-zero status, thus "
               "causing the job to be terminated. The first process to do so was:",
               "  Process name: [[47601,1],1]", "  Exit code:    1"]
UP = {"hpcn1": "ALLOCATED", "hpcn2": "MIXED"}


@pytest.mark.parametrize("returncode, lines, states, expected", [
    (1, RANK_RAISED, UP, None),                                         # the code's
    (137, [], UP, None),                     # the watchdog tore a stalled rank down: the code's
    (205, [], UP, None),                              # a rank may exit 205 itself: no evidence
    (137, ["srun: error: hpcn2: task 1: Killed"], UP, None),            # a killed task: the code's
    (205, ORTE_LOST, UP, NodeFault(("hpcn2",), "mpirun lost its daemon on hpcn2")),
    (205, ORTE_LOST[:2], {}, NodeFault((), "mpirun lost a remote daemon (exit 205)")),
    (1, ["srun: error: Node failure on hpcn2", "srun: error: hpcn2: tasks 1: Killed"], {},
     NodeFault(("hpcn2",), "srun reported a node failure on hpcn2")),
    # Slurm's view wins, and names every lost node
    (205, ORTE_LOST, {"hpcn1": "ALLOCATED", "hpcn2": "MIXED*"},
     NodeFault(("hpcn2",), "Slurm shows hpcn2 MIXED*")),
    (1, RANK_RAISED, {"hpcn1": "DOWN+NOT_RESPONDING", "hpcn3": "ALLOCATED+NOT_RESPONDING"},
     NodeFault(("hpcn1", "hpcn3"), "Slurm shows hpcn1 DOWN+NOT_RESPONDING, hpcn3 ALLOCATED+NOT_RESPONDING")),
])
def test_node_fault(returncode, lines, states, expected):
    assert node_fault(returncode, lines, states) == expected


def test_a_node_whose_slurmd_accepts_no_connection_died_before_slurm_says_so():
    # srun waits for slurmctld, which marks a crashed node only after its SlurmdTimeout: until
    # then the watchdog sees a rank that stopped beating, and the probe names its node.
    assert node_fault(137, [], UP, ("hpcn2",)) == NodeFault(("hpcn2",), "slurmd on hpcn2 accepts no connection")
    # the launcher's own words name it first; Slurm's view before both
    assert node_fault(205, ORTE_LOST, UP, ("hpcn2",)).why == "mpirun lost its daemon on hpcn2"
    assert node_fault(1, [], {"hpcn2": "DOWN*"}, ("hpcn2",)).why == "Slurm shows hpcn2 DOWN*"


@pytest.mark.parametrize("state, lost", [
    ("IDLE", False), ("ALLOCATED", False), ("MIXED+DRAIN", False), ("COMPLETING", False),
    ("IDLE*", True), ("ALLOCATED+NOT_RESPONDING", True), ("DOWN", True), ("DOWN*+DRAIN", True),
    ("ALLOCATED+FAIL", True), ("MIXED+FAILING", True),
])
def test_node_lost_reads_slurms_state_flags(state, lost):
    assert node_lost(state) is lost


def test_parse_show_nodes():
    text = ("NodeName=hpcn1 Arch=x86_64 CoresPerSocket=1  CPUAlloc=0 NodeAddr=10.231.7.11 "
            "State=IDLE ThreadsPerCore=1\n"
            "NodeName=hpcn2 Arch=x86_64 NodeAddr=10.231.7.12 State=ALLOCATED+NOT_RESPONDING Weight=1\n"
            "Node nosuch not found\n")
    assert parse_show_nodes(text) == {"hpcn1": "IDLE", "hpcn2": "ALLOCATED+NOT_RESPONDING"}


def test_the_launchers_stderr_is_passed_on_and_its_last_lines_kept(capfd):
    import subprocess
    import sys

    from hpc_train.job.supervise import LauncherOutput

    writer = "import sys\nfor i in range(300): print(f'line {i}', file=sys.stderr)"
    process = subprocess.Popen([sys.executable, "-c", writer], stderr=subprocess.PIPE, text=True)
    output = LauncherOutput(process.stderr, keep=2)
    assert process.wait(timeout=60) == 0
    assert output.tail() == ["line 298", "line 299"]
    assert capfd.readouterr().err.splitlines() == [f"line {i}" for i in range(300)]

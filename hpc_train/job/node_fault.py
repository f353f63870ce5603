"""Did the ranks end because a node died, or because of the code? A pure verdict from what the
launcher printed and what Slurm says of the allocation's nodes.

A node fault must not spend checkpoint.retries_on_failure (the code did nothing wrong), and the
next start must avoid the node: a restart inside the allocation would need it again. The
evidence, strongest first:
  1. Slurm shows a node of the allocation not responding, down or failed (`scontrol show node`;
     slurmctld notices a crash only after its next ping, so this may come late or not at all);
  2. the launcher names the node: Open MPI's "ORTE has lost communication with a remote daemon"
     with the remote daemon's node (mpirun then exits 205), srun's "Node failure on NODE";
  3. the node's slurmd accepts no connection (the machine is gone or cut off: srun itself
     waits for slurmctld, and the watchdog sees only a rank that stopped beating);
  4. mpirun lost a daemon without naming its node. Its exit status alone (205) is no evidence:
     a rank's own exit status passes through mpirun.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hpc_train.scheduler import node_lost

_NAMED = ((re.compile(r"Remote daemon: \S+ on node (\S+)"), "mpirun lost its daemon on"),
          (re.compile(r"srun: error: Node failure on (\S+)"), "srun reported a node failure on"))
_DAEMON_LOST = re.compile(r"\b(ORTE|PRTE) has lost communication with a remote daemon")


@dataclass(frozen=True)
class NodeFault:
    nodes: tuple[str, ...]     # the nodes lost (empty: the launcher did not say which)
    why: str                   # the evidence, in words


def node_fault(returncode: int, launcher_lines: list[str], node_states: dict[str, str],
               unreachable: tuple[str, ...] = ()) -> NodeFault | None:
    """A node fault, or None (then a failure is the code's). node_states: {node of the
    allocation: Slurm's State word}, {} when Slurm was not asked or did not answer;
    unreachable: the allocation's nodes whose slurmd accepted no connection."""
    down = tuple(sorted(node for node, state in node_states.items() if node_lost(state)))
    if down:
        states = ", ".join(f"{node} {node_states[node]}" for node in down)
        return NodeFault(down, f"Slurm shows {states}")
    for pattern, words in _NAMED:
        named = sorted({m.group(1) for line in launcher_lines if (m := pattern.search(line))})
        if named:
            return NodeFault(tuple(named), f"{words} {', '.join(named)}")
    if unreachable:
        nodes = tuple(sorted(unreachable))
        return NodeFault(nodes, f"slurmd on {', '.join(nodes)} accepts no connection")
    if any(_DAEMON_LOST.search(line) for line in launcher_lines):
        return NodeFault((), f"mpirun lost a remote daemon (exit {returncode})")
    return None

"""The hosts and slots of a Slurm allocation, from the job's environment (pure functions)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass

from hpc_train.scheduler.parse import expand_hostlist


@dataclass(frozen=True)
class Allocation:
    """Hosts in order, each with the number of ranks (slots) it runs."""

    hosts: tuple[tuple[str, int], ...]

    @property
    def world_size(self) -> int:
        return sum(slots for _, slots in self.hosts)

    @property
    def host_names(self) -> tuple[str, ...]:
        return tuple(host for host, _ in self.hosts)


def expand_tasks_per_node(text: str) -> list[int]:
    """Slurm's SLURM_TASKS_PER_NODE: '4(x2),2' -> [4, 4, 2]."""
    counts = []
    for part in text.split(","):
        m = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not m:
            raise ValueError(f"unrecognised SLURM_TASKS_PER_NODE entry {part!r} in {text!r}")
        counts.extend([int(m.group(1))] * int(m.group(2) or 1))
    return counts


def allocation_from_slurm(env: Mapping[str, str]) -> Allocation:
    """The allocation this batch script runs in. Raises KeyError outside a Slurm job."""
    hosts = expand_hostlist(env["SLURM_JOB_NODELIST"])
    counts = expand_tasks_per_node(env["SLURM_TASKS_PER_NODE"])
    if len(counts) != len(hosts):
        raise ValueError(f"{len(hosts)} hosts in SLURM_JOB_NODELIST but {len(counts)} entries "
                         f"in SLURM_TASKS_PER_NODE={env['SLURM_TASKS_PER_NODE']!r}")
    return Allocation(tuple(zip(hosts, counts)))


def training_hosts(allocation: Allocation, nodes: int, lost=frozenset(),
                   fewest: int | None = None) -> Allocation:
    """The first `nodes` hosts of the allocation that have not died: the ones the ranks run on;
    the rest (slurm.spare_nodes) wait. With `fewest` (slurm.nodes as a range), as many as are
    alive, from `fewest` up to `nodes`. Fewer than that alive: ValueError."""
    alive = tuple((host, slots) for host, slots in allocation.hosts if host not in lost)
    needed = nodes if fewest is None else fewest
    if len(alive) < needed:
        raise ValueError(f"{needed} nodes needed, {len(alive)} alive in the allocation "
                         f"({', '.join(allocation.host_names)}; lost: {', '.join(sorted(lost))})")
    return Allocation(alive[:nodes])


def local_allocation(host: str, ranks: int) -> Allocation:
    """One host running every rank: Slurm's local executor, or a laptop."""
    return Allocation(((host, ranks),))

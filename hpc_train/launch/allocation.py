"""The hosts and slots of a Slurm allocation, from the job's environment (pure functions)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass


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


def _split_top_level(text: str) -> list[str]:
    """Split on commas that are not inside brackets: 'a[1-2,4],b' -> ['a[1-2,4]', 'b']."""
    parts, depth, current = [], 0, []
    for char in text:
        if char == "," and depth == 0:
            parts.append("".join(current))
            current = []
            continue
        depth += {"[": 1, "]": -1}.get(char, 0)
        current.append(char)
    if current:
        parts.append("".join(current))
    return [p for p in parts if p]


def expand_hostlist(nodelist: str) -> list[str]:
    """Expand Slurm's compressed host list: 'gpu[01-03,07],login1' -> gpu01, gpu02, gpu03, gpu07, login1.

    Zero padding follows the range's own width, as `scontrol show hostnames` does.
    """
    hosts = []
    for item in _split_top_level(nodelist.strip()):
        m = re.fullmatch(r"([^\[\]]*)\[([^\]]+)\](.*)", item)
        if not m:
            hosts.append(item)
            continue
        prefix, ranges, suffix = m.groups()
        for part in ranges.split(","):
            lo, _, hi = part.partition("-")
            width = len(lo)
            for number in range(int(lo), int(hi or lo) + 1):
                hosts.extend(expand_hostlist(f"{prefix}{number:0{width}d}{suffix}"))
    return hosts


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


def local_allocation(host: str, ranks: int) -> Allocation:
    """One host running every rank: Slurm's local executor, or a laptop."""
    return Allocation(((host, ranks),))

"""Where to cut a list of blocks into K contiguous stages (pure).

The pipeline runs at the pace of its slowest stage, so the cut minimises the largest stage cost.
Costs are per block: parameter counts (a proxy for memory and compute that needs no run) or
measured forward+backward seconds of one micro-batch (see `stage.time_blocks`). The search is
exact: a binary search over the answer with a greedy feasibility test, O(n log(sum)) on
integers; float costs are scaled to integers first.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence


def _fits(costs: Sequence[int], parts: int, limit: int) -> bool:
    """Can `costs` be cut into at most `parts` contiguous runs each summing to <= limit?"""
    used, current = 1, 0
    for cost in costs:
        if current + cost > limit:
            used, current = used + 1, cost
        else:
            current += cost
    return used <= parts


def _cut(costs: Sequence[int], parts: int, limit: int) -> list[int]:
    """Stage sizes under `limit`, leaving at least one block for every later stage."""
    sizes, current, count = [], 0, 0
    for i, cost in enumerate(costs):
        left_blocks = len(costs) - i
        left_stages = parts - len(sizes) - 1
        if count and (current + cost > limit or left_blocks == left_stages):
            sizes.append(count)
            current, count = 0, 0
        current += cost
        count += 1
    sizes.append(count)
    return sizes


def balance_blocks(costs: Sequence[float], stages: int) -> list[int]:
    """Blocks per stage (sums to len(costs), each >= 1) minimising the largest stage cost."""
    if stages < 1 or stages > len(costs):
        raise ValueError(f"cannot cut {len(costs)} blocks into {stages} non-empty stages")
    if any(c < 0 for c in costs):
        raise ValueError("block costs must be >= 0")
    top = max(costs) or 1.0
    ints = [round(c / top * 1_000_000) for c in costs]   # 1e-6 resolution is plenty
    low, high = max(ints), sum(ints)
    while low < high:
        middle = (low + high) // 2
        if _fits(ints, stages, middle):
            high = middle
        else:
            low = middle + 1
    return _cut(ints, stages, low)


def cut_problem(blocks: int, stages: int, balance: str | Sequence[int]) -> str | None:
    """Why `balance` (auto, time, or blocks per stage) cannot cut a list of `blocks` blocks
    into `stages` stages, as one line with its fix; None when it can. The spec's rules say it
    on the login node for gpt; a user's blocks are counted only where the model is built."""
    if isinstance(balance, str):
        if stages <= blocks:
            return None
        return (f"parallel.pipeline.stages {stages} with {blocks} blocks: every stage needs a "
                f"block. Fix: use at most {blocks} stages, or a model of more blocks")
    sizes = list(balance)
    if len(sizes) == stages and min(sizes, default=0) >= 1 and sum(sizes) == blocks:
        return None
    even = [blocks // stages + (i < blocks % stages) for i in range(stages)]
    fix = even if min(even) > 0 else "auto"
    return (f"parallel.pipeline.balance {sizes} with {stages} stages and {blocks} blocks: one "
            f"block count >= 1 per stage, summing to the blocks. Fix: set "
            f"parallel.pipeline.balance: {fix}")


def stage_bounds(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """[start, end) block indices of each stage."""
    return [(end - size, end) for size, end in zip(sizes, itertools.accumulate(sizes))]


def bubble_fraction(stages: int, microbatches: int) -> float:
    """GPipe's idle fraction (K-1)/(M+K-1) of a step with K stages and M micro-batches."""
    return (stages - 1) / (microbatches + stages - 1)

"""Reading the test-only sample ledger (hpc_train/train/ledger.py) and checking it: every sample
of every epoch trained once, in the epoch's order.

What "exactly once" means when the global batch changes (data/sampler.py): each epoch trains a
prefix of its fixed order, every step the next slice of it, and leaves out a tail smaller than
one step of the segment that ends the epoch. A start of the ranks that failed may have trained
steps after its last checkpoint; the next start trains them again from that checkpoint, so the
run's history is each start's rows up to where the next one resumed (`kept_history`).
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from hpc_train.data.sampler import block_order, block_size_for


def read_ledger(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


def kept_history(rows: list[dict], resumed_at: list[int]) -> list[dict]:
    """The rows the run's final weights come from. rows: in the order written; resumed_at: for
    each start after the first, the sample position it resumed from (its `resumed` event's
    `samples`), in order. A start's rows past the position the next one resumed from were
    trained again by it."""
    launches = list(dict.fromkeys(row["launch"] for row in rows))
    assert len(launches) <= len(resumed_at) + 1, (launches, resumed_at)
    limits = dict(zip(launches, [*resumed_at, None]))
    return [row for row in rows if limits[row["launch"]] is None
            or row["position"] <= limits[row["launch"]]]


def _steps(rows: list[dict]) -> dict[tuple[int, int], list[dict]]:
    """The ledger's rows by step: (epoch, position reached)."""
    steps = defaultdict(list)
    for row in rows:
        steps[row["epoch"], row["position"]].append(row)
    return steps


def assert_every_sample_once_in_order(rows: list[dict], spec, size: int) -> dict[int, int]:
    """Each step trained the next slice of its epoch's order (of `size` samples); returns the
    samples trained per epoch."""
    trained = {}
    for epoch in range(spec.optim.epochs):
        order = block_order(size, spec.run.seed, epoch, block_size_for(spec.data.kind)).tolist()
        steps = sorted((p, r) for (e, p), r in _steps(rows).items() if e == epoch)
        start = 0
        for position, step in steps:
            per_step = step[0]["samples_per_step"]
            end = position - epoch * size
            assert end - start == per_step == len(step), (epoch, position)
            assert sorted(r["index"] for r in step) == sorted(order[start:end]), (epoch, position)
            start = end
        assert 0 <= size - start < per_step, f"epoch {epoch} left out {size - start} samples"
        trained[epoch] = start
    return trained

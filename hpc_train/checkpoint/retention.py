"""Which checkpoints to delete: keep the last K, and one per M steps for good (pure)."""

from __future__ import annotations

from collections.abc import Iterable


def steps_to_delete(steps: Iterable[int], keep_last: int, keep_every: int | None = None) -> list[int]:
    """Complete checkpoint steps that retention removes, ascending.

    keep_last: the newest K always stay. keep_every M: for each multiple of M, the first
    checkpoint saved at or after it stays for good (saves rarely land exactly on a multiple).
    """
    ordered = sorted(set(steps))
    keep = set(ordered[-keep_last:]) if keep_last > 0 else set()
    if keep_every:
        claimed = set()
        for step in ordered:
            multiple = step // keep_every
            if multiple > 0 and multiple not in claimed:
                claimed.add(multiple)
                keep.add(step)
    return [step for step in ordered if step not in keep]

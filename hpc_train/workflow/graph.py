"""The stage graph (pure): `after`/`after_any` edges, cycles, order, ancestors, descendants.
Cycles and order are graphlib's.

`needs` maps each stage to the stages it waits for, in file order; every function keeps file
order where it has a choice, so plans, scripts and tables come out the same every time.
"""

from __future__ import annotations

from graphlib import CycleError, TopologicalSorter

Needs = dict[str, list[str]]


def _sorter(needs: Needs) -> TopologicalSorter:
    """A prepared sorter of the known stages (unknown names are reported apart); CycleError."""
    sorter = TopologicalSorter({stage: [b for b in before if b in needs] for stage, before in needs.items()})
    sorter.prepare()
    return sorter


def find_cycle(needs: Needs) -> list[str] | None:
    """One cycle as [a, b, ..., a] (a waits for b ... waits for a), or None."""
    try:
        _sorter(needs)
    except CycleError as exc:
        return exc.args[1][::-1]     # graphlib lists each stage before the one that waits for it
    return None


def order(needs: Needs) -> list[str]:
    """Stages so that each comes after everything it needs (file order among equals).
    Raises CycleError (a ValueError) on a cycle."""
    sorter, place = _sorter(needs), list(needs).index
    ready, done = [], []
    while sorter.is_active():
        ready = sorted([*ready, *sorter.get_ready()], key=place)
        done.append(ready.pop(0))
        sorter.done(done[-1])
    return done


def ancestors(needs: Needs, stage: str) -> set[str]:
    """Every stage `stage` waits for, directly or not."""
    seen: set[str] = set()
    todo = list(needs.get(stage, []))
    while todo:
        if (before := todo.pop()) in needs and before not in seen:
            seen.add(before)
            todo.extend(needs[before])
    return seen


def descendants(needs: Needs, stages: set[str]) -> set[str]:
    """Every stage that waits, directly or not, for one of `stages` (not those themselves)."""
    found: set[str] = set()
    for stage in order(needs):
        if stage not in stages and any(b in stages or b in found for b in needs[stage]):
            found.add(stage)
    return found


def layers(needs: Needs) -> list[list[str]]:
    """Stages by depth (0: waits for nothing, else 1 + the deepest it waits for), to draw them."""
    sorter, place = _sorter(needs), list(needs).index
    out: list[list[str]] = []
    while sorter.is_active():
        out.append(sorted(sorter.get_ready(), key=place))
        sorter.done(*out[-1])
    return out

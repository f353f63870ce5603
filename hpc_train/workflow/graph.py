"""The stage graph (pure): `after`/`after_any` edges, cycles, order, ancestors, descendants.

`needs` maps each stage to the stages it waits for, in file order; every function keeps file
order where it has a choice, so plans, scripts and tables come out the same every time.
"""

from __future__ import annotations

Needs = dict[str, list[str]]


def find_cycle(needs: Needs) -> list[str] | None:
    """One cycle as [a, b, ..., a] (a waits for b ... waits for a), or None. Unknown names are
    ignored (reported on their own)."""
    state: dict[str, int] = {}           # 1: on the current path, 2: done
    path: list[str] = []

    def visit(stage: str) -> list[str] | None:
        state[stage] = 1
        path.append(stage)
        for before in needs.get(stage, []):
            if before not in needs:
                continue
            if state.get(before) == 1:
                return path[path.index(before):] + [before]
            if before not in state and (cycle := visit(before)):
                return cycle
        path.pop()
        state[stage] = 2
        return None

    for stage in needs:
        if stage not in state and (cycle := visit(stage)):
            return cycle
    return None


def order(needs: Needs) -> list[str]:
    """Stages so that each comes after everything it needs (file order among equals).
    Raises ValueError on a cycle."""
    done: list[str] = []
    placed: set[str] = set()
    remaining = list(needs)
    while remaining:
        ready = [s for s in remaining if all(b in placed or b not in needs for b in needs[s])]
        if not ready:
            raise ValueError(f"cycle among {remaining}")
        stage = ready[0]
        done.append(stage)
        placed.add(stage)
        remaining.remove(stage)
    return done


def ancestors(needs: Needs, stage: str) -> set[str]:
    """Every stage `stage` waits for, directly or not."""
    seen: set[str] = set()
    todo = list(needs.get(stage, []))
    while todo:
        before = todo.pop()
        if before in seen or before not in needs:
            continue
        seen.add(before)
        todo.extend(needs[before])
    return seen


def descendants(needs: Needs, stages: set[str]) -> set[str]:
    """Every stage that waits, directly or not, for one of `stages` (not those themselves)."""
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for stage, before in needs.items():
            if stage not in found and stage not in stages and any(b in stages or b in found for b in before):
                found.add(stage)
                changed = True
    return found


def layers(needs: Needs) -> list[list[str]]:
    """Stages by depth (0: waits for nothing), for drawing the graph."""
    depth: dict[str, int] = {}
    for stage in order(needs):
        depth[stage] = 1 + max((depth[b] for b in needs[stage] if b in depth), default=-1)
    out: list[list[str]] = [[] for _ in range(max(depth.values(), default=-1) + 1)]
    for stage in needs:
        out[depth[stage]].append(stage)
    return out

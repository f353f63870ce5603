"""Names under checkpoints/ and which checkpoints count (pure functions of the listing).

    checkpoints/
      step-00001200/            renamed into place only when every file in it is written
        COMPLETE                written last: a checkpoint counts only with its marker
        meta.json               step, epoch, spec hash, world size, time
        replicated.pt           state every rank shares (model, optimizer, scaler, schedule, sampler)
        rank-00000.pt           state that differs per rank (RNG streams)
        stage-00000.pt          a pipeline stage's weights and optimizer (its blocks' names)
        sharded/                fsdp's model and optimizer, every rank's shards (DCP's format)
      .step-00001300.tmp/       a save in progress (or killed): never loaded, removed on next save;
                                its files appear as NAME.partial, renamed to NAME once fsynced
      step-00001100.unloadable/ complete but failed to load on resume: set aside, kept to inspect
"""

from __future__ import annotations

import re
from pathlib import Path

MARKER = "COMPLETE"
META = "meta.json"
REPLICATED = "replicated.pt"
SHARDED = "sharded"
_STEP_DIR = re.compile(r"step-(\d{8,})")


def step_dir_name(step: int) -> str:
    return f"step-{step:08d}"


def tmp_dir_name(step: int) -> str:
    return f".{step_dir_name(step)}.tmp"


def unloadable_dir_name(step: int) -> str:
    return f"{step_dir_name(step)}.unloadable"


def rank_file_name(rank: int) -> str:
    return f"rank-{rank:05d}.pt"


def stage_file_name(stage: int) -> str:
    return f"stage-{stage:05d}.pt"


def stage_files(directory: Path) -> list[Path]:
    """A pipeline checkpoint's stage files, in stage order."""
    return sorted(directory.glob("stage-[0-9]*.pt"))


def complete_steps(names_with_marker: dict[str, bool]) -> list[int]:
    """Steps of directories named step-N that have their COMPLETE marker, ascending."""
    steps = []
    for name, has_marker in names_with_marker.items():
        match = _STEP_DIR.fullmatch(name)
        if match and has_marker:
            steps.append(int(match.group(1)))
    return sorted(steps)


def list_complete(root: Path) -> list[int]:
    if not root.is_dir():
        return []
    return complete_steps({p.name: (p / MARKER).is_file() for p in root.iterdir() if p.is_dir()})


def latest_complete(root: Path) -> int | None:
    steps = list_complete(root)
    return steps[-1] if steps else None

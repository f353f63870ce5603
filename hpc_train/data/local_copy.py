"""Node-local copies of shards (`data.copy_to`): copy a job's shards to the node's own disk
once, verified, and read them from there.

HPC centres ask I/O-heavy jobs to read from node-local disk ($SLURM_TMPDIR, /local/scratch)
rather than the shared filesystem every node hammers. One process per node (local rank 0)
copies; the node's other ranks wait for its verdict file. What is copied: every split directory
with a manifest (train and val): each rank of a block-shuffled sampler reads from every shard over
an epoch, so a node needs them all. Each shard is checked against the manifest's sha256; a copy
already there and intact (a requeue on the same node) is kept, a damaged one replaced. When the
disk is too small, or the place names a variable the node does not set, the copier says so and the
ranks read the shared path.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from hpc_train.data.manifest import sha256_file
from hpc_train.errors import DataError
from hpc_train.rundir import write_atomic

VERDICT = ".copied-{token}.json"   # the copier's verdict for one launch, for the node's ranks


@dataclass(frozen=True)
class Item:
    source: Path
    relative: str               # "train/shard-00000.h5"
    sha256: str | None          # None: a small file without a checksum (manifest, sidecar)


@dataclass
class LocalCopy:
    root: str                   # where the ranks read: the local copy, or the shared path
    local: bool
    copied: int = 0
    kept: int = 0
    replaced: int = 0           # damaged local copies found and copied again
    bytes_copied: int = 0
    seconds: float = 0.0
    note: str = ""              # why the shared path is used, when it is
    token: str = ""
    extra: dict = field(default_factory=dict)

    def to_json(self) -> dict:
        return asdict(self)


_VARIABLE = re.compile(r"\$(\w+)|\$\{(\w+)\}")


def expand_place(template: str, environ) -> tuple[Path | None, str]:
    """`data.copy_to` with the node's variables ($SLURM_TMPDIR -> /tmp/job123); (None, why)
    when it names a variable this node does not set."""
    missing = [a or b for a, b in _VARIABLE.findall(template) if (a or b) not in environ]
    if missing:
        return None, (f"data.copy_to {template!r}: {', '.join('$' + m for m in missing)} is not set "
                      "on this node")
    return Path(_VARIABLE.sub(lambda m: environ[m.group(1) or m.group(2)], template)), ""


def plan(shared: Path) -> list[Item]:
    """Every file to copy, from the manifests of the split directories under `shared` (pure
    apart from reading the manifests)."""
    items: list[Item] = []
    for split_dir in sorted(p for p in shared.iterdir() if (p / "manifest.json").is_file()):
        manifest = json.loads((split_dir / "manifest.json").read_text())
        for shard in manifest.get("shards", []):
            items.append(Item(split_dir / shard["file"], f"{split_dir.name}/{shard['file']}",
                              shard.get("sha256")))
        for small in sorted(split_dir.glob("*.json")):
            items.append(Item(small, f"{split_dir.name}/{small.name}", None))
    if not items:
        raise DataError(f"data.copy_to: no split with a manifest.json under {shared}")
    return items


def _intact(path: Path, item: Item) -> bool:
    if not path.is_file() or path.stat().st_size != item.source.stat().st_size:
        return False
    return item.sha256 is None or sha256_file(path) == item.sha256


def _copy(item: Item, target: Path) -> int:
    """Copy to a temporary name, check the copy's sha256, then rename: a killed copy never
    looks copied."""
    target.parent.mkdir(parents=True, exist_ok=True)
    partial = target.with_name(f"{target.name}.part-{os.getpid()}")
    shutil.copyfile(item.source, partial)
    if item.sha256 is not None and sha256_file(partial) != item.sha256:
        partial.unlink()
        raise DataError(f"data.copy_to: the copy of {item.source} does not match the manifest's "
                        "sha256 (is the shared file itself damaged? `data verify` it)")
    os.replace(partial, target)
    return target.stat().st_size


def copy_shards(shared: Path, place: Path, token: str, beat: Callable[[], None] = lambda: None) -> LocalCopy:
    """Copy what is missing or damaged from `shared` to `place`; returns where to read."""
    started = time.monotonic()
    items = plan(shared)
    local = place / shared.name
    local.mkdir(parents=True, exist_ok=True)
    needed = [i for i in items if not _intact(local / i.relative, i)]
    missing_bytes = sum(i.source.stat().st_size for i in needed)
    free = shutil.disk_usage(local).free
    if missing_bytes > free:
        return LocalCopy(str(shared), False, token=token,
                      note=f"{local} has {free >> 20} MiB free but the shards need {missing_bytes >> 20} "
                           "MiB more: reading the shared path")
    result = LocalCopy(str(local), True, kept=len(items) - len(needed), token=token)
    for item in needed:
        target = local / item.relative
        result.replaced += target.exists()
        result.bytes_copied += _copy(item, target)
        result.copied += 1
        beat()
    result.seconds = round(time.monotonic() - started, 2)
    return result


def write_verdict(place: Path, copy: LocalCopy) -> None:
    place.mkdir(parents=True, exist_ok=True)
    write_atomic(place / VERDICT.format(token=copy.token), json.dumps(copy.to_json()).encode())


def wait_verdict(place: Path, token: str, timeout: float) -> LocalCopy:
    """The node copier's verdict for this launch (`token`), polled; bounded by `timeout`. The
    waiting ranks do not count as progressing: the copier does, file by file, so a copier that
    hangs is the driver's watchdog's to catch."""
    deadline = time.monotonic() + timeout
    path = place / VERDICT.format(token=token)
    while time.monotonic() < deadline:
        try:
            return LocalCopy(**json.loads(path.read_text()))
        except (OSError, ValueError):
            time.sleep(0.2)
    raise DataError(f"data.copy_to: no local-copy verdict in {path} after {timeout:.0f} s (did local "
                    "rank 0 of this node fail? see its log)")

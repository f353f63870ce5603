"""The code a run imports, frozen when it is submitted.

A job may wait in the queue for days and is requeued days later again; meanwhile the checkout
it was submitted from changes. So `submit` (and `render`) copy the package's source into a
content-addressed cache beside the run directories, `<run root>/.code/<sha256>/hpc_train/`,
and link the run to it (`<run dir>/code`). The job's driver line puts that link first on
PYTHONPATH (slurm/script.py), the ranks inherit it, and a requeue runs the same script: every
start of the run imports the submitted code. Runs of the same source share one copy.

Only source is copied (`.py` files, and the `.so` extension modules built from the package's C
source), read once: the hash is of the bytes written. Nothing in the source or the snapshot is
imported or run here. The user's packages that the spec's references name (spec/code_refs.py:
found in the submit directory or run.code) are copied beside ours, `<sha256>/<their package>/`,
so a requeue imports their submitted code too.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import uuid
from dataclasses import asdict, dataclass
from pathlib import Path

from hpc_train.errors import SubmitError
from hpc_train.rundir import RunPaths

PACKAGE = "hpc_train"
# Source, and the extension modules built in place from it (the crop-region JPEG decoder,
# hpc_train/data/_cropjpeg.c): without them a job would import the snapshot's Python only and
# decode with the slower fallback.
SUFFIXES = (".py", ".so")
_SKIP_DIRS = ("__pycache__",)


@dataclass(frozen=True)
class Snapshot:
    path: Path          # <cache>/<sha256>: the folder to put on PYTHONPATH
    sha256: str
    files: int

    def to_json(self) -> dict:
        return {**asdict(self), "path": str(self.path)}


def package_dir() -> Path:
    """The source of the package this process runs: what the job would import without one."""
    import hpc_train

    return Path(hpc_train.__file__).resolve().parent


def source_files(package: Path) -> list[str]:
    """The files to copy, as sorted paths relative to `package`: source files in the package
    and its subpackages; no caches, hidden folders or folders reached through links."""
    found = []
    for folder, dirs, files in os.walk(package):          # followlinks=False: stays inside
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS and not d.startswith("."))
        for name in files:
            path = Path(folder) / name
            if path.suffix in SUFFIXES and path.is_file():
                found.append(path.relative_to(package).as_posix())
    return sorted(found)


def digest(contents: dict[str, bytes]) -> str:
    """The cache key: sha256 over every (relative path, content hash), in path order."""
    outer = hashlib.sha256()
    for name in sorted(contents):
        outer.update(f"{name}\0{hashlib.sha256(contents[name]).hexdigest()}\n".encode())
    return outer.hexdigest()


def read_package(package: Path) -> dict[str, bytes]:
    """`package`'s source files, keyed `hpc_train/<relative path>` as they lie in a snapshot."""
    return read_sources({PACKAGE: package})


def read_sources(packages: dict[str, Path]) -> dict[str, bytes]:
    """The source files of each top package (name -> its folder, or its single module file),
    keyed by their path in a snapshot: `<name>/<relative path>`, or `<name>.py`."""
    contents = {}
    for name, path in packages.items():
        if path.is_file():
            contents[path.name] = path.read_bytes()
        else:
            contents.update({f"{name}/{rel}": (path / rel).read_bytes() for rel in source_files(path)})
    return contents


def _snapshot_sources(target: Path) -> dict[str, bytes]:
    """What a snapshot folder holds, read as `read_sources` read it when it was written."""
    packages = {entry.name if entry.is_dir() else entry.stem: entry
                for entry in sorted(target.iterdir())
                if entry.is_dir() or entry.suffix in SUFFIXES}
    return read_sources(packages)


def take(package: Path, cache: Path, own: dict[str, Path] | None = None) -> Snapshot:
    """Copy `package`, and the user's packages `own` (top name -> folder or module file), into
    `cache/<sha256>` unless that copy exists; either way checked."""
    if own and PACKAGE in own:
        raise SubmitError(f"your code at {own[PACKAGE]} is a package named {PACKAGE}, as ours is; "
                          "rename it")
    contents = read_sources({PACKAGE: package, **(own or {})})
    if not any(name.startswith(f"{PACKAGE}/") for name in contents):
        raise SubmitError(f"no source files under {package}: nothing to snapshot. Fix: submit "
                          "from an installed or checked-out hpc_train, or use --no-snapshot")
    key = digest(contents)
    target = cache / key
    if not target.is_dir():
        _write_new(cache, key, contents)
    _check(target, key)
    return Snapshot(target, key, len(contents))


def _write_new(cache: Path, key: str, contents: dict[str, bytes]) -> None:
    """Write into a private folder, then rename it into place: a reader sees all or nothing, and
    two submits of the same source at once both end with the one copy."""
    cache.mkdir(parents=True, exist_ok=True)
    partial = cache / f".partial-{key[:16]}-{uuid.uuid4().hex[:8]}"
    try:
        for name, data in contents.items():
            path = partial / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            path.chmod(0o444)        # read-only files: an editor does not change a run's code
        os.rename(partial, cache / key)
    except OSError:
        if not (cache / key).is_dir():   # not a lost race: a real failure
            shutil.rmtree(partial, ignore_errors=True)
            raise
    shutil.rmtree(partial, ignore_errors=True)


def _check(target: Path, key: str) -> None:
    found = digest(_snapshot_sources(target))
    if found != key:
        raise SubmitError(f"the code snapshot {target} was changed after it was written (its files "
                          f"hash to {found[:12]}..., not {key[:12]}...). Fix: remove that folder "
                          "(the next submit writes it again), or use --no-snapshot")


def link(paths: RunPaths, snapshot: Snapshot) -> None:
    """Point the run's `code` link at `snapshot` (relative, so the run root may move whole)."""
    temporary = paths.root / f".code-{uuid.uuid4().hex[:8]}"
    temporary.symlink_to(os.path.relpath(snapshot.path, paths.root))
    os.replace(temporary, paths.code)


def unlink(paths: RunPaths) -> None:
    """The run imports the installed package again: its link goes (the copy stays cached)."""
    if paths.code.is_symlink():
        paths.code.unlink()


def linked(paths: RunPaths) -> Path | None:
    """The run's code link when it has one; SubmitError when it points at nothing."""
    if not paths.code.is_symlink() and not paths.code.exists():
        return None
    if not (paths.code / PACKAGE).is_dir():
        raise SubmitError(f"{paths.code} leads to {paths.code.resolve()}, which holds no "
                          f"{PACKAGE} (the snapshot was removed?). Fix: --new-snapshot to take the "
                          "current source, or --no-snapshot to run the installed package")
    return paths.code

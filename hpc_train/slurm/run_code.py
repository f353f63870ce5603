"""What a submission does about the code its job imports: take a snapshot, keep the run's, or
none (slurm/snapshot.py has the copy itself); and the environment record of each submission.
`submit`, `render` and `resume` all go through here."""

from __future__ import annotations

import os
from pathlib import Path

from hpc_train.rundir import CODE_CACHE, RunPaths
from hpc_train.runtime import environment
from hpc_train.slurm import snapshot
from hpc_train.spec import JobSpec
from hpc_train.spec.code_refs import own_packages

# What a submission does about the code the job imports (slurm/snapshot.py).
CODE_NEW = "new"      # snapshot the source this process runs; the run links to it
CODE_KEEP = "keep"    # the run's snapshot as it is linked (resume), or none if it has none
CODE_NONE = "none"    # no snapshot: the job imports whatever package its Python finds


def take_snapshot(spec: JobSpec, paths: RunPaths | None, mode: str) -> snapshot.Snapshot | None:
    """The snapshot a CODE_NEW submission links to, taken before the run directory exists: one
    that cannot be taken leaves nothing behind."""
    if mode != CODE_NEW:
        return None
    cache = paths.code_cache if paths else Path(spec.run.root).resolve() / CODE_CACHE
    return snapshot.take(snapshot.package_dir(), cache, own_packages(spec, Path.cwd()))


def attach_code(paths: RunPaths, mode: str, taken: snapshot.Snapshot | None, where: str) -> Path | None:
    """Link (or unlink) the run's code for `mode` and record the environment of this `where`
    (submit, render, resume); the link the job imports from, or None."""
    code, recorded = prepare_code(paths, mode, taken)
    environment.record(paths, environment.login_record(where, os.environ, snapshot.package_dir(),
                                                       recorded))
    return code


def prepare_code(paths: RunPaths, mode: str, taken: snapshot.Snapshot | None) -> tuple[Path | None, dict | None]:
    """(the link the job imports from or None, what to record of it) for `mode`."""
    if mode == CODE_NEW:
        snapshot.link(paths, taken)
        return paths.code, taken.to_json()
    if mode == CODE_NONE:
        snapshot.unlink(paths)
        return None, None
    code = snapshot.linked(paths)
    if code is None:
        return None, None
    target = code.resolve()
    return code, {"path": str(target), "sha256": target.name, "reused": True}

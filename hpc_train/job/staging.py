"""A rank's part in node-local staging (data.stage_to; the copying is data/stage.py).

Local rank 0 of each node copies and records a `data_staged` event; the node's other ranks wait
for its verdict for this start of the ranks (HPC_TRAIN_LAUNCH_ID), bounded by the job's stop
deadline. Every rank of a node then reads the same place: the local copy, or the shared path
with the reason logged.
"""

from __future__ import annotations

import logging
import os
import socket
import time
from pathlib import Path

from hpc_train import events
from hpc_train.data.stage import Staged, expand_place, stage, wait_verdict, write_verdict
from hpc_train.errors import DataError
from hpc_train.launch.identity import LAUNCH_ID_ENV, RankInfo
from hpc_train.rundir import RunPaths
from hpc_train.runtime.heartbeat import Phase
from hpc_train.runtime.stop import DEADLINE_ENV

log = logging.getLogger("hpc_train.staging")
_NO_DEADLINE_WAIT = 24 * 3600.0


def stage_data(spec, paths: RunPaths, identity: RankInfo, heartbeat, environ=os.environ) -> Path | None:
    """Where this rank reads its shards: a node-local copy, or None for data.path itself."""
    data = spec.data
    if data.stage_to is None or data.kind not in ("hdf5", "tokens") or data.path is None:
        return None
    place, why = expand_place(data.stage_to, environ)
    if place is None:
        if identity.local_rank == 0:
            log.warning("staging skipped: %s; reading %s", why, data.path)
        return None
    heartbeat.progress(phase=Phase.STAGING)
    token = environ.get(LAUNCH_ID_ENV) or f"{socket.gethostname()}-{os.getppid()}"
    if identity.local_rank == 0:
        staged = _copy_for_the_node(Path(data.path), place, token, heartbeat)
        events.try_record(paths, events.data_staged(
            socket.gethostname(), staged.root, staged.local, staged.copied, staged.kept,
            staged.replaced, staged.bytes_copied, staged.seconds, staged.note))
    else:
        deadline = float(environ.get(DEADLINE_ENV) or 0)
        wait = deadline - time.time() if deadline else _NO_DEADLINE_WAIT
        staged = wait_verdict(place, token, max(60.0, wait))
    return Path(staged.root) if staged.local else None


def _copy_for_the_node(shared: Path, place: Path, token: str, heartbeat) -> Staged:
    try:
        staged = stage(shared, place, token, beat=lambda: heartbeat.progress(phase=Phase.STAGING))
    except OSError as exc:   # no such disk, no permission, full while copying
        staged = Staged(str(shared), False, token=token,
                        note=f"staging to {place} failed ({exc}): reading the shared path")
    if staged.local:
        log.info("staged %s to %s in %.1f s: %d copied (%d MiB), %d kept, %d damaged and replaced",
                 shared, staged.root, staged.seconds, staged.copied, staged.bytes_copied >> 20,
                 staged.kept, staged.replaced)
    else:
        log.warning("staging: %s", staged.note)
    try:
        write_verdict(place, staged)
    except OSError as exc:
        raise DataError(f"data.stage_to: cannot write the staging verdict in {place} ({exc}); "
                        "the node's other ranks would wait for it: fix the place or remove "
                        "data.stage_to") from None
    return staged

"""Where a rank reads its shards: the node-local copy (data.copy_to; the copying is data/local_copy.py).

Local rank 0 of each node copies and records a `data_copied` event; the node's other ranks wait
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
from hpc_train.data.local_copy import LocalCopy, copy_shards, expand_place, wait_verdict, write_verdict
from hpc_train.errors import DataError
from hpc_train.launch.identity import LAUNCH_ID_ENV, RankInfo
from hpc_train.rundir import RunPaths
from hpc_train.runtime.heartbeat import Phase
from hpc_train.runtime.stop import DEADLINE_ENV

log = logging.getLogger("hpc_train.local_copy")
_NO_DEADLINE_WAIT = 24 * 3600.0


def shard_root(spec, paths: RunPaths, identity: RankInfo, heartbeat, environ=os.environ) -> Path | None:
    """Where this rank reads its shards: a node-local copy, or None for data.path itself."""
    data = spec.data
    if data.copy_to is None or data.kind not in ("hdf5", "tokens") or data.path is None:
        return None
    place, why = expand_place(data.copy_to, environ)
    if place is None:
        if identity.local_rank == 0:
            log.warning("local copy skipped: %s; reading %s", why, data.path)
        return None
    heartbeat.progress(phase=Phase.COPYING)
    token = environ.get(LAUNCH_ID_ENV) or f"{socket.gethostname()}-{os.getppid()}"
    if identity.local_rank == 0:
        copy = _copy_for_the_node(Path(data.path), place, token, heartbeat)
        events.try_record(paths, events.data_copied(
            socket.gethostname(), copy.root, copy.local, copy.copied, copy.kept,
            copy.replaced, copy.bytes_copied, copy.seconds, copy.note))
    else:
        deadline = float(environ.get(DEADLINE_ENV) or 0)
        wait = deadline - time.time() if deadline else _NO_DEADLINE_WAIT
        copy = wait_verdict(place, token, max(60.0, wait))
    return Path(copy.root) if copy.local else None


def _copy_for_the_node(shared: Path, place: Path, token: str, heartbeat) -> LocalCopy:
    try:
        copy = copy_shards(shared, place, token, beat=lambda: heartbeat.progress(phase=Phase.COPYING))
    except OSError as exc:   # no such disk, no permission, full while copying
        copy = LocalCopy(str(shared), False, token=token,
                        note=f"copying to {place} failed ({exc}): reading the shared path")
    if copy.local:
        log.info("copied %s to %s in %.1f s: %d copied (%d MiB), %d kept, %d damaged and replaced",
                 shared, copy.root, copy.seconds, copy.copied, copy.bytes_copied >> 20,
                 copy.kept, copy.replaced)
    else:
        log.warning("local copy: %s", copy.note)
    try:
        write_verdict(place, copy)
    except OSError as exc:
        raise DataError(f"data.copy_to: cannot write the local-copy verdict in {place} ({exc}); "
                        "the node's other ranks would wait for it: fix the place or remove "
                        "data.copy_to") from None
    return copy

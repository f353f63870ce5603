"""The node-local directory of one job on one host: where its ranks keep their beats, logs and
the node's gathering state, so that only one of them touches the shared file system.

It lies under /dev/shm (memory: no disk, no shared file system), or $TMPDIR or /tmp where
/dev/shm is missing or not writable, and is named `hpc_train-<job>-<host>`: the Slurm job id
(the run directory's hash outside Slurm) AND the host name, so it is right even where that place
is shared between hosts (the test cluster's network-namespace nodes share /tmp and /dev/shm).
A requeued job or a restart in the job finds the same directory on the same host again, and
gathers what its predecessor left (runtime/node_log.py). The node's last rank to close removes it
(`NodeLocal.remove`). Ranks that are killed (scancel, a preemption's SIGKILL, a time limit)
leave it behind, and many sites never clear /dev/shm between jobs: each rank's start therefore
removes this user's directories of other jobs that nothing has written to for STALE_SECONDS
(`sweep_stale`); a live job beats into its own every few seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from hpc_train.rundir import host_file_name

SHM = Path("/dev/shm")
LOCK_NAME = "node.lock"
STALE_SECONDS = 3600.0     # far beyond any beat interval (at most 5 s) and stall bound (600 s)


def job_key(environ: Mapping[str, str], run_dir: Path) -> str:
    """The job's part of the name: the Slurm job id, or a hash of the run directory outside
    Slurm (two local runs on one host then keep apart)."""
    job = environ.get("SLURM_JOB_ID")
    if job:
        return host_file_name(job)
    return "run" + hashlib.sha256(str(Path(run_dir).resolve()).encode()).hexdigest()[:16]


def writable_dir(path: Path) -> bool:
    return path.is_dir() and os.access(path, os.W_OK | os.X_OK)


def node_local_base(environ: Mapping[str, str], shm: Path = SHM) -> Path:
    """/dev/shm where it can be written, else $TMPDIR, else /tmp."""
    if writable_dir(shm):
        return shm
    tmpdir = environ.get("TMPDIR")
    if tmpdir and writable_dir(Path(tmpdir)):
        return Path(tmpdir)
    return Path("/tmp")


def node_local_dir(environ: Mapping[str, str], run_dir: Path, host: str, base: Path | None = None) -> Path:
    """This job's directory on this host (not created)."""
    base = node_local_base(environ) if base is None else Path(base)
    return base / f"hpc_train-{job_key(environ, run_dir)}-{host_file_name(host)}"


def sweep_stale(base: Path, keep: Path, now: float | None = None,
                older_than: float = STALE_SECONDS) -> list[Path]:
    """Remove this user's `hpc_train-*` directories under `base`, but `keep`, whose newest
    file is older than `older_than` seconds (killed jobs' leftovers); the ones removed."""
    now = time.time() if now is None else now
    removed = []
    for directory in base.glob("hpc_train-*"):
        try:
            if directory == keep or not directory.is_dir() or directory.stat().st_uid != os.getuid():
                continue
            newest = max([p.stat().st_mtime for p in directory.iterdir()] + [directory.stat().st_mtime])
        except OSError:
            continue          # another rank of the node removed it meanwhile
        if now - newest > older_than:
            shutil.rmtree(directory, ignore_errors=True)
            removed.append(directory)
    return removed


@dataclass(frozen=True)
class NodeLocal:
    """The files of one node-local directory: each rank's beat and log, the lock, the state."""
    root: Path

    def make(self) -> NodeLocal:
        self.root.mkdir(parents=True, exist_ok=True)
        return self

    def beat(self, rank: int) -> Path:
        return self.root / f"rank-{rank:05d}.beat"

    def log(self, rank: int) -> Path:
        return self.root / f"rank-{rank:05d}.log"

    def closed(self, rank: int) -> Path:
        """Present once the rank has closed: its last beat and lines are in its files."""
        return self.root / f"rank-{rank:05d}.closed"

    @property
    def state(self) -> Path:
        """The node's gathering state (runtime/node_log.py: GatherState)."""
        return self.root / "gather.json"

    @property
    def lock_path(self) -> Path:
        return self.root / LOCK_NAME

    def beat_files(self) -> list[Path]:
        return sorted(self.root.glob("rank-*.beat"))

    def closed_ranks(self) -> set[int]:
        return {int(p.name[5:10]) for p in self.root.glob("rank-*.closed") if p.name[5:10].isdigit()}

    @contextlib.contextmanager
    def lock(self, timeout: float) -> Iterator[bool]:
        """Hold the node's lock (flock) for the block: yields True, or False when another rank
        held it for `timeout` seconds (a frozen holder must not freeze the node with it). A
        killed holder's lock goes with its process."""
        fd = os.open(self.lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            held = _flock(fd, timeout)
            try:
                yield held
            finally:
                if held:
                    fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def remove(self) -> None:
        """Remove the directory and what is left in it (the last rank of the node, at its close)."""
        shutil.rmtree(self.root, ignore_errors=True)


def _flock(fd: int, timeout: float, pause: float = 0.01) -> bool:
    deadline = time.monotonic() + timeout
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(pause)

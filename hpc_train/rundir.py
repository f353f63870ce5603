"""The run directory contract: one object owns every name under a run directory.

Everything that happens to a run is written here, so inspection works from files alone on any
login node, even with Slurm accounting off (the files and events: docs/run-directory.md).
"""

from __future__ import annotations

import contextlib
import errno
import itertools
import json
import logging
import os
import re
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

log = logging.getLogger(__name__)

EVENTS_FILE = "events.jsonl"
# sbatch's --output of a rendered script; sbatch puts the job id in place of %j.
SLURM_OUTPUT = "slurm-%j.out"
# The names `RunPaths.rank_log` gives, as `logs` and `diagnose` read them back.
RANK_LOG = re.compile(r"rank-(\d+)\.log")
# A node's log (`RunPaths.node_log`): the lines of every rank of the node, each "[rank N] ...".
NODE_LOG = re.compile(r"node-(.+)\.log")
HEARTBEAT_GLOB = "rank-*"       # heartbeat/ files of runs before node files, one per rank
NODE_HEARTBEAT_GLOB = "node-*.json"   # heartbeat/ files, one per node (RunPaths.node_heartbeat)
# Beside the run directories under the run root: the code snapshots, one folder per content
# hash (slurm/snapshot.py); a run's `code` link points into it.
CODE_CACHE = ".code"


def _per_run(stem: str, suffix: str, restart: int) -> str:
    return f"{stem}{suffix}" if not restart else f"{stem}-{restart}{suffix}"


def _rank_name(rank: int) -> str:
    return f"rank-{rank:05d}"


def host_file_name(host: str) -> str:
    """A host name as it may stand in a file name: anything but letters, digits, '.', '_'
    and '-' becomes '_'."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", host) or "_"


@dataclass(frozen=True)
class RunPaths:
    root: Path

    @property
    def spec(self) -> Path:
        return self.root / "spec.yaml"

    @property
    def sbatch(self) -> Path:
        return self.root / "sbatch.sh"

    @property
    def submitit(self) -> Path:
        return self.root / "submitit"

    @property
    def events(self) -> Path:
        return self.root / EVENTS_FILE

    @property
    def run_state(self) -> Path:
        """What the driver and the ranks decide from (run_state.py); events.jsonl is the record."""
        return self.root / "state.json"

    @property
    def metrics(self) -> Path:
        return self.root / "metrics.jsonl"

    @property
    def tensorboard(self) -> Path:
        return self.root / "tensorboard"

    @property
    def trackers(self) -> Path:
        """The experiment trackers' run ids and logged steps (runtime/tracker_state.py)."""
        return self.root / "trackers.json"

    @property
    def wandb(self) -> Path:
        """W&B's files (log.trackers: wandb): wandb/offline-run-<time>-<id>/ per segment."""
        return self.root / "wandb"

    @property
    def mlruns(self) -> Path:
        """MLflow's default file store (log.trackers: mlflow, log.mlflow.tracking_uri null)."""
        return self.root / "mlruns"

    @property
    def logs(self) -> Path:
        return self.root / "logs"

    @property
    def heartbeat(self) -> Path:
        return self.root / "heartbeat"

    @property
    def checkpoints(self) -> Path:
        return self.root / "checkpoints"

    @property
    def environment(self) -> Path:
        """One JSON line per capture: at submit, render and resume, and at each job start."""
        return self.root / "environment.jsonl"

    @property
    def code(self) -> Path:
        """A link to the run's code snapshot (`<run root>/.code/<sha256>`); absent without one."""
        return self.root / "code"

    @property
    def code_cache(self) -> Path:
        return self.root.parent / CODE_CACHE

    @property
    def gpu(self) -> Path:
        """NVML samples, one file per node (runtime/gpu_sampler.py); absent when none were taken."""
        return self.root / "gpu"

    def gpu_samples(self, host: str) -> Path:
        return self.gpu / f"{host}.jsonl"

    @property
    def timeline(self) -> Path:
        """The `report` command's timeline picture."""
        return self.root / "timeline.png"

    def slurm_output(self, job_id: str = "%j") -> Path:
        """A rendered script's batch output: sbatch's --output pattern, or one job's file
        (`job_id="*"` for a glob of every job's)."""
        return self.root / SLURM_OUTPUT.replace("%j", job_id)

    def evaluation(self, split: str, step: int) -> Path:
        """What `evaluate` writes for a split and a checkpoint step."""
        return self.root / f"eval-{split}-{step}.json"

    def rank_log(self, rank: int) -> Path:
        return self.logs / f"{_rank_name(rank)}.log"

    def rank_heartbeat(self, rank: int) -> Path:
        """A rank's own heartbeat file: runs before node files (runtime/node_beats.py) wrote
        these; read_beats still reads them."""
        return self.heartbeat / _rank_name(rank)

    def node_heartbeat(self, host: str) -> Path:
        """The beats of every rank on one node, written by one of them (runtime/node_beats.py)."""
        return self.heartbeat / f"node-{host_file_name(host)}.json"

    def node_log(self, host: str) -> Path:
        """The lines of every rank on one node, gathered there (log.rank_logs: per_node)."""
        return self.logs / f"node-{host_file_name(host)}.log"

    def horovod_timeline(self, restart: int = 0) -> Path:
        """Horovod's timeline (rank 0 writes it) of one run of the job: a requeued run writes
        its own, horovod-timeline-N.json, instead of truncating the first run's."""
        return self.root / _per_run("horovod-timeline", ".json", restart)

    def horovod_autotune_log(self, restart: int = 0) -> Path:
        return self.root / _per_run("horovod-autotune", ".csv", restart)

    def make_dirs(self) -> None:
        for path in (self.root, self.logs, self.heartbeat, self.checkpoints, self.submitit):
            path.mkdir(parents=True, exist_ok=True)

    @classmethod
    def new(cls, run_root: str | Path, name: str, now: datetime | None = None) -> RunPaths:
        """A fresh `<root>/<name>-<YYYYmmdd-HHMMSS>[-N]` directory, created here."""
        paths = cls(new_stamped_dir(run_root, name, now=now))
        paths.make_dirs()
        return paths


def _make_new(path: Path) -> bool:
    path.mkdir(parents=True)
    return True


def new_stamped_dir(root: str | Path, name: str, claim: Callable[[Path], bool] = _make_new,
                    now: datetime | None = None) -> Path:
    """The first `<root>/<name>-<YYYYmmdd-HHMMSS>[-N]` that `claim` takes: it creates what it
    needs there, exclusively, and says False (or raises FileExistsError) when it is taken."""
    stamp = (now or datetime.now()).strftime("%Y%m%d-%H%M%S")
    base = Path(root).resolve() / f"{name}-{stamp}"
    for n in itertools.count(1):
        candidate = base if n == 1 else base.with_name(f"{base.name}-{n}")
        with contextlib.suppress(FileExistsError):
            if claim(candidate):
                return candidate


def fsync_path(path: Path) -> None:
    """Make a file's data, or a directory's entries (a rename into it), durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, durable: bool = True) -> None:
    """Write `path` whole or not at all: a temporary file beside it, fsynced (unless not
    `durable`: a beat lost in a crash is stale anyway), renamed over it. A reader never sees half
    of it. The temporary name is this process's and thread's own: two writers sharing one (two
    ranks of a node at a hand-over, a rank's loop and its heartbeat thread) would rename each
    other's half-written file into place."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}-{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def append_jsonl(path: Path, record: dict) -> None:
    """Append one JSON line, whole or not at all.

    One O_APPEND write keeps lines whole across processes. A write that fails or comes up short
    (a full disk) is undone by truncating back to where it began, so no half line is left for
    the next writer's line to be glued to; the OSError is raised to the caller.
    """
    line = (json.dumps(record, separators=(",", ":"), default=str) + "\n").encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        before = os.fstat(fd).st_size
        try:
            written = os.write(fd, line)
        except OSError:
            _undo_append(fd, before, len(line))
            raise
        if written != len(line):
            _undo_append(fd, before, len(line))
            raise OSError(errno.ENOSPC, f"short write ({written} of {len(line)} bytes)", str(path))
    finally:
        os.close(fd)


def _undo_append(fd: int, before: int, length: int) -> None:
    """Cut our torn line off, unless more than it was appended since (another writer's line:
    then leave it to readers, which skip lines that do not parse)."""
    with contextlib.suppress(OSError):
        size = os.fstat(fd).st_size
        if before < size <= before + length:
            os.ftruncate(fd, before)


def parse_json(text: str):
    """json.loads, with JSON nested past Python's recursion limit raised as the ValueError that
    any other damage is (a run file's readers catch ValueError; a RecursionError would be a
    traceback)."""
    try:
        return json.loads(text)
    except RecursionError:
        raise ValueError("JSON nested deeper than Python reads") from None


def read_jsonl(path: Path) -> list[dict]:
    """Every line that is a JSON object. A damaged file (a torn last line from a killed writer,
    bytes that are not UTF-8 after a node crash) is read as far as it can be: bytes that do not
    decode are replaced, lines that do not parse are skipped, and both are said once, on the
    `hpc_train.rundir` logger (stderr in the CLI), never raised."""
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return []
    except OSError as exc:          # a directory in its place, no permission, an I/O error
        _say_once(path, -1, "%s cannot be read (%s); read as empty", path, exc.strerror or exc)
        return []
    records, replaced, skipped = [], 0, 0
    for raw in data.splitlines():
        try:
            line = raw.decode()
        except UnicodeDecodeError:
            line, replaced = raw.decode(errors="replace"), replaced + 1
        try:
            record = parse_json(line)
        except ValueError:
            record = None
        if isinstance(record, dict):
            records.append(record)
        elif line.strip():
            skipped += 1
    if replaced or skipped:
        _say_damage(path, len(data), replaced, skipped)
    return records


_DAMAGE_SAID: set[tuple[str, int]] = set()   # (path, size): said once per process and size


def _say_once(path: Path, size: int, message: str, *args) -> None:
    """A warning about `path` at this size (-1: unreadable), once per process."""
    if (str(path), size) in _DAMAGE_SAID:
        return
    _DAMAGE_SAID.add((str(path), size))
    log.warning(message, *args)


def _say_damage(path: Path, size: int, replaced: int, skipped: int) -> None:
    parts = ([f"{replaced} line(s) with bytes that are not UTF-8 (replaced)"] if replaced else []) + (
        [f"{skipped} line(s) that are not JSON records (skipped)"] if skipped else [])
    _say_once(path, size, "%s is damaged: %s; the rest is read", path, "; ".join(parts))

"""Atomic checkpoints written by several ranks; only complete ones are ever loaded.

Save protocol (every rank calls `save`, at the same step):
  1. `prepare`: rank 0 removes a leftover temporary directory of that step and creates it; barrier
  1b. a sharded job: every rank writes its shards into `sharded/` of the temporary directory
     (torch.distributed.checkpoint, a collective in the training thread; checkpoint/sharded.py)
  2. `write`: every rank writes its named files, then its own file (state that differs per
     rank), each as NAME.partial, fsynced, renamed to NAME: a rank file present means that
     rank is done; then "the peers are done" (a barrier, or for a background write rank 0
     polling for every rank file: no collective may run outside the training thread)
  3. rank 0 writes the replicated state and meta.json, fsyncs, renames the directory into
     place, writes the COMPLETE marker, fsyncs the parent, then applies retention; barrier
     (a background write: the training thread waits for it, then a barrier, at a stop and at
     the end of training)
A kill at any point leaves either no new directory, or one without its marker: both ignored.
"""

from __future__ import annotations

import contextlib
import json
import pickle
import logging
import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path

import torch

from hpc_train.checkpoint import layout
from hpc_train.checkpoint.retention import steps_to_delete
from hpc_train.errors import CheckpointError
from hpc_train.rundir import fsync_path

log = logging.getLogger("hpc_train.checkpoint")
# What torch.load raises on a missing, truncated or foreign file (weights_only refusals included).
_LOAD_ERRORS = (OSError, RuntimeError, ValueError, EOFError, pickle.UnpicklingError)


def _save_file(obj, path: Path) -> None:
    """Written as NAME.partial, fsynced, renamed: NAME exists only once it is whole on disk."""
    partial = path.with_name(path.name + ".partial")
    with open(partial, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(partial, path)


def remove_checkpoint(directory: Path) -> None:
    """Marker first (made durable), then the files: a kill half-way leaves a directory that no
    longer counts as complete, never one that counts but lacks its weights."""
    with contextlib.suppress(FileNotFoundError):
        (directory / layout.MARKER).unlink()
        fsync_path(directory)
    shutil.rmtree(directory, ignore_errors=True)


class CheckpointManager:
    def __init__(self, root: Path, rank: int, world_size: int, barrier: Callable[[], None],
                 keep_last: int = 3, keep_every: int | None = None):
        self.root, self.rank, self.world_size = Path(root), rank, world_size
        self.barrier, self.keep_last, self.keep_every = barrier, keep_last, keep_every
        self.root.mkdir(parents=True, exist_ok=True)

    def latest(self) -> int | None:
        return layout.latest_complete(self.root)

    def complete_steps(self) -> list[int]:
        return layout.list_complete(self.root)

    def save(self, step: int, replicated: dict, per_rank: dict, meta: dict,
             files: dict[str, dict] | None = None,
             sharded: Callable[[Path], None] | None = None) -> Path:
        """The whole protocol, with barriers (every rank, same step). `files`: more named files
        this rank writes (a pipeline stage's state, written by one rank per stage); read back
        with `load_file`. `sharded`: writes this rank's shards into the directory it is given
        (step 1b; every rank); read back from `sharded_part`."""
        self.prepare(step)
        if sharded is not None:
            self.write_sharded(step, sharded)
        final = self.write(step, replicated, per_rank, meta, files)
        # Nobody leaves before rank 0 is done: a rank that exits right after a stop-save would
        # make mpirun tear down rank 0 in the middle of writing.
        self.barrier()
        return final

    def prepare(self, step: int) -> None:
        """Step 1 (a collective: the training thread, every rank): an empty temporary directory."""
        tmp = self.root / layout.tmp_dir_name(step)
        if self.rank == 0:
            shutil.rmtree(tmp, ignore_errors=True)   # a save of this step killed earlier
            tmp.mkdir()
        self.barrier()

    def sharded_temporary(self, step: int) -> Path:
        """Where step 1b writes the shards of `step`, after `prepare`."""
        return self.root / layout.tmp_dir_name(step) / layout.SHARDED

    def write_sharded(self, step: int, write: Callable[[Path], None]) -> None:
        """Step 1b (every rank, after `prepare`): `write` puts this rank's shards into the
        temporary directory's `sharded/`, in its library's format (which need not fsync); they
        are made durable here, before this rank's own file says it is done."""
        directory = self.sharded_temporary(step)
        write(directory)
        if directory.is_dir():
            for path in sorted((directory, *directory.rglob("*")), reverse=True):   # files first
                fsync_path(path)
            fsync_path(directory.parent)

    def sharded_part(self, step: int) -> Path | None:
        """The sharded directory of the complete checkpoint of `step`; None if it has none."""
        directory = self.root / layout.step_dir_name(step) / layout.SHARDED
        return directory if directory.is_dir() else None

    def write(self, step: int, replicated: dict, per_rank: dict, meta: dict,
              files: dict[str, dict] | None = None,
              peers_done: Callable[[], None] | None = None) -> Path:
        """Steps 2 and 3 after `prepare`. `peers_done` returns once every rank's files are
        written (default: the barrier; a background write passes one without a collective)."""
        final = self.root / layout.step_dir_name(step)
        tmp = self.root / layout.tmp_dir_name(step)
        for name, obj in (files or {}).items():
            _save_file(obj, tmp / name)
        _save_file(per_rank, tmp / layout.rank_file_name(self.rank))   # last: "this rank is done"
        (peers_done or self.barrier)()
        if self.rank == 0 and (final / layout.MARKER).is_file():
            # This step is saved and complete already (an explicit resume from an older step
            # came back to it): keep the one that counts; only rank 0 decides, so no rank waits.
            log.info("checkpoint %s exists and is complete; keeping it", final)
            shutil.rmtree(tmp, ignore_errors=True)
        elif self.rank == 0:
            shutil.rmtree(final, ignore_errors=True)  # renamed but killed before its marker
            _save_file(replicated, tmp / layout.REPLICATED)
            (tmp / layout.META).write_text(json.dumps({**meta, "step": step,
                                                       "world_size": self.world_size,
                                                       "time": time.time()}, indent=1))
            fsync_path(tmp / layout.META)
            fsync_path(tmp)
            os.replace(tmp, final)
            marker = final / layout.MARKER
            marker.write_text(f"{step}\n")
            fsync_path(marker)
            fsync_path(self.root)
            self._apply_retention()
        return final

    def wait_for_rank_files(self, step: int, timeout: float, poll: float = 0.05) -> None:
        """Rank 0, background write: return once every rank's file of `step` is in the
        temporary directory. On NFS a new name can take up to its attribute-cache time
        (acdirmax, ~60 s) to show: `timeout` must be longer."""
        tmp = self.root / layout.tmp_dir_name(step)
        names = {layout.rank_file_name(rank) for rank in range(self.world_size)}
        deadline = time.monotonic() + timeout
        while True:
            try:
                missing = names - set(os.listdir(tmp))
            except FileNotFoundError:
                missing = names
            if not missing:
                return
            if time.monotonic() > deadline:
                raise CheckpointError(f"{tmp}: after {timeout:.0f} s still no "
                                      f"{', '.join(sorted(missing)[:4])}"
                                      f"{' ...' if len(missing) > 4 else ''}: those ranks did not "
                                      "finish writing their part of the checkpoint")
            time.sleep(poll)

    def _apply_retention(self) -> None:
        for step in steps_to_delete(layout.list_complete(self.root), self.keep_last, self.keep_every):
            remove_checkpoint(self.root / layout.step_dir_name(step))
        for leftover in self.root.glob(".step-*.tmp"):
            shutil.rmtree(leftover, ignore_errors=True)

    def set_aside(self, step: int) -> Path:
        """Move a complete checkpoint that does not load out of the way (rank 0 only): it no
        longer counts, a new save of its step is not mistaken for it, and it stays to inspect."""
        target = self.root / layout.unloadable_dir_name(step)
        shutil.rmtree(target, ignore_errors=True)
        os.replace(self.root / layout.step_dir_name(step), target)
        fsync_path(self.root)
        return target

    def load(self, step: int | None = None) -> tuple[dict, dict | None, dict]:
        """(replicated, this rank's own state or None, meta) of `step` (default: latest complete)."""
        step = self.latest() if step is None else step
        if step is None:
            raise CheckpointError(f"no complete checkpoint under {self.root}")
        directory = self.root / layout.step_dir_name(step)
        if not (directory / layout.MARKER).is_file():
            raise CheckpointError(f"{directory} is not complete (no {layout.MARKER} marker)")
        try:
            meta = json.loads((directory / layout.META).read_text())
            # weights_only: a checkpoint is data; loading one must never run code.
            replicated = torch.load(directory / layout.REPLICATED, map_location="cpu", weights_only=True)
            own = directory / layout.rank_file_name(self.rank)
            per_rank = torch.load(own, map_location="cpu", weights_only=True) if own.is_file() else None
        except _LOAD_ERRORS as exc:
            raise CheckpointError(f"cannot load checkpoint {directory}: {exc}") from exc
        return replicated, per_rank, meta

    def load_file(self, step: int, name: str) -> dict:
        """A named file saved with `save(files=...)`, from the complete checkpoint of `step`."""
        path = self.root / layout.step_dir_name(step) / name
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except _LOAD_ERRORS as exc:
            raise CheckpointError(f"cannot load {path}: {exc}") from exc

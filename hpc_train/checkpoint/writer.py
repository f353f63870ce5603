"""One checkpoint write at a time, in a background thread, with bounded waits.

The training loop hands a write (serialise, fsync, rename, marker: `CheckpointManager.write`) to
`BackgroundWriter.submit` and goes on; the next submit, a stop for requeue and the end of
training first `wait` for it. The thread is a daemon: a rank that fails or is killed does not
wait for it, and a write cut off half-way leaves a temporary directory that never counts.

Errors of a write are raised in the training thread, as they were raised there: at the next
`wait`, or at `raise_if_failed` (called every step), so a full disk fails the rank with its
own OSError (ENOSPC), as a synchronous save would.

Forks: a DataLoader worker forked while this thread holds a lock (in torch.save, logging, the
allocator) would inherit that lock held forever. `guard_forks` registers a hook that waits for
the write before any `os.fork()` of this process (the validation loader starts its workers at
the first evaluation, possibly while a periodic save is being written).
"""

from __future__ import annotations

import logging
import os
import threading
import weakref
from collections.abc import Callable

from hpc_train.errors import CheckpointError

log = logging.getLogger("hpc_train.checkpoint")
_guarded: weakref.WeakSet = weakref.WeakSet()


class BackgroundWriter:
    def __init__(self, timeout: float):
        self.timeout = timeout
        self._thread: threading.Thread | None = None
        self._error: BaseException | None = None

    @property
    def busy(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, write: Callable[[], None]) -> None:
        """Start `write` in the background, after the previous one has finished."""
        self.wait()
        self._thread = threading.Thread(target=self._run, args=(write,), daemon=True,
                                        name="checkpoint-writer")
        self._thread.start()

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
        except BaseException as exc:  # noqa: BLE001 - handed to the training thread
            log.error("background checkpoint write failed: %s: %s", type(exc).__name__, exc)
            self._error = exc

    def wait(self, timeout: float | None = None) -> None:
        """Block until the pending write is done (at most `timeout`, default the writer's);
        raise its error, or CheckpointError when it is still running after the timeout."""
        thread = self._thread
        if thread is not None:
            limit = self.timeout if timeout is None else timeout
            thread.join(limit)
            if thread.is_alive():
                raise CheckpointError(f"a background checkpoint write is still running after "
                                      f"{limit:.0f} s (the file system is slow or hung; the "
                                      "limit is launch.stall_seconds)")
            self._thread = None
        self.raise_if_failed()

    def raise_if_failed(self) -> None:
        """Raise the error of a finished write, once (cheap: no waiting)."""
        error, self._error = self._error, None
        if error is not None:
            raise error


def _before_fork() -> None:
    for writer in list(_guarded):
        try:
            writer.wait()
        except BaseException as exc:  # noqa: BLE001 - the error stays for the training thread
            writer._error = writer._error or exc
            log.warning("fork while a checkpoint write failed or hung: %s", exc)


_hook_installed = False


def guard_forks(writer: BackgroundWriter) -> None:
    """Make every later os.fork() of this process wait for `writer`'s pending write first."""
    global _hook_installed
    _guarded.add(writer)
    if not _hook_installed:
        os.register_at_fork(before=_before_fork)
        _hook_installed = True

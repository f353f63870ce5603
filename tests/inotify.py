"""The kernel's own count of writes to a directory (inotify through ctypes), for tests that bound
what our code does on the shared file system without trusting a counter of our own.

A rename into the directory is an IN_MOVED_TO with its own cookie: the kernel never merges two of
them. IN_MODIFY (a write(2)) events that are identical and not yet read are merged, so a test
that counts them drains the queue between the writes it means to tell apart.
"""

from __future__ import annotations

import ctypes
import os
import struct
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

IN_MODIFY = 0x002
IN_CLOSE_WRITE = 0x008
IN_MOVED_TO = 0x080
IN_CREATE = 0x100
IN_Q_OVERFLOW = 0x4000
_HEADER = struct.Struct("iIII")
_libc = ctypes.CDLL("libc.so.6", use_errno=True)


@dataclass(frozen=True)
class Event:
    directory: Path
    mask: int
    name: str


class Watch:
    """inotify watches on directories; `events()` drains what the kernel queued since."""

    def __init__(self, *directories: Path, mask: int = IN_MODIFY | IN_CLOSE_WRITE | IN_MOVED_TO | IN_CREATE):
        self.fd = _libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC)
        if self.fd < 0:
            raise OSError(ctypes.get_errno(), "inotify_init1")
        self.directories: dict[int, Path] = {}
        for directory in directories:
            wd = _libc.inotify_add_watch(self.fd, str(directory).encode(), mask)
            if wd < 0:
                raise OSError(ctypes.get_errno(), f"inotify_add_watch {directory}")
            self.directories[wd] = Path(directory)

    def events(self) -> list[Event]:
        found = []
        while True:
            try:
                data = os.read(self.fd, 1 << 20)
            except BlockingIOError:
                return found
            offset = 0
            while offset < len(data):
                wd, mask, _cookie, length = _HEADER.unpack_from(data, offset)
                name = data[offset + _HEADER.size:offset + _HEADER.size + length].rstrip(b"\0").decode()
                offset += _HEADER.size + length
                if mask & IN_Q_OVERFLOW:
                    raise AssertionError("inotify queue overflowed: events were lost, the count is not exact")
                found.append(Event(self.directories.get(wd, Path("?")), mask, name))

    def close(self) -> None:
        os.close(self.fd)


def count(events: list[Event], mask: int) -> Counter:
    """How many events of `mask` each file name had."""
    return Counter(e.name for e in events if e.mask & mask)

"""Waiting for a write in a folder without waking up to look: Linux inotify (through libc, no package),
else a plain timed sleep.

``runs follow`` (the app follows every run of this machine through it, and a host's over ssh) used to
look at the run's files every 50 ms: twenty wake-ups a second for each followed run, on the cores the
run itself trains on (a training step of two OpenMP threads on two cores waits for the one that was
put aside). Waiting on the folder's inotify descriptor instead, it wakes when a file there is written
(a log line, an event, the status) and sleeps otherwise. A filesystem whose writes inotify does not
see (NFS written from another machine) still gets a look every ``cap_s``.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import select
import sys
import time
from pathlib import Path

# <sys/inotify.h>
_IN_MODIFY = 0x002
_IN_CLOSE_WRITE = 0x008
_IN_MOVED_TO = 0x080
_IN_CREATE = 0x100
_MASK = _IN_MODIFY | _IN_CLOSE_WRITE | _IN_MOVED_TO | _IN_CREATE


class FolderWatch:
    """``wait(timeout)`` returns when a file in ``folder`` was written since the last wait (at once if
    one was), or after ``timeout`` seconds (at most ``cap_s``); ``watching`` says whether inotify is in
    use (else each wait is a sleep of at most ``fallback_s``)."""

    def __init__(self, folder: str | Path, *, cap_s: float = 0.5, fallback_s: float = 0.05) -> None:
        self.cap_s, self.fallback_s = cap_s, fallback_s
        self._fd = -1
        if sys.platform.startswith("linux"):
            with contextlib.suppress(OSError, AttributeError):
                libc = ctypes.CDLL(None, use_errno=True)
                fd = int(libc.inotify_init1(os.O_NONBLOCK | os.O_CLOEXEC))
                if fd >= 0:
                    if int(libc.inotify_add_watch(fd, os.fsencode(str(folder)), _MASK)) >= 0:
                        self._fd = fd
                    else:
                        os.close(fd)

    @property
    def watching(self) -> bool:
        return self._fd >= 0

    def wait(self, timeout: float) -> bool:
        """Whether something was written (False: the time ran out, or no inotify to tell)."""
        timeout = max(0.0, min(timeout, self.cap_s))
        if self._fd < 0:
            time.sleep(min(timeout, self.fallback_s))
            return False
        try:
            ready, _w, _x = select.select([self._fd], [], [], timeout)
        except (OSError, ValueError):
            return False
        if not ready:
            return False
        self.drain()
        return True

    def fileno(self) -> int:
        """The inotify descriptor (readable when something was written; -1 without inotify), for an
        event loop to wait on (the agent's asyncio loop); ``drain`` after each wake."""
        return self._fd

    def drain(self) -> None:
        with contextlib.suppress(BlockingIOError, OSError):
            while os.read(self._fd, 65536):  # the events themselves say nothing we need: drained
                pass

    def close(self) -> None:
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> FolderWatch:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


__all__ = ["FolderWatch"]

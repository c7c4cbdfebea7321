"""The one atomic file write of the package: a unique temporary file in the same folder, written,
flushed and fsync'd, then renamed over the target.

Every writer of a file that another process may read at the same moment (status.json, hosts.json, a
job file, an evaluation's results, the detach announce file, a rank's record) goes through here. A
fixed temporary name (``status.json.tmp``) is not enough: two writers truncate each other's
temporary and one ``os.replace`` finds it gone (measured: ~530 FileNotFoundError per 20,000 writes
with two writers), and a reader between the truncate and the rename of a shared temporary sees an
empty file. A unique name per write makes each rename atomic on its own: a reader sees the old file
or the new one, whole. Qt-free and torch-free.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

#: Run folders, reports and hosts files are the user's business.
PRIVATE = 0o600


def write_text(path: str | Path, text: str, *, mode: int = PRIVATE, fsync: bool = True) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically with permissions ``mode``. A failed write (a full
    disk) leaves the old file as it was and no temporary file behind; the error is raised."""
    write_bytes(path, text.encode("utf-8"), mode=mode, fsync=fsync)


def write_bytes(path: str | Path, data: bytes, *, mode: int = PRIVATE, fsync: bool = True) -> None:
    path = Path(path)
    # mkstemp: O_EXCL with a random name, created 0600 whatever the umask.
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            if fsync:
                os.fsync(fh.fileno())
        if mode != PRIVATE:
            os.chmod(tmp, mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def write_json(path: str | Path, data: Any, *, mode: int = PRIVATE, indent: int | None = 2,
               fsync: bool = True) -> None:
    write_text(path, json.dumps(data, indent=indent, default=str, ensure_ascii=False), mode=mode, fsync=fsync)


@contextlib.contextmanager
def locked(path: str | Path) -> Iterator[None]:
    """An exclusive advisory lock on ``path`` + ".lock" for a read-modify-write of ``path`` by
    several processes (the app and ``gaudi-gui hosts --add`` changing hosts.json together)."""
    lock = Path(str(path) + ".lock")
    lock.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, PRIVATE)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)


__all__ = ["PRIVATE", "locked", "write_bytes", "write_json", "write_text"]

"""Processes named by (pid, create time), so a recycled pid is never signalled, and process trees.

A pid alone is not an identity: after a reboot, or once enough processes have come and gone, the pid
recorded in a run folder belongs to someone else. Every pid the app keeps on disk travels with the
process's create time (psutil's, seconds since the epoch), and every signal goes through
``ProcessRef.signal``, which checks it first. Qt-free.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import psutil

# psutil is imported where it is used, not here: it costs ~40 ms, and the run store (which the app
# loads before its first paint) only needs ``ProcessRef`` as a value until a process is looked up.

#: psutil's create times are rounded by the kernel's clock ticks; two reads of one process agree to
#: well within this, two different processes on one pid differ by far more.
CREATE_TIME_TOLERANCE = 0.05


@dataclass(frozen=True)
class ProcessRef:
    pid: int
    create_time: float

    @classmethod
    def of(cls, pid: int) -> ProcessRef | None:
        """The process now running as ``pid``, or None when there is none."""
        if pid <= 0:
            return None
        import psutil

        try:
            return cls(pid, psutil.Process(pid).create_time())
        except psutil.Error:
            return None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProcessRef | None:
        pid, created = data.get("pid"), data.get("create_time")
        if isinstance(pid, bool) or not isinstance(pid, int) or pid <= 0:
            return None
        if isinstance(created, bool) or not isinstance(created, (int, float)):
            return None
        return cls(pid, float(created))

    def to_dict(self) -> dict[str, Any]:
        return {"pid": self.pid, "create_time": self.create_time}

    def process(self) -> psutil.Process | None:
        """The live process, only if it is still the one recorded (not a zombie, not a reused pid)."""
        import psutil

        try:
            proc = psutil.Process(self.pid)
            if abs(proc.create_time() - self.create_time) > CREATE_TIME_TOLERANCE:
                return None
            if proc.status() == psutil.STATUS_ZOMBIE:
                return None
            return proc
        except psutil.Error:
            return None

    def is_alive(self) -> bool:
        return self.process() is not None

    def signal(self, sig: int) -> bool:
        """Send ``sig`` if this is still the recorded process; True when it was sent."""
        proc = self.process()
        if proc is None:
            return False
        import psutil

        try:
            proc.send_signal(sig)
        except psutil.Error:
            return False
        return True


def descendants(pid: int) -> list[ProcessRef]:
    """The live descendants of ``pid`` (a scan of the process table: call it on demand only)."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    out = []
    for child in children:
        with contextlib.suppress(psutil.Error):
            out.append(ProcessRef(child.pid, child.create_time()))
    return out


def signal_group(leader: ProcessRef, sig: int) -> bool:
    """Signal the process group that ``leader`` leads, when it still runs and leads its own group
    that is not ours (``os.killpg(0, ...)`` or our own group would hit the app itself)."""
    proc = leader.process()
    if proc is None:
        return False
    try:
        pgid = os.getpgid(leader.pid)
    except OSError:
        return False
    if pgid != leader.pid or pgid == os.getpgrp() or pgid <= 1:
        return False
    try:
        os.killpg(pgid, sig)
    except OSError:
        return False
    return True


__all__ = ["CREATE_TIME_TOLERANCE", "ProcessRef", "descendants", "signal_group"]

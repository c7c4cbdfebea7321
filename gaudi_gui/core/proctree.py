"""Processes named by (pid, create time), so a recycled pid is never signalled, and process trees.

A pid alone is not an identity: after a reboot, or once enough processes have come and gone, the pid
recorded in a run folder belongs to someone else. Every pid the app keeps on disk travels with the
process's create time (psutil's, seconds since the epoch), and every signal goes through
``ProcessRef.signal``, which checks it first. A tree this process started and watches while it runs
(:class:`ProcessTree`) holds psutil objects instead: psutil checks the create time itself before it
signals one. Every process-tree record and kill (the agent's children, the hosts' guard, the
``devices`` command, the doctor's smoke test, the training stopper) goes through this module. Qt-free.

Recording a tree reads the whole process table (psutil's ``children`` builds a pid -> parent map of
every process: 1.5 ms with 100 processes, 60 ms with 1,100 on a busy 2-core machine): never on a
window's thread (the window holds no process).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
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

_log = logging.getLogger(__name__)


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


def pids_since(pid: int, last: int, pids: list[int]) -> list[int]:
    """Those of ``pids`` handed out after ``pid`` when ``last`` is the newest one handed out.

    The kernel hands pids out in a cycle (the next free one after the last, from the bottom again past
    ``pid_max``): the newer ones are those in (pid, last], or, when the cycle wrapped since, above
    ``pid`` or at most ``last``. Right only while less than a whole cycle passed since ``pid``: ask it
    for a child that has just started."""
    if last >= pid:
        return [p for p in pids if pid < p <= last]
    return [p for p in pids if p > pid or p <= last]


def _parent_of(pid: int) -> int | None:
    """The parent pid in /proc/PID/stat (None: gone). The command name, in parentheses, may hold any
    character: the fields after its last ')' are read."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
        return int(data[data.rfind(b")") + 2:].split()[1])
    except (OSError, ValueError, IndexError):
        return None


def fresh_descendants(root: psutil.Process) -> list[psutil.Process] | None:
    """The descendants of a child that has just started, read from the processes started after it
    (``pids_since``, with the newest pid from /proc/loadavg); None when that cannot be told here (no
    /proc/loadavg, or the child is not in this /proc's listing), for a scan of the whole table.

    psutil's ``children`` reads every process's stat (60 ms with 1,100 processes on a busy 2-core
    machine); a child started a moment ago has only the processes started since as candidates."""
    import psutil

    try:
        listed = [int(name) for name in os.listdir("/proc") if name.isdigit()]
        # Read after the listing: every pid listed was handed out at or before this one.
        with open("/proc/loadavg", "rb") as f:
            last = int(f.read().split()[-1])
    except (OSError, ValueError, IndexError):
        return None
    if root.pid not in listed or last <= 0:
        return None  # another pid namespace's /proc, or a /proc/loadavg we do not understand
    children: dict[int, list[int]] = {}
    for pid in pids_since(root.pid, last, listed):
        parent = _parent_of(pid)
        if parent is not None:
            children.setdefault(parent, []).append(pid)
    found: list[psutil.Process] = []
    started = root.create_time()
    frontier = [root.pid]
    while frontier:
        for pid in children.get(frontier.pop(), []):
            try:
                proc = psutil.Process(pid)
                if proc.create_time() + CREATE_TIME_TOLERANCE < started:
                    continue  # not started after the child: a pid handed out again meanwhile
            except psutil.Error:
                continue
            found.append(proc)
            frontier.append(pid)
    return found


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


class ProcessTree:
    """A child this process started and every descendant seen while it ran, to end all of them.

    ``group``: the child was started in a session of its own (``start_new_session``), so its process
    group id is its pid and the group holds the helpers that left the tree (a wrapper's ``cmd &``);
    the group is signalled even after the child itself ended, since a group id is not reused while
    a member lives. Descendants are held as psutil objects, which never signal a recycled pid;
    :meth:`record` scans the whole process table, so call it when it matters (at start, when a stop
    begins), not periodically, and not on a window's thread. The recorded set is
    guarded by a lock: one thread records while another asks :meth:`pids`."""

    def __init__(self, pid: int, *, group: bool = True) -> None:
        import psutil

        self.pid = pid
        self.group = group
        self._seen: dict[int, psutil.Process] = {}
        self._lock = threading.Lock()
        self._root: psutil.Process | None = None
        with contextlib.suppress(psutil.Error):
            self._root = psutil.Process(pid) if pid > 0 else None

    def pids(self) -> list[int]:
        """The descendants recorded so far (alive or not)."""
        with self._lock:
            return sorted(self._seen)

    def record(self, *, fresh: bool = False) -> None:
        """Add the child's live descendants to those recorded (nothing once its pid is not the child's).

        ``fresh``: the child has just started, so its descendants are among the processes started
        after it: only the pids handed out since its own are read (:func:`fresh_descendants`, a few
        files instead of the whole table), the whole table where that cannot be told."""
        import psutil

        root = self._root
        if root is None:
            return
        try:
            if not root.is_running():
                return  # reaped, and the pid perhaps someone else's now
            children = fresh_descendants(root) if fresh else None
            if children is None:
                children = root.children(recursive=True)
        except psutil.Error:
            return
        with self._lock:
            for child in children:
                self._seen[child.pid] = child

    def freeze(self) -> None:
        """SIGSTOP the group: stopped members fork nothing, so a kill that follows misses no child
        (a wrapper starting ``setsid helper &`` at that moment). Their children are still found."""
        if self.group:
            self._killpg(signal.SIGSTOP)

    def signal(self, sig: int) -> None:
        """``sig`` to the child's group, or to the child alone when it has none."""
        if self.group:
            self._killpg(sig)
        elif self._root is not None:
            import psutil

            with contextlib.suppress(psutil.Error):
                self._root.send_signal(sig)

    def signal_recorded(self, sig: int) -> None:
        """``sig`` to every recorded descendant still running (those in sessions of their own, such
        as torchrun's workers, are reached only this way)."""
        import psutil

        with self._lock:
            recorded = list(self._seen.values())
        for proc in recorded:
            with contextlib.suppress(psutil.Error):
                proc.send_signal(sig)

    def kill(self) -> None:
        """SIGKILL the child, its group and every descendant: recorded before, or found now.

        The child itself is signalled too, not only through its group: one killed right after its
        fork may not have called ``setsid`` yet, so no group of its id exists to signal."""
        self.freeze()
        self.record()
        self.signal(signal.SIGKILL)
        if self.group and self._root is not None:
            import psutil

            with contextlib.suppress(psutil.Error):
                self._root.send_signal(signal.SIGKILL)
        self.signal_recorded(signal.SIGKILL)

    def _killpg(self, sig: int) -> None:
        if self.pid <= 1 or self.pid == os.getpgrp():
            return  # never our own group (or init's)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)


__all__ = ["CREATE_TIME_TOLERANCE", "ProcessRef", "ProcessTree", "descendants",
           "fresh_descendants", "pids_since", "signal_group"]

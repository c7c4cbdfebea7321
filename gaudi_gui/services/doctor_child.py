"""One ``gaudi-gui doctor`` child run and read off the window's thread: the start gate's checks
(services.preflight) and the health service's periodic checks of every watched host (services.health,
which the Health view and the Hosts tab show).

The child runs through ``core.child.run`` (the Qt-free runner the command line uses too: a session of
its own, both streams read, the whole tree killed at its timeout or when asked), on a thread of its
own, which then runs ``read`` (the report's JSON parse, the findings); the window's thread only gets
what ``read`` returned, by a queued signal. A host that does not answer is named, never waited for.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import signal
import threading
import time
import traceback
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core import child as core_child

#: What reads a doctor's end (``core.child.Outcome``) on the doctor's thread; ``ended`` carries its value.
Reader = Callable[[core_child.Outcome], object]

#: The doctors whose thread still runs, and whether this interpreter is exiting (then no thread emits
#: into Qt any more: the objects it would reach may be gone).
_RUNNING: dict[int, DoctorChild] = {}
_RUNNING_LOCK = threading.Lock()
_EXITING = threading.Event()


class _Launcher:
    """One long-lived thread that starts each doctor's own thread. ``Thread.start`` waits until the new
    thread runs, which on a loaded 2-core machine is a wait for the scheduler (155 ms measured on the
    window's thread with a load of 9); made here, that wait is this thread's, and the window's thread
    only puts the doctor in a queue."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[DoctorChild] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, doctor: DoctorChild) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="gaudi-gui-doctor-launcher",
                                                daemon=True)
                self._thread.start()
        self._queue.put(doctor)

    def _run(self) -> None:
        while True:
            doctor = self._queue.get()
            holder = [doctor]  # the doctor's thread takes it from here: this thread keeps no reference
            thread = threading.Thread(target=_doctor_thread, args=(holder,), name="gaudi-gui-doctor",
                                      daemon=True)
            doctor._thread = thread
            del doctor
            thread.start()


class _Reaper(QObject):
    """Lives on the window's thread. A doctor's thread hands its DoctorChild here when it is done, so the
    last reference to it — and through it (its reader, its connections) to its owner's objects — is
    dropped on the thread that owns them. Dropped on the doctor's thread, it destroyed a service and its
    timers there ("QObject::killTimer: Timers cannot be stopped from another thread"), and the next
    turn of the window's event loop crashed (a fresh-clone run: segmentation fault in processEvents)."""

    release = Signal(object)  # a doctor's key in _RUNNING (an id: no 32-bit int), from its thread, queued

    def __init__(self) -> None:
        super().__init__()
        self.release.connect(self._release)

    def _release(self, key: int) -> None:
        with _RUNNING_LOCK:
            doctor = _RUNNING.pop(key, None)
        del doctor  # the last reference, dropped here, on the window's thread


_LAUNCHER = _Launcher()
_REAPER: _Reaper | None = None  # made by the first start(), on the window's thread


def _doctor_thread(holder: list[DoctorChild]) -> None:
    doctor = holder.pop()
    key = id(doctor)
    try:
        doctor._run()
    except Exception:  # said; its traceback (which holds the doctor) is let go here
        traceback.print_exc()
    # This thread's reference goes before the window's thread is told: emitted first, the window's
    # thread could pop the doctor from _RUNNING before this frame ended, and then this thread's
    # reference was the last (fresh-clone CI: an owner's timer destroyed here, then a crash).
    del doctor
    reaper = _REAPER
    try:
        if reaper is None or _EXITING.is_set():
            raise RuntimeError("exiting")
        reaper.release.emit(key)
    except RuntimeError:  # the interpreter is exiting (the reaper may be gone)
        with _RUNNING_LOCK:
            _RUNNING.pop(key, None)


@atexit.register
def end_all(timeout_s: float = 5.0) -> None:
    """Kill every doctor still running and wait (up to ``timeout_s``) for their threads: at exit, so
    no thread is left emitting into a Qt that is being torn down."""
    _EXITING.set()
    with _RUNNING_LOCK:
        doctors = list(_RUNNING.values())
    for doctor in doctors:
        doctor.kill()
    deadline = time.monotonic() + timeout_s
    for doctor in doctors:
        thread = doctor._thread
        if thread is not None and thread.is_alive():
            thread.join(max(0.0, deadline - time.monotonic()))


class DoctorChild(QObject):
    """One doctor child started, waited for and read on a thread of its own; ``ended(result)`` on the
    object's own (the window's) thread, once, with what ``read`` made of the child's end.

    Through ``QProcess`` each start ran on the window's thread: Qt 6.11 starts a child with
    ``clone(CLONE_VM|CLONE_VFORK)``, which suspends the calling thread until the child has called
    exec, so on a loaded 2-core machine the window waited for the new child to be scheduled (3 ms
    typically, up to 90 ms measured in bench/bench_hosts.py's run), and the child's output, its end,
    its process-tree bookkeeping and the report's parse were slots there too. ``subprocess`` also
    forks with vfork (checked with strace): here it is the doctor's thread that waits.

    ``thread_ids`` records the thread that started the child (``"start"``) and the one that read its
    output (``"read"``), so a test can tell they were not the window's."""

    #: The child is gone and its end read: carries what ``read`` returned.
    ended = Signal(object)
    _done = Signal(object)  # emitted on the doctor's thread, delivered queued on the object's thread

    def __init__(self, parent: QObject, read: Reader, tail_lines: int = 40) -> None:
        super().__init__(parent)
        self._read = read
        self._tail_lines = tail_lines
        #: The child's end, once ``ended`` was delivered.
        self.outcome: core_child.Outcome | None = None
        self.thread_ids: dict[str, int] = {}
        self._stop = threading.Event()
        self._child: core_child.Child | None = None
        self._thread: threading.Thread | None = None  # set by the launcher
        self._started = False
        self._argv: list[str] = []
        self._timeout_s = 0.0
        self._retired = False
        self._done.connect(self._on_done)

    @property
    def done(self) -> bool:
        return self.outcome is not None

    def start(self, argv: list[str], timeout_ms: int) -> None:
        """Run ``argv`` (one element each: nothing reaches a shell here) on a thread of its own."""
        global _REAPER
        if _REAPER is None:
            _REAPER = _Reaper()  # on this (the window's) thread
        self._argv, self._timeout_s = list(argv), timeout_ms / 1000
        self._started = True
        with _RUNNING_LOCK:
            _RUNNING[id(self)] = self  # until the window's thread releases it (_Reaper)
        _LAUNCHER.submit(self)  # no thread is started here (see _Launcher)

    def is_running(self) -> bool:
        """True from ``start`` until ``ended`` was delivered (the child may be gone already)."""
        return self._started and not self.done

    def kill(self) -> None:
        """End the child and everything it started now; ``ended`` still follows."""
        self._stop.set()
        running = self._child
        if running is not None and running.poll() is None:
            # One system call here (the child leads its own group); its thread finds and kills the
            # descendants that left the group (core.child.run), off this thread.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(running.pid, signal.SIGKILL)

    def retire(self) -> None:
        """Kill the child, report nothing, and delete this object once its thread is done."""
        self._retired = True  # (not blockSignals: the thread's own queued signal must still come)
        self.kill()
        if not self._started or self.done:
            self.deleteLater()

    # -- the doctor's thread ----------------------------------------------------------------------

    def _run(self) -> None:
        try:
            self.thread_ids["start"] = threading.get_ident()
            if _EXITING.is_set():
                self._stop.set()
            outcome = core_child.run(self._argv, self._timeout_s, stop=self._stop,
                                     tail_lines=self._tail_lines, started=self._on_started)
            self.thread_ids["read"] = threading.get_ident()
            try:
                result = self._read(outcome)
            except Exception as exc:  # a reader's bug must still end the check
                result = exc
            if not _EXITING.is_set():
                with contextlib.suppress(RuntimeError):  # the object was deleted with its parent (app exit)
                    self._done.emit((outcome, result))
        finally:
            self._child = None  # nothing of this run is kept by the thread (see _doctor_thread)

    def _on_started(self, running: core_child.Child) -> None:
        self._child = running

    # -- back on the object's thread --------------------------------------------------------------

    def _on_done(self, payload: tuple[core_child.Outcome, object]) -> None:
        self.outcome, result = payload
        if self._retired:
            self.deleteLater()
            return
        if isinstance(result, Exception):
            raise result
        self.ended.emit(result)

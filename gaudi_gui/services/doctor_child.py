"""One ``gaudi-gui doctor`` child with its own timeout: ``DoctorChild`` (a ``ProcessRunner``, on the
window's thread) for the start gate's checks (services.preflight), ``ThreadedDoctor`` (started, read
and parsed on a thread of its own) for the health service's periodic checks of every watched host.

The child's stdout is kept whole (the ``--json`` report); a child past its time is killed with its
process tree and says so (``timed_out``), so a host that does not answer is named, never waited for.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import queue
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable

from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.core.proctree import ProcessTree
from gaudi_gui.services.process import EXIT_CRASHED, EXIT_FAILED_TO_START, EXIT_NORMAL, ProcessRunner


class DoctorChild(QObject):
    """``start(argv, timeout_ms)``; ``ended(code, status)`` once, when the child is gone."""

    ended = Signal(int, str)

    def __init__(self, parent: QObject, tail_lines: int = 40) -> None:
        super().__init__(parent)
        self.out: list[str] = []
        self.timed_out = False
        self.done = False
        self.code = -1
        self.runner = ProcessRunner(self, parse_protocol=False, tail_lines=tail_lines)
        self.runner.line_received.connect(self._on_line)
        self.runner.finished.connect(self._on_finished)
        self._timer = QTimer(self)
        self._timer.setSingleShot(True)
        self._timer.timeout.connect(self._on_timeout)

    def start(self, argv: list[str], timeout_ms: int) -> None:
        """Run ``argv`` (one element each: nothing reaches a shell here)."""
        self._timer.start(timeout_ms)
        self.runner.start(argv[0], argv[1:])

    def stdout(self) -> str:
        return "\n".join(self.out)

    def tail(self, n: int) -> list[str]:
        return self.runner.tail(n)

    def cancel(self) -> None:
        """Nothing more is reported; the child (if any) is killed when the object is deleted."""
        self._timer.stop()

    def _on_line(self, stream: str, line: str) -> None:
        if stream == "stdout":
            self.out.append(line)

    def _on_timeout(self) -> None:
        self.timed_out = True
        self.runner.kill_tree()

    def _on_finished(self, code: int, status: str) -> None:
        self._timer.stop()
        self.done = True
        self.code = code
        self.ended.emit(code, status)


#: What reads a ``ThreadedDoctor``'s end, called with keywords: ``stdout`` (text), ``code`` (exit code,
#: negative: the signal), ``status`` (``process.EXIT_*``), ``tail`` (the last lines of both streams),
#: ``timed_out``.
Reader = Callable[..., object]

#: How often the doctor's thread looks whether it was asked to stop while it waits for the child.
_POLL_S = 0.2

#: The doctors whose thread still runs, and whether this interpreter is exiting (then no thread emits
#: into Qt any more: the objects it would reach may be gone).
_RUNNING: set[ThreadedDoctor] = set()
_RUNNING_LOCK = threading.Lock()
_EXITING = threading.Event()


class _Launcher:
    """One long-lived thread that starts each doctor's own thread. ``Thread.start`` waits until the new
    thread runs, which on a loaded 2-core machine is a wait for the scheduler (155 ms measured on the
    window's thread with a load of 9); made here, that wait is this thread's, and the window's thread
    only puts the doctor in a queue."""

    def __init__(self) -> None:
        self._queue: queue.SimpleQueue[ThreadedDoctor] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def submit(self, doctor: ThreadedDoctor) -> None:
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="gaudi-gui-doctor-launcher",
                                                daemon=True)
                self._thread.start()
        self._queue.put(doctor)

    def _run(self) -> None:
        while True:
            doctor = self._queue.get()
            thread = threading.Thread(target=doctor._run_and_forget, name="gaudi-gui-doctor", daemon=True)
            doctor._thread = thread
            thread.start()


_LAUNCHER = _Launcher()


@atexit.register
def end_all(timeout_s: float = 5.0) -> None:
    """Kill every doctor still running and wait (up to ``timeout_s``) for their threads: at exit, so
    no thread is left emitting into a Qt that is being torn down."""
    _EXITING.set()
    with _RUNNING_LOCK:
        doctors = list(_RUNNING)
    for doctor in doctors:
        doctor._stop.set()
        if doctor._pid > 0:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(doctor._pid, signal.SIGKILL)
    deadline = time.monotonic() + timeout_s
    for doctor in doctors:
        thread = doctor._thread
        if thread is not None and thread.is_alive():
            thread.join(max(0.0, deadline - time.monotonic()))


class ThreadedDoctor(QObject):
    """One doctor child started, waited for and read on a thread of its own; ``ended(result)`` on the
    object's own (the window's) thread, once, with what ``read`` made of the child's output.

    The health service checks every watched host now and then (a doctor per host, five children per
    refresh with 4 hosts). Through ``QProcess`` each start ran on the window's thread: Qt 6.11 starts
    a child with ``clone(CLONE_VM|CLONE_VFORK)``, which suspends the calling thread until the child
    has called exec, so on a loaded 2-core machine the window waited for the new child to be scheduled
    (3 ms typically, up to 90 ms measured in bench/bench_hosts.py's run), and the child's output, end
    and process-tree bookkeeping were slots there too. Here a thread of its own starts the child with
    ``subprocess`` (also vfork, checked with strace: that thread waits, not the window's), in a
    session of its own, reads both streams to the end, kills the whole tree when the time is up or
    when asked (``kill``), and runs ``read`` (the report's JSON parse, the findings) before it hands
    the result over. The window's thread only stores the result.

    ``thread_ids`` records the thread that started the child (``"start"``) and the one that read its
    output (``"read"``), so a test can tell they were not the window's."""

    #: The child is gone and its output read: carries what ``read`` returned.
    ended = Signal(object)
    _done = Signal(object)  # emitted on the worker thread, delivered queued on the object's thread

    def __init__(self, parent: QObject, read: Reader, tail_lines: int = 40) -> None:
        super().__init__(parent)
        self._read = read
        self._tail_lines = tail_lines
        self.timed_out = False
        self.done = False
        self.code = -1
        self.thread_ids: dict[str, int] = {}
        self._out = ""
        self._tail: list[str] = []
        self._stop = threading.Event()
        self._pid = 0
        self._thread: threading.Thread | None = None  # set by the launcher
        self._started = False
        self._argv: list[str] = []
        self._timeout_s = 0.0
        self._retired = False
        self._done.connect(self._on_done)

    def start(self, argv: list[str], timeout_ms: int) -> None:
        """Run ``argv`` (one element each: nothing reaches a shell here) on a thread of its own."""
        self._argv, self._timeout_s = list(argv), timeout_ms / 1000
        self._started = True
        with _RUNNING_LOCK:
            _RUNNING.add(self)
        _LAUNCHER.submit(self)  # no thread is started here (see _Launcher)

    def is_running(self) -> bool:
        """True from ``start`` until ``ended`` was delivered (the child may be gone already)."""
        return self._started and not self.done

    def stdout(self) -> str:
        return self._out

    def tail(self, n: int) -> list[str]:
        return self._tail[-n:] if n > 0 else []

    def kill(self) -> None:
        """End the child and everything in its session now; ``ended`` still follows."""
        self._stop.set()
        pid = self._pid
        if pid > 0 and not self.done:
            # One system call here (the child leads its own group); its thread records and kills the
            # descendants that left the group, off this thread.
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)

    def retire(self) -> None:
        """Kill the child, report nothing, and delete this object once its thread is done."""
        self._retired = True  # (not blockSignals: the thread's own queued signal must still come)
        self.kill()
        if not self._started or self.done:
            self.deleteLater()

    # -- the doctor's thread ----------------------------------------------------------------------

    def _run_and_forget(self) -> None:
        try:
            self._run(self._argv, self._timeout_s)
        finally:
            with _RUNNING_LOCK:
                _RUNNING.discard(self)

    def _run(self, argv: list[str], timeout_s: float) -> None:
        self.thread_ids["start"] = threading.get_ident()
        out, tail, code, status = b"", [], -1, EXIT_FAILED_TO_START
        timed_out = False
        resolved = shutil.which(argv[0])
        try:
            if resolved is None:
                raise FileNotFoundError(f"'{argv[0]}' was not found; is it installed?")
            # A session of its own: the kill reaches ssh and hl-smi through the group; stdin closed, so
            # a remote doctor ends with its connection. No preexec function, so subprocess uses vfork.
            proc = subprocess.Popen([resolved, *argv[1:]], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, start_new_session=True)
        except OSError as exc:
            tail = [f"could not start {argv[0]}: {exc.strerror or exc}"]
        else:
            self._pid = proc.pid
            tree = ProcessTree(proc.pid, group=True)
            tree.record(fresh=True)
            if self._stop.is_set() or _EXITING.is_set():  # killed before the pid was known
                tree.kill()
            out, err, timed_out = self._wait(proc, tree, time.monotonic() + timeout_s)
            code = proc.returncode if proc.returncode is not None else -1
            status = EXIT_CRASHED if code < 0 else EXIT_NORMAL
            if code < 0 or timed_out:
                tree.signal_recorded(signal.SIGKILL)  # helpers in sessions of their own
            tail = (_lines(out) + _lines(err))[-self._tail_lines:]
        self.thread_ids["read"] = threading.get_ident()
        text = out.decode("utf-8", errors="replace")
        try:
            result = self._read(stdout=text, code=code, status=status, tail=tail, timed_out=timed_out)
        except Exception as exc:  # a reader's bug must still end the check
            result = exc
        if _EXITING.is_set():
            return
        with contextlib.suppress(RuntimeError):  # the object was deleted with its parent (app exit)
            self._done.emit((text, tail, code, timed_out, result))

    def _wait(self, proc: subprocess.Popen[bytes], tree: ProcessTree,
              deadline: float) -> tuple[bytes, bytes, bool]:
        """Both streams to the end; the tree killed at ``deadline`` or when ``kill`` was asked."""
        timed_out = False
        while True:
            try:
                out, err = proc.communicate(timeout=max(0.0, min(_POLL_S, deadline - time.monotonic())))
                return out, err, timed_out
            except subprocess.TimeoutExpired:
                pass
            if self._stop.is_set() or time.monotonic() >= deadline:
                timed_out = not self._stop.is_set()
                tree.kill()
                try:
                    out, err = proc.communicate(timeout=10)
                except subprocess.TimeoutExpired:
                    # A descendant outside the tree still holds a pipe: stop reading, reap the child.
                    tree.kill()
                    for stream in (proc.stdout, proc.stderr):
                        if stream is not None:
                            stream.close()
                    proc.wait()
                    out, err = b"", b""
                return out, err, timed_out

    # -- back on the object's thread --------------------------------------------------------------

    def _on_done(self, payload: tuple[str, list[str], int, bool, object]) -> None:
        self._out, self._tail, self.code, self.timed_out, result = payload
        self.done = True
        if self._retired:
            self.deleteLater()
            return
        if isinstance(result, Exception):
            raise result
        self.ended.emit(result)


def _lines(data: bytes) -> list[str]:
    """Decoded lines, each a ``\\r``-rewritten line's last non-empty part."""
    out = []
    text = data.decode("utf-8", errors="replace")
    for line in text.removesuffix("\n").split("\n") if text else []:
        parts = [p for p in line.split("\r") if p.strip()]
        out.append(parts[-1] if parts else "")
    return out

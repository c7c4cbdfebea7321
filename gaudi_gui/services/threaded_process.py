"""A child started, read and reaped off the window's thread: ``ThreadedRunner``, the device pollers'
face of ``ProcessRunner`` (the same signals, the same stop guarantees) for the children that come and
go all the time (an hl-smi loop per host, its process table every few seconds, ssh for each).

Why: a ``QProcess`` forks, execs and reads on the thread that owns it, so every one of those starts
(``vfork`` holds the caller until the child has exec'd: on a loaded machine, until the child got a
core), every pipe read and every reap ran on the window's thread, between two paints. Here one
thread per child does all of it: ``subprocess.Popen`` (its own session when asked), a ``poll`` on
both pipes and the child's pidfd, the decoding and line splitting (``process._Stream``), the reap.
The window's thread receives one queued event per read (its complete lines) and one when the child
is gone, and emits the public signals itself, in order, so every slot still runs on the window's
thread and nothing else changes for the poller.

Stopping is ``ProcessRunner``'s: ``kill_tree`` freezes the group at once and kills the recorded tree
on ``proctree.BOOKKEEPER``; a kill asked before the child was spawned means it is never spawned (the
thread sees the flag under the same lock that publishes the pid), so no event loop is needed for a
stop to reach every descendant. ``reap_all`` and ``delete_when_reaped`` (``services.process``) know
these runners too: they register in the same set of live runners.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import shutil
import signal
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any

from PySide6.QtCore import QObject, Qt, Signal

from gaudi_gui.core.proctree import BOOKKEEPER, ProcessTree
from gaudi_gui.services import process as _process
from gaudi_gui.services.process import EXIT_CRASHED, EXIT_FAILED_TO_START, EXIT_NORMAL

_log = logging.getLogger(__name__)

#: Bytes read at a time from a pipe.
_CHUNK = 65536
#: Without a pidfd (an old kernel), how often the thread looks whether the child is gone.
_POLL_S = 0.2


def _readable(fds: list[int], timeout_s: float | None) -> list[int]:
    """Those of ``fds`` that have data, are at EOF or hung up, in ``fds``' order (None: wait for one).
    poll, not select: select refuses a descriptor numbered past FD_SETSIZE (1024), which a process
    with many files open reaches, and the ValueError ended the reading thread."""
    poller = select.poll()
    for fd in fds:
        poller.register(fd, select.POLLIN)
    events = dict(poller.poll(None if timeout_s is None else int(timeout_s * 1000)))
    return [fd for fd in fds if fd in events]


def _why(exc: BaseException) -> str:
    """An exception as one line: an OSError's own words, any other's with its type (a bare
    "started something" says less than "AssertionError: started something")."""
    if isinstance(exc, OSError):
        return exc.strerror or str(exc)
    return f"{type(exc).__name__}: {exc}"


class ThreadedRunner(QObject):
    """A child run on a thread of its own; its lines and its end delivered to the window's thread."""

    #: The child is running; carries its pid.
    started = Signal(int)
    #: A complete output line: (stream "stdout" | "stderr", text without newline).
    line_received = Signal(str, str)
    #: The child is gone and its output drained: (exit code, one of EXIT_NORMAL / EXIT_CRASHED /
    #: EXIT_FAILED_TO_START). A signal death reports the negative signal number as the code.
    finished = Signal(int, str)
    #: From the child's thread to this object's (queued): (kind, payload) of one event.
    _event = Signal(str, object)

    def __init__(self, parent: QObject | None = None, *, tail_lines: int = 200) -> None:
        super().__init__(parent)
        self._event.connect(self._dispatch, Qt.ConnectionType.QueuedConnection)
        self._tail: deque[str] = deque(maxlen=tail_lines)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._tree: ProcessTree | None = None
        self._new_session = False
        self._running = False
        self._stopping = False
        #: Asked to be killed before the thread spawned the child: it is then never spawned.
        self._kill_pending = False
        self._pid = 0
        self._argv: list[str] = []
        self.started_at = 0.0
        #: What ``start``'s ``digest`` made of the child's stdout (set before ``finished`` is emitted;
        #: None when there was no digest, the child failed, or the digest raised).
        self.digested: Any = None
        self._digest: Callable[[list[str]], Any] | None = None
        self._stdout: deque[str] = deque(maxlen=tail_lines)
        _process._LIVE.add(self)  # type: ignore[arg-type]

    # -- properties -----------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        """The child's pid once the thread has spawned it (0 before, or when it never was)."""
        return self._pid

    @property
    def argv(self) -> list[str]:
        return list(self._argv)

    def is_running(self) -> bool:
        """From ``start`` until ``finished`` has been emitted (as ``ProcessRunner``)."""
        return self._running

    def is_stopping(self) -> bool:
        return self._stopping

    def is_detached(self) -> bool:
        return False

    def tail(self, count: int = 20) -> list[str]:
        """The last ``count`` output lines of both streams, as delivered so far."""
        return list(self._tail)[-count:]

    def descendants(self) -> list[int]:
        return self._tree.pids() if self._tree is not None else []

    # -- starting -------------------------------------------------------------------------------------

    def start(self, program: str, args: Sequence[str] = (), *, new_session: bool = False,
              stdin_open: bool = False, digest: Callable[[list[str]], Any] | None = None) -> bool:
        """Start ``program`` on a thread of its own; ``started`` or (``error`` in the tail)
        ``finished`` with EXIT_FAILED_TO_START follow on this object's thread. ``stdin_open`` keeps
        the child's stdin a pipe that closes only when the child is gone (a remote guard ends its
        command when it closes); else the child's stdin is /dev/null. ``digest`` is called on the
        child's thread with its last stdout lines (``tail_lines``) when it exited with 0; what it
        returns is ``digested`` when ``finished`` comes (parsing a table off the window's thread)."""
        if self._running:
            raise RuntimeError("ThreadedRunner is already running a process")
        self._tail.clear()
        self._stdout.clear()
        self._digest = digest
        self.digested = None
        self._argv = [program, *args]
        self._new_session = new_session
        self._running = True
        self._stopping = False
        self._kill_pending = False
        self._proc = None
        self._tree = None
        self._pid = 0
        self.started_at = time.time()
        thread = threading.Thread(target=self._run, args=(list(self._argv), new_session, stdin_open),
                                  name="gaudi-gui-child", daemon=True)
        try:
            thread.start()
        except Exception as exc:  # "can't start new thread": no thread, so no child; said as a failed start
            self._post("failed", f"could not start {program}: {_why(exc)}")
            return True
        self._thread = thread
        return True

    # -- stopping -------------------------------------------------------------------------------------

    def kill_tree(self) -> None:
        """SIGKILL the child, its group and every descendant recorded while it was alive."""
        self._stopping = True
        with self._lock:
            tree = self._tree
            if tree is None:
                # Not spawned yet: the thread sees this flag under the same lock and spawns nothing.
                self._kill_pending = self._running
                return
        if self._proc is not None and self._proc.returncode is None:
            # Frozen now (nothing in the group forks from here on, the child is not reaped, so its pid
            # stays its own); recorded and killed on the bookkeeping thread.
            tree.freeze()
            BOOKKEEPER.submit(tree.kill)
        else:
            BOOKKEEPER.submit(functools.partial(tree.signal_recorded, signal.SIGKILL))

    def sweep(self) -> None:
        """SIGKILL what a child that ended by itself left behind (``ProcessRunner.sweep``)."""
        if self._tree is not None:
            self._tree.signal(signal.SIGKILL)
            BOOKKEEPER.submit(functools.partial(self._tree.signal_recorded, signal.SIGKILL))

    def wait_finished(self, timeout_ms: int) -> bool:
        """Block until the child's thread has reaped it (``reap_all`` only, after the event loop)."""
        thread = self._thread
        if thread is not None:
            thread.join(timeout_ms / 1000)
            return not thread.is_alive()
        return True

    # -- the child's thread ---------------------------------------------------------------------------

    def _post(self, kind: str, payload: object) -> None:
        with contextlib.suppress(RuntimeError):  # this object was deleted: nobody listens any more
            self._event.emit(kind, payload)

    def _run(self, argv: list[str], new_session: bool, stdin_open: bool) -> None:
        # Every way out of this thread posts the runner's end: an exception that escaped it (a spawn
        # that raised something other than OSError, a reader that broke) left the runner "running"
        # for good with no child, and everything that waits for its end waited for ever.
        try:
            proc = self._spawn(argv, new_session, stdin_open)
        except Exception as exc:  # whatever the spawn raised: a ValueError (a NUL in an argument) ...
            self._post("failed", f"could not start {argv[0]}: {_why(exc)}")
            return
        if proc is None:
            return  # its end is posted already
        try:
            # Helpers a wrapper starts at once (in sessions of their own) are found by this record;
            # only the processes started since the child are read. On the bookkeeping thread, in order.
            tree = self._tree
            if tree is not None:
                BOOKKEEPER.submit(functools.partial(tree.record, fresh=True))
            self._post("started", proc.pid)
            self._pump(proc)
        except Exception as exc:
            self._end_broken(proc, exc)

    def _spawn(self, argv: list[str], new_session: bool,
               stdin_open: bool) -> subprocess.Popen[bytes] | None:
        """The child, or None when its end was posted instead (not found, killed before the spawn);
        raises what starting it raised."""
        program = argv[0]
        resolved = shutil.which(program)
        if resolved is None:
            where = "the given path" if os.sep in program else "PATH"
            self._post("failed", f"'{program}' was not found ({where} searched); is it installed?")
            return None
        with self._lock:
            if self._kill_pending:
                self._post("finished", (-int(signal.SIGKILL), EXIT_CRASHED, None))
                return None
            try:
                proc = subprocess.Popen([resolved, *argv[1:]], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                        stdin=subprocess.PIPE if stdin_open else subprocess.DEVNULL,
                                        start_new_session=new_session)
            except OSError as exc:
                self._post("failed", f"could not start {resolved}: {exc.strerror or exc}")
                return None
            self._proc = proc
            self._tree = ProcessTree(proc.pid, group=new_session)
            self._pid = proc.pid
        return proc

    def _end_broken(self, proc: subprocess.Popen[bytes], exc: Exception) -> None:
        """Reading the child failed: it must not outlive a runner that can no longer read it. Killed
        with its tree, reaped, its end reported with why."""
        _log.error("reading %s failed", self._argv[:1], exc_info=exc)
        self._stopping = True
        tree = self._tree
        if tree is not None and proc.returncode is None:
            tree.freeze()
            BOOKKEEPER.submit(tree.kill)
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            code = proc.wait()
        for pipe in (proc.stdout, proc.stderr, proc.stdin):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self._post("lines", [("stderr", f"reading {self._argv[0]} failed: {_why(exc)}")])
        self._post("finished", (code, EXIT_CRASHED, None))

    def _pump(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stdout is not None and proc.stderr is not None
        streams = {proc.stdout.fileno(): ("stdout", _process._Stream()),
                   proc.stderr.fileno(): ("stderr", _process._Stream())}
        try:
            pidfd: int | None = os.pidfd_open(proc.pid)
        except (AttributeError, OSError):
            pidfd = None
        # A list, stdout first: what both streams hold at once is read in that order (as QProcess
        # drains them at the end), so an error a child printed last comes last in the tail.
        open_fds = list(streams)
        try:
            while True:
                watch = [*open_fds, *([pidfd] if pidfd is not None else [])]
                if not watch:
                    break  # both pipes at EOF and no pidfd: wait() below waits for the end
                ready = _readable(watch, None if pidfd is not None else _POLL_S)
                for fd in ready:
                    if fd in open_fds and not self._read(fd, streams[fd], final=False):
                        open_fds.remove(fd)
                if pidfd in ready if pidfd is not None else proc.poll() is not None:
                    break
            # The child is gone: what it wrote is in the pipes now (a helper that holds them open
            # does not hold its end back): read what is there without waiting.
            for fd in list(open_fds):
                os.set_blocking(fd, False)
                while self._read(fd, streams[fd], final=False):
                    pass
            for name, stream in streams.values():
                lines, _progress = stream.feed(b"", final=True)
                if name == "stdout":
                    self._stdout.extend(lines)
                if lines:
                    self._post("lines", [(name, line) for line in lines])
            code = proc.wait()
        finally:
            if pidfd is not None:
                os.close(pidfd)
            for pipe in (proc.stdout, proc.stderr, proc.stdin):
                if pipe is not None:
                    with contextlib.suppress(OSError):
                        pipe.close()
        if code < 0 or self._stopping:
            # Stragglers (helpers in sessions of their own) must not outlive a stop or a crash.
            tree = self._tree
            if tree is not None:
                BOOKKEEPER.submit(functools.partial(tree.signal_recorded, signal.SIGKILL))
        digested = None
        if self._digest is not None and code == 0 and not self._stopping:
            try:
                digested = self._digest(list(self._stdout))
            except Exception:  # a digest that fails is no result, never a dead thread
                _log.exception("digest of %s failed", self._argv[:1])
        self._post("finished", (code, EXIT_CRASHED if code < 0 else EXIT_NORMAL, digested))

    def _read(self, fd: int, named: tuple[str, _process._Stream], *, final: bool) -> bool:
        """Read one chunk from ``fd`` and post its complete lines; False at EOF (or nothing left)."""
        try:
            data = os.read(fd, _CHUNK)
        except BlockingIOError:
            return False
        except OSError:
            data = b""
        if not data:
            return False
        name, stream = named
        lines, _progress = stream.feed(data, final)
        if name == "stdout":
            self._stdout.extend(lines)
        if lines:
            self._post("lines", [(name, line) for line in lines])
        return True

    # -- this object's thread -------------------------------------------------------------------------

    def _dispatch(self, kind: str, payload: object) -> None:
        if kind == "lines":
            for name, line in payload:  # type: ignore[attr-defined]
                self._tail.append(line)
                self.line_received.emit(name, line)
        elif kind == "started":
            self.started.emit(int(payload))  # type: ignore[call-overload]
        elif kind == "failed":
            self._tail.append(str(payload))
            self._finish(-1, EXIT_FAILED_TO_START)
        elif kind == "finished":
            end: tuple[int, str, Any] = payload  # type: ignore[assignment]
            self.digested = end[2]
            self._finish(int(end[0]), str(end[1]))

    def _finish(self, code: int, status: str) -> None:
        self._running = False
        self.finished.emit(code, status)

"""One wrapper around QProcess, used for every child the app starts (hl-smi, workers, accelerate).

It resolves the program first (so "not installed" is a clear message, not a silent failure), decodes
output incrementally with ``errors="replace"``, splits it into lines, collapses tqdm's ``\\r`` updates
into progress events, picks protocol messages out of the stream, keeps a tail of the last lines for
error reports, drains the buffers when the child ends, and stops a whole process tree: SIGTERM to the
child's process group, then, after a grace period, SIGKILL to the group and to every descendant seen
while the child was alive. It never calls ``waitFor*``: everything is signal driven.

The window's thread does none of the tree's bookkeeping: recording a child's descendants reads the
whole process table (tens of milliseconds on a server), so every record, and every signal that must
come after one, is handed to ``proctree.BOOKKEEPER``, one thread that runs them in order. Only what is
one system call stays here: freezing a group (SIGSTOP) at once when a kill is asked, so nothing in it
forks while the kill waits its turn.
"""

from __future__ import annotations

import codecs
import functools
import os
import shutil
import signal
import time
import weakref
from collections import deque
from collections.abc import Sequence

from PySide6.QtCore import QObject, QProcess, QTimer, Signal

from gaudi_gui.core import protocol
from gaudi_gui.core.proctree import BOOKKEEPER, ProcessTree

# psutil (~40 ms to import) is imported in the methods that scan processes: this module is loaded
# before the window's first paint, and none of them runs until a child has started after it.

#: A line longer than this without a newline is flushed as a line so memory stays bounded.
MAX_LINE_CHARS = 1 << 20

EXIT_NORMAL = "exited"
EXIT_CRASHED = "crashed"
EXIT_FAILED_TO_START = "failed_to_start"


def describe_exit(exit_code: int, exit_status: str) -> str:
    """A sentence for the UI: 'exited with code 1', 'killed by signal 9 (SIGKILL)'."""
    if exit_status == EXIT_FAILED_TO_START:
        return "failed to start"
    if exit_status == EXIT_CRASHED:
        # A process that dies from a signal reports it as a negative code (like subprocess does).
        number = -exit_code if exit_code < 0 else exit_code
        try:
            name = signal.Signals(number).name
        except ValueError:
            return "crashed"
        return f"killed by signal {number} ({name})"
    if exit_code < 0:
        return describe_exit(exit_code, EXIT_CRASHED)
    return f"exited with code {exit_code}"


class _Stream:
    """Incremental decoder and line splitter for one of the child's output streams."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""

    def feed(self, data: bytes, final: bool = False) -> tuple[list[str], str | None]:
        """Complete lines in ``data`` and the latest ``\\r`` progress text of the unfinished line."""
        self._buffer += self._decoder.decode(data, final)
        lines: list[str] = []
        while True:
            cut = self._buffer.find("\n")
            if cut < 0:
                break
            lines.append(_last_segment(self._buffer[:cut]))
            self._buffer = self._buffer[cut + 1:]
        progress = None
        if (final and self._buffer) or len(self._buffer) > MAX_LINE_CHARS:
            lines.append(_last_segment(self._buffer))
            self._buffer = ""
        elif "\r" in self._buffer:
            # tqdm rewrites its line as "\r 40%|####  |": keep only the newest rewrite.
            head, _, tail = self._buffer.rpartition("\r")
            progress = tail or _last_segment(head)
            self._buffer = "\r" + tail
        return lines, progress


def _last_segment(line: str) -> str:
    line = line.rstrip("\r")
    if "\r" not in line:
        return line
    for segment in reversed(line.split("\r")):
        if segment.strip():
            return segment
    return ""


#: Every live runner (each ProcessRunner registers itself here).
_LIVE: weakref.WeakSet[ProcessRunner] = weakref.WeakSet()


def reap_all(timeout_ms: int = 3000) -> None:
    """Kill every runner's process tree and wait for it: only after the event loop has ended.

    A QProcess destroyed while its child runs leaves an orphan (and a Qt warning), so app exit calls
    this once the window is gone; it is the one place allowed to block on a child.
    """
    runners = [r for r in list(_LIVE) if r.is_running() and not r.is_detached()]
    for runner in runners:
        runner.kill_tree()
    # The kills run on the bookkeeping thread: let them all be sent before waiting for any child.
    BOOKKEEPER.wait_idle(timeout_ms / 1000)
    for runner in runners:
        runner.wait_finished(timeout_ms)


def delete_when_reaped(obj: QObject) -> None:
    """``obj.deleteLater()`` once no child of its runners runs any more.

    A QProcess destroyed while its child runs warns and orphans it, and a killed child is reaped
    by the event loop, not at once: an object whose work was just stopped (a poller replaced, a
    host removed) is deleted only after its runners report ``finished``. Meanwhile it is mute (its
    signals blocked): a retired object must not speak into whatever replaced it."""
    obj.blockSignals(True)
    runners: list[ProcessRunner] = [r for r in obj.findChildren(QObject)  # type: ignore[misc]
                                    if r in _LIVE and r.is_running() and not r.is_detached()]  # type: ignore[attr-defined]
    if not runners:
        obj.deleteLater()
        return
    pending = set(runners)

    def reaped(runner: ProcessRunner) -> None:
        pending.discard(runner)
        if not pending:
            obj.deleteLater()

    for runner in runners:
        runner.finished.connect(lambda *_a, r=runner: reaped(r))
        if not runner.is_stopping():
            runner.kill_tree()


def detached_running() -> bool:
    """True when a detached child still runs: the app must then exit without QProcess destructors
    (they kill their child), see ``gaudi_gui.app.run_gui``."""
    return any(r.is_detached() and r.is_running() for r in list(_LIVE))


class ProcessRunner(QObject):
    """A child process, its output as lines and messages, and its orderly end."""

    #: The child is running; carries its pid.
    started = Signal(int)
    #: A complete output line: (stream "stdout" | "stderr", text without newline). Protocol lines are
    #: not repeated here when ``parse_protocol`` is on.
    line_received = Signal(str, str)
    #: The newest ``\\r`` rewrite of an unfinished line (tqdm progress): (stream, text).
    progress_received = Signal(str, str)
    #: A protocol message (``gaudi_gui.core.protocol``) decoded from either stream.
    message_received = Signal(dict)
    #: A line carried the protocol prefix but no valid message; carries the reason.
    protocol_error = Signal(str)
    #: The child could not be started or its I/O failed; carries a human-readable reason.
    error_occurred = Signal(str)
    #: The child is gone and its output drained: (exit code, one of EXIT_NORMAL / EXIT_CRASHED /
    #: EXIT_FAILED_TO_START). A signal death reports the negative signal number as the code.
    finished = Signal(int, str)

    def __init__(self, parent: QObject | None = None, *, parse_protocol: bool = True,
                 tail_lines: int = 200) -> None:
        super().__init__(parent)
        self._parse_protocol = parse_protocol
        self._process = QProcess(self)
        self._process.readyReadStandardOutput.connect(self._on_stdout)
        self._process.readyReadStandardError.connect(self._on_stderr)
        self._process.errorOccurred.connect(self._on_error)
        self._process.finished.connect(self._on_finished)
        self._process.started.connect(self._on_started)
        self._streams = {"stdout": _Stream(), "stderr": _Stream()}
        self._tail: deque[str] = deque(maxlen=tail_lines)
        self._tree: ProcessTree | None = None  # the child and the descendants recorded
        # Descendants are recorded when the child starts and when a stop begins (the tree is still
        # whole then), not by a periodic scan: psutil's children(recursive=True) reads the whole
        # process table. Each record runs on the bookkeeping thread, never on the window's.
        self._kill_timer = QTimer(self)
        self._kill_timer.setSingleShot(True)
        self._kill_timer.timeout.connect(self.kill_tree)
        self._new_session = False
        self._detached = False
        self._pid = 0
        self._program = ""
        self._argv: list[str] = []
        self._stopping = False
        #: A kill asked for before the child had started (no pid yet): done the moment it starts.
        self._kill_pending = False
        self._finished_reported = False
        self.started_at = 0.0
        _LIVE.add(self)

    # -- starting -------------------------------------------------------------------------------------

    def start(self, program: str, args: Sequence[str] = (), *, cwd: str | None = None,
              new_session: bool = False, stdin_open: bool = False) -> bool:
        """Start ``program`` (with the window's environment); False (and error_occurred + finished) when
        it cannot be found or run.

        ``new_session`` puts the child in its own session and process group so ``terminate_tree``
        reaches launchers that do not forward signals.
        """
        if self.is_running():
            raise RuntimeError("ProcessRunner is already running a process")
        self._reset()
        self._argv = [program, *args]
        resolved = shutil.which(program)
        if resolved is None:
            where = "the given path" if os.sep in program else "PATH"
            self._fail_to_start(f"'{program}' was not found ({where} searched); is it installed?")
            return False
        self._program = resolved
        if cwd:
            self._process.setWorkingDirectory(cwd)
        self._new_session = new_session
        if new_session:
            params = QProcess.UnixProcessParameters()
            params.flags = QProcess.UnixProcessFlag.CreateNewSession
            self._process.setUnixProcessParameters(params)
        self._process.setProgram(resolved)
        self._process.setArguments(list(args))
        self.started_at = time.time()
        self._process.start()
        if not stdin_open:
            self._process.closeWriteChannel()
        return True

    def _reset(self) -> None:
        self._streams = {"stdout": _Stream(), "stderr": _Stream()}
        self._tail.clear()
        self._tree = None
        self._stopping = False
        self._kill_pending = False
        self._finished_reported = False
        self._detached = False
        self._pid = 0

    def _fail_to_start(self, reason: str) -> None:
        self._tail.append(reason)
        # Deliver asynchronously so a caller that connects right after start() still hears it.
        QTimer.singleShot(0, self, lambda: self._report_failed_start(reason))

    def _report_failed_start(self, reason: str) -> None:
        if self._finished_reported:
            return
        self._finished_reported = True
        self.error_occurred.emit(reason)
        self.finished.emit(-1, EXIT_FAILED_TO_START)

    # -- properties -----------------------------------------------------------------------------------

    @property
    def pid(self) -> int:
        return self._pid

    @property
    def argv(self) -> list[str]:
        return list(self._argv)

    def is_running(self) -> bool:
        try:
            return self._process.state() != QProcess.ProcessState.NotRunning
        except RuntimeError:
            # The QProcess was deleted with its parent widget (the window closed): nothing runs.
            return False

    def is_stopping(self) -> bool:
        return self._stopping

    def is_detached(self) -> bool:
        return self._detached

    def detach(self) -> None:
        """Let the child outlive this runner (and the app): stop watching it, never kill it.

        Only sensible for a child in its own session whose output also goes to a file (a training
        launch tees its log into the run folder); the app re-attaches to that file on next start."""
        self._detached = True
        self._kill_timer.stop()

    def tail(self, count: int = 20) -> list[str]:
        """The last ``count`` output lines (both streams, protocol lines excluded)."""
        return list(self._tail)[-count:]

    def descendants(self) -> list[int]:
        return self._tree.pids() if self._tree is not None else []

    def wait_finished(self, timeout_ms: int) -> bool:
        """Block until the child has ended (``reap_all`` only, once the event loop is over)."""
        return bool(self._process.waitForFinished(timeout_ms))

    # -- talking to the child -------------------------------------------------------------------------

    def write_line(self, text: str) -> bool:
        if not self.is_running():
            return False
        self._process.write((text.rstrip("\n") + "\n").encode("utf-8"))
        return True

    def close_stdin(self) -> None:
        self._process.closeWriteChannel()

    # -- stopping -------------------------------------------------------------------------------------

    def terminate_tree(self, grace_ms: int = 5000) -> None:
        """SIGTERM the child (its whole group when it has its own session), SIGKILL all after grace."""
        if not self.is_running():
            return
        if self._tree is None:
            # Still starting (no pid yet): nothing of it can have done work; end it as it starts.
            self.kill_tree()
            return
        self._stopping = True
        tree, own_session = self._tree, self._new_session

        def term() -> None:
            # Recorded first: a launcher that ends at SIGTERM leaves its workers in sessions of their
            # own (torchrun's) re-parented to init, where no later record finds them.
            tree.record()
            tree.signal(signal.SIGTERM)
            if own_session:
                tree.signal_recorded(signal.SIGTERM)

        BOOKKEEPER.submit(term)
        self._kill_timer.start(max(0, grace_ms))

    def kill_tree(self) -> None:
        """SIGKILL the child, its group and every descendant recorded while it was alive."""
        self._stopping = True
        self._kill_timer.stop()
        if self._tree is None:
            # Asked before ``started`` was delivered (Stop pressed right after Start, a poller
            # stopped while a table read was starting). The child has a pid from its fork on: kill it
            # and its group now, since the event loop may never deliver ``started`` (the app is
            # quitting), and a wrapper that ends by itself meanwhile leaves its ``sleep &`` helpers
            # behind. Once ``started`` comes, the tree is killed again to catch what the child forked.
            self._kill_pending = self.is_running()
            pid = int(self._process.processId()) if self._kill_pending else 0
            if pid > 0:
                self._kill_in_background(ProcessTree(pid, group=self._new_session))
            return
        if self.is_running():
            self._kill_in_background(self._tree)
        else:
            BOOKKEEPER.submit(functools.partial(self._tree.signal_recorded, signal.SIGKILL))

    @staticmethod
    def _kill_in_background(tree: ProcessTree) -> None:
        """Freeze the tree's group now (one system call: nothing in it forks from here on, and the
        child, stopped, is not reaped, so its pid stays its own), then record and SIGKILL it all on
        the bookkeeping thread."""
        tree.freeze()
        BOOKKEEPER.submit(tree.kill)

    def sweep(self) -> None:
        """SIGKILL what a child that ended by itself left behind: helpers still in its group (when it
        had a session of its own) and the descendants recorded while it ran."""
        if self._tree is not None:
            # The group at once (a group id is not reused while a member lives); the recorded ones
            # on the bookkeeping thread, after the records still queued there.
            self._tree.signal(signal.SIGKILL)
            BOOKKEEPER.submit(functools.partial(self._tree.signal_recorded, signal.SIGKILL))

    def _record_descendants(self) -> None:
        """Record the child's descendants, on the bookkeeping thread (``descendants()`` has them
        once it got there)."""
        if self._tree is not None:
            BOOKKEEPER.submit(self._tree.record)

    # -- QProcess slots -------------------------------------------------------------------------------

    def _on_started(self) -> None:
        self._pid = int(self._process.processId())
        # Made here, not on the bookkeeping thread: the child is ours and not reaped yet, so psutil
        # ties the pid to the right process (one read of /proc/PID/stat).
        self._tree = ProcessTree(self._pid, group=self._new_session)
        # By the time this slot runs, a wrapper script may already have started helpers in sessions
        # of their own; a child that then ends by itself is swept with what was recorded (an
        # hl-smi wrapper's runs). Without this record such a helper outlived its run. Fresh:
        # only the processes started since the child are read, not the whole table.
        BOOKKEEPER.submit(functools.partial(self._tree.record, fresh=True))
        if self._kill_pending:
            self._kill_pending = False
            self._kill_in_background(self._tree)
        self.started.emit(self._pid)

    def _on_stdout(self) -> None:
        self._consume("stdout", bytes(self._process.readAllStandardOutput().data()))

    def _on_stderr(self) -> None:
        self._consume("stderr", bytes(self._process.readAllStandardError().data()))

    def _consume(self, name: str, data: bytes, final: bool = False) -> None:
        lines, progress = self._streams[name].feed(data, final)
        for line in lines:
            if self._parse_protocol and protocol.PREFIX in line:
                try:
                    message = protocol.decode(line)
                except protocol.ProtocolError as exc:
                    self.protocol_error.emit(str(exc))
                    continue
                if message is not None:
                    self.message_received.emit(message)
                    continue
            self._tail.append(line)
            self.line_received.emit(name, line)
        if progress is not None:
            self.progress_received.emit(name, progress)

    def _on_error(self, error: QProcess.ProcessError) -> None:
        if error == QProcess.ProcessError.FailedToStart:
            reason = f"could not start {self._program}: {self._process.errorString()}"
            self._tail.append(reason)
            if not self._finished_reported:
                self._finished_reported = True
                self.error_occurred.emit(reason)
                self.finished.emit(-1, EXIT_FAILED_TO_START)
        elif error == QProcess.ProcessError.WriteError:
            # The child closed its stdin: it has ended or is ending (ssh refused by the host writes
            # its reason and exits before our first request reaches it). Its finish says why, with its
            # last lines; an error here would be heard first and blame a "crash" instead.
            self._tail.append(f"{self._program}: {self._process.errorString()}")
        elif error == QProcess.ProcessError.ReadError:
            self.error_occurred.emit(f"{self._program}: {self._process.errorString()}")
        # Crashed is reported through finished(); Timedout only comes from waitFor*, never used.

    def _on_finished(self, exit_code: int, exit_status: QProcess.ExitStatus) -> None:
        self._kill_timer.stop()
        # Drain whatever is still buffered, then flush partial lines.
        self._consume("stdout", bytes(self._process.readAllStandardOutput().data()), final=True)
        self._consume("stderr", bytes(self._process.readAllStandardError().data()), final=True)
        crashed = exit_status == QProcess.ExitStatus.CrashExit
        if (self._stopping or crashed) and self._tree is not None:
            # Stragglers (workers in their own sessions) must not outlive a stop or a crash.
            BOOKKEEPER.submit(functools.partial(self._tree.signal_recorded, signal.SIGKILL))
        status = EXIT_CRASHED if exit_status == QProcess.ExitStatus.CrashExit else EXIT_NORMAL
        code = int(exit_code)
        if status == EXIT_CRASHED and code > 0:
            code = -code  # Qt reports the terminating signal's number as the exit code
        if self._finished_reported:
            return
        self._finished_reported = True
        self.finished.emit(code, status)


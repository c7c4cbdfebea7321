"""Ctrl-C in the terminal that started the window, delivered to the window's thread as a signal.

Python runs a signal handler only between two bytecodes of the main thread. While Qt's event loop
waits in C++ no Python runs, so the default handler's KeyboardInterrupt was raised in whichever Python
slot ran next (a Devices tab update): Qt printed its traceback and the window went on. Here SIGINT gets
a Python handler that does nothing itself; what counts is the interpreter's C-level handler, which
writes the signal's number to the wakeup fd (``signal.set_wakeup_fd``) at once. That fd is the write
end of a pipe whose read end a ``QSocketNotifier`` watches, so the event loop wakes and
``interrupted`` is emitted on the window's thread, where it can ask the window to close.
"""

from __future__ import annotations

import contextlib
import os
import signal
from types import FrameType
from typing import Any

from PySide6.QtCore import QObject, QSocketNotifier, Signal


class CtrlC(QObject):
    """SIGINT while this object is installed becomes ``interrupted`` (main thread only: Python installs
    signal handlers there). ``uninstall`` puts back the handler and wakeup fd found."""

    #: SIGINT arrived (Ctrl-C in the terminal, or ``kill -INT``).
    interrupted = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        # A pipe (not a socket pair: the socket module is not loaded before the first paint).
        self._reader, self._writer = os.pipe()
        # Non-blocking both: the C handler must never block on a full buffer, the reader never wait.
        os.set_blocking(self._reader, False)
        os.set_blocking(self._writer, False)
        self._notifier = QSocketNotifier(self._reader, QSocketNotifier.Type.Read, self)
        self._notifier.activated.connect(self._drain)
        self._previous_fd = signal.set_wakeup_fd(self._writer, warn_on_full_buffer=False)
        self._previous_handler: Any = signal.signal(signal.SIGINT, self._on_signal)
        self._installed = True

    @staticmethod
    def _on_signal(signum: int, frame: FrameType | None) -> None:
        """Nothing: the wakeup fd has the signal already, and raising here would land in a random slot."""

    def _drain(self) -> None:
        try:
            data = os.read(self._reader, 4096)
        except OSError:  # nothing there after all (BlockingIOError), or closed by uninstall
            return
        # Every signal with a Python handler writes its number here; only SIGINT means Ctrl-C.
        if int(signal.SIGINT) in data:
            self.interrupted.emit()

    def uninstall(self) -> None:
        """The handler and wakeup fd that were there before (once the event loop has ended)."""
        if not self._installed:
            return
        self._installed = False
        signal.set_wakeup_fd(self._previous_fd)
        previous = self._previous_handler
        signal.signal(signal.SIGINT, previous if previous is not None else signal.default_int_handler)
        self._notifier.setEnabled(False)
        for fd in (self._reader, self._writer):
            with contextlib.suppress(OSError):
                os.close(fd)


__all__ = ["CtrlC"]

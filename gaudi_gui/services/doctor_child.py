"""One ``gaudi-gui doctor`` child with its own timeout: the health service's periodic checks and the
start gate's checks (services.preflight) both run the doctor through this one object.

The child's stdout is kept whole (the ``--json`` report); a child past its time is killed with its
process tree and says so (``timed_out``), so a host that does not answer is named, never waited for.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.services.process import ProcessRunner


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

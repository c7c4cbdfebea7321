"""The Evaluate job in the app: ``gaudi-gui eval … --events`` as a local child, followed.

The view never starts a process: it gives this service an ``EvalSpec`` (and where it runs, a
``core.placement.Placement``: this machine or a host, handed to the command as ``--host``), and binds to
what comes back: progress with an ETA, each answer as it comes, the result (already written to the run
folder by the command), or an error with the exit status and the child's last lines. Stop ends the
command's whole process group (the worker with it); the command on a host runs under the guard, so
ending the local ssh ends it there too.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core.evaluation import EvalSpec, validate
from gaudi_gui.core.placement import Placement
from gaudi_gui.core.secrets import redact
from gaudi_gui.services.process import EXIT_FAILED_TO_START, ProcessRunner, describe_exit


def eta_seconds(done: int, total: int, elapsed: float) -> float | None:
    """Seconds left at the pace so far (None before the first row, or when nothing is left)."""
    if done <= 0 or total <= done or elapsed <= 0:
        return None
    return elapsed / done * (total - done)


class EvaluationService(QObject):
    #: The command started.
    started = Signal()
    #: (rows done, rows in all, seconds left or -1 while unknown)
    progress = Signal(int, int, float)
    #: What the worker is doing ("base: answering", "loading the base model …").
    phase = Signal(str)
    #: One answer of one model (the worker's ``answer`` event).
    answer = Signal(dict)
    #: The results, written to the run folder (``path``) — the command's ``result`` event.
    result = Signal(dict)
    #: (field or "", message): refused input, a failed model, a child that ended without results.
    failed = Signal(str, str)
    #: The child is gone: (ok, stopped by the user).
    finished = Signal(bool, bool)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        #: The Python that runs ``-m gaudi_gui eval`` (the bench may put another here).
        self.python = sys.executable
        self.runner = ProcessRunner(self, tail_lines=60)
        self.runner.message_received.connect(self._on_message)
        self.runner.finished.connect(self._on_finished)
        self._started_at = 0.0
        self._error: dict[str, Any] | None = None
        self._result: dict[str, Any] | None = None
        self._stopped = False
        self.last_argv: list[str] = []
        #: What the running evaluation is of (a run's name or a model), and its (done, total) rows.
        self.subject = ""
        self.done_rows = (0, 0)

    def is_running(self) -> bool:
        return self.runner.is_running()

    def argv(self, spec: EvalSpec, placement: Placement | None = None) -> list[str]:
        """The child's argv: the command-line twin of the form (what ``gaudi-gui eval`` takes)."""
        place = (placement or Placement.local()).cli_args()
        return [self.python, "-m", "gaudi_gui", "eval", *spec.cli_args(), "--events", *place]

    def start(self, spec: EvalSpec, placement: Placement | None = None) -> list[tuple[str, str]]:
        """Start the evaluation; the problems at the field instead when the input is wrong (nothing
        started then). On a host the files are the host's: only the command there checks them."""
        if self.runner.is_running():
            return [("", "an evaluation is already running")]
        if placement is None or placement.is_local:
            problems = validate(spec, catalogue=False)
            if problems:
                return problems
        self._error, self._result, self._stopped = None, None, False
        self.subject = Path(spec.run).name if spec.run else (spec.model or spec.adapter)
        self.done_rows = (0, 0)
        self._started_at = time.monotonic()
        self.last_argv = self.argv(spec, placement)
        env = dict(os.environ)
        env.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
        env.setdefault("TQDM_DISABLE", "1")
        # Its own session: Stop signals the command and the worker together.
        self.runner.start(self.last_argv[0], self.last_argv[1:], env=env, new_session=True)
        self.started.emit()
        return []

    def stop(self) -> None:
        if self.runner.is_running():
            self._stopped = True
            self.runner.terminate_tree(grace_ms=5000)

    # -- JobOwner (services/jobs.py): an evaluation lives with the window ----------------------------

    outlives_window = False

    def active_jobs(self) -> list[str]:
        if not self.is_running():
            return []
        done, total = self.done_rows
        rows = f", {done}/{total} rows" if total else ""
        return [f"Evaluate: {self.subject or 'a model'}{rows}"]

    def stop_jobs(self) -> None:
        self.stop()

    def detach_jobs(self) -> list[str]:
        self.stop()  # SIGTERM: the command keeps the results it has so far
        return []

    def shutdown(self) -> None:
        if self.runner.is_running():
            self._stopped = True
            self.runner.kill_tree()

    def _on_message(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "progress":
            done, total = int(message.get("done") or 0), int(message.get("total") or 0)
            self.done_rows = (done, total)
            eta = eta_seconds(done, total, time.monotonic() - self._started_at)
            self.progress.emit(done, total, -1.0 if eta is None else eta)
        elif kind == "phase":
            self.phase.emit(str(message.get("message", "")))
        elif kind == "answer":
            self.answer.emit(message)
        elif kind == "result":
            self._result = message
            self.result.emit(message)
        elif kind == "error":
            self._error = message

    def _on_finished(self, code: int, status: str) -> None:
        ok = code == 0 and self._result is not None
        if self._stopped:
            self.phase.emit("stopped")
        elif not ok:
            error = self._error or {}
            how = "failed to start" if status == EXIT_FAILED_TO_START else describe_exit(code, status)
            message = str(error.get("message") or "the evaluation ended without results")
            if error.get("kind") != "bad_input":
                lines = [redact(t) for t in self.runner.tail(4)]
                message += f" ({how})" + (": " + " | ".join(lines) if lines else "")
            self.failed.emit(str(error.get("field") or ""), message)
        self.finished.emit(ok, self._stopped)

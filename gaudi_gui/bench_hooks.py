"""Hooks bench/run.py switches on through the environment (never active in normal use)."""

from __future__ import annotations

import json
import os
import sys
import time

from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QWidget


class _FirstPaint(QObject):
    def __init__(self, window: QWidget, t0: float) -> None:
        super().__init__(window)
        self._t0 = t0
        self._window = window
        window.installEventFilter(self)

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if obj is self._window and event.type() == QEvent.Type.Paint:
            self._window.removeEventFilter(self)
            # Report after this paint has been handled, then quit.
            QTimer.singleShot(0, self._report)
        return False

    def _report(self) -> None:
        import psutil

        rss = psutil.Process().memory_info().rss
        print(json.dumps({"event": "first_paint", "since_import_s": time.perf_counter() - self._t0,
                          "rss_bytes": rss}), flush=True)
        ready = getattr(self._window, "tabs_ready", None)
        if ready is not None:
            ready.connect(self._report_ready)
        else:
            self._report_ready()

    def _report_ready(self) -> None:
        import psutil

        print(json.dumps({"event": "ready", "since_import_s": time.perf_counter() - self._t0,
                          "rss_bytes": psutil.Process().memory_info().rss,
                          "torch_loaded": "torch" in sys.modules,
                          "transformers_loaded": "transformers" in sys.modules}), flush=True)
        if os.environ.get("GAUDI_GUI_BENCH_STARTUP") != "keep":
            self._window.close()


def report_first_paint(window: QWidget, t0: float) -> None:
    _FirstPaint(window, t0)

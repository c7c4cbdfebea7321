"""``python bench/drive.py app|bare``: start the real app (or a bare PySide6 window) and report, as JSON
lines on stdout, when its first window has been painted and, for the app, when every tab is built.

The product holds no benchmark hooks: this driver creates the QApplication itself, installs its own
event filter on it (every widget's events pass through), then hands over to ``gaudi_gui.app.run_gui``,
which reuses that QApplication. The bare side goes through the same filter, so both are timed alike.
"""

from __future__ import annotations

import json
import sys
import time

T0 = time.perf_counter()

from PySide6.QtCore import QEvent, QObject, QTimer  # noqa: E402
from PySide6.QtWidgets import QApplication, QLabel, QMainWindow, QWidget  # noqa: E402


def _rss() -> int:
    import psutil

    return int(psutil.Process().memory_info().rss)


class FirstPaint(QObject):
    """Sees the first Paint of a top-level window, reports, then waits for tabs_ready and closes."""

    def __init__(self, app: QApplication) -> None:
        super().__init__()
        self._app = app
        self._seen = False

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if (not self._seen and event.type() == QEvent.Type.Paint and isinstance(obj, QMainWindow)
                and obj.isWindow()):
            self._seen = True
            window = obj
            # Report once this paint has been handled (the frame is complete).
            QTimer.singleShot(0, lambda: self._first(window))
        return False

    def _first(self, window: QWidget) -> None:
        print(json.dumps({"event": "first_paint", "since_start_s": time.perf_counter() - T0,
                          "rss_bytes": _rss()}), flush=True)
        ready = getattr(window, "tabs_ready", None)
        if ready is not None:
            ready.connect(lambda: self._ready(window))
        else:
            self._ready(window)

    def _ready(self, window: QWidget) -> None:
        print(json.dumps({"event": "ready", "since_start_s": time.perf_counter() - T0,
                          "rss_bytes": _rss(), "torch_loaded": "torch" in sys.modules,
                          "transformers_loaded": "transformers" in sys.modules}), flush=True)
        window.close()


def main(mode: str) -> int:
    app = QApplication([sys.argv[0]])
    watcher = FirstPaint(app)
    app.installEventFilter(watcher)
    if mode == "app":
        from gaudi_gui.app import run_gui

        return run_gui([])
    window = QMainWindow()
    window.setCentralWidget(QLabel("bare"))
    window.resize(1280, 860)
    window.show()
    return int(app.exec())


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "app"))

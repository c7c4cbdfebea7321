"""Shared set-up of the screenshot scripts: the real main window, offscreen, on one tab."""

from __future__ import annotations

import time
from collections.abc import Callable

from PySide6.QtWidgets import QApplication

from gaudi_gui.app import create_services
from gaudi_gui.services.context import AppServices
from gaudi_gui.ui.main_window import MainWindow


def parse_size(text: str, script: str) -> tuple[int, int]:
    """A size argument like "1024x700"; a bad one ends the script saying so (exit 2)."""
    import sys

    width, _x, height = text.lower().partition("x")
    if not (width.isdigit() and height.isdigit()):
        print(f"{script}: {text!r} is not a size like 1024x700", file=sys.stderr)
        sys.exit(2)
    return int(width), int(height)


def open_window(tab: int, width: int, height: int) -> tuple[QApplication, AppServices, MainWindow]:
    """A QApplication, the app's services and its main window, every tab built, ``tab`` shown."""
    app = QApplication([])
    services = create_services(app)
    window = MainWindow(services)
    window.resize(width, height)
    window.show()
    window.ensure_tabs()
    window.tabs.setCurrentIndex(tab)
    return app, services, window


def run(app: QApplication) -> int:
    """Run until the script closes the window (the window holds no process: nothing to reap)."""
    app.exec()
    return 0


def wait_until(app: QApplication, until: Callable[[], object], seconds: float) -> None:
    """Run the event loop until ``until()`` holds; exit the script saying so after ``seconds``."""
    deadline = time.monotonic() + seconds
    while not until() and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.02)
    if not until():
        raise SystemExit(f"timed out after {seconds} s")

"""Start the GUI: one QApplication, the shared services, the main window."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

from PySide6.QtCore import QObject, QTimer
from PySide6.QtWidgets import QApplication

from gaudi_gui.services.context import AppServices

_T0 = time.perf_counter()


def create_services(parent: QObject | None = None) -> AppServices:
    from gaudi_gui.services.device_poller import DevicePoller
    from gaudi_gui.services.device_selection import DeviceSelection
    from gaudi_gui.services.environment_probe import EnvironmentProbe
    from gaudi_gui.services.settings import Settings

    settings = Settings(parent=parent)
    selection = DeviceSelection(parent)
    environment = EnvironmentProbe(parent=parent)
    poller = DevicePoller(settings, selection, parent)
    return AppServices(settings=settings, selection=selection, environment=environment, poller=poller)


def run_gui(argv: Sequence[str]) -> int:
    app = QApplication.instance() or QApplication([sys.argv[0], *argv])
    assert isinstance(app, QApplication)
    app.setApplicationName("gaudi-gui")
    app.setOrganizationName("gaudi-gui")
    from gaudi_gui.ui.main_window import MainWindow

    services = create_services(app)
    window = MainWindow(services)
    window.show()
    services.poller.start()
    services.environment.refresh()
    if os.environ.get("GAUDI_GUI_BENCH_STARTUP"):
        # bench/run.py: report when the first frame has been painted, then quit.
        from gaudi_gui.bench_hooks import report_first_paint

        report_first_paint(window, _T0)
    if os.environ.get("GAUDI_GUI_QUIT_AFTER_MS"):
        QTimer.singleShot(int(os.environ["GAUDI_GUI_QUIT_AFTER_MS"]), window.close)
    code = int(app.exec())
    from gaudi_gui.services.process import detached_running, reap_all

    reap_all()
    if detached_running():
        # A QProcess kills its child when destroyed; a run the user chose to leave running must
        # survive, so skip the destructors (settings are already synced by the window's close).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code

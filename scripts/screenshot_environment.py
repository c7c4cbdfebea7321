"""Offscreen screenshot of the Environment tab with a real probe.

``python scripts/screenshot_environment.py OUT.png``
"""

from __future__ import annotations

import sys

from PySide6.QtCore import QTimer
from PySide6.QtWidgets import QApplication

from gaudi_gui.app import create_services
from gaudi_gui.ui.main_window import MainWindow


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "docs/environment.png"
    app = QApplication([])
    services = create_services(app)
    window = MainWindow(services)
    window.resize(1280, 860)
    window.show()
    window.ensure_tabs()
    window.tabs.setCurrentIndex(3)

    def shoot(_info: dict) -> None:
        QTimer.singleShot(200, lambda: (window.grab().save(out), window.close()))

    services.environment.probe_finished.connect(shoot)
    services.environment.probe_failed.connect(lambda r: (print(r), window.close()))
    services.environment.refresh()
    app.exec()
    from gaudi_gui.services.process import reap_all

    reap_all()
    return 0


if __name__ == "__main__":
    sys.exit(main())

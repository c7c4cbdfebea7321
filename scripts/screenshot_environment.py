"""Offscreen screenshot of the Environment tab with a real probe.

``python scripts/screenshot_environment.py OUT.png``
"""

from __future__ import annotations

import sys

from PySide6.QtCore import QTimer
from shot import open_window, run


def main() -> int:
    out = sys.argv[1] if len(sys.argv) > 1 else "docs/environment.png"
    app, services, window = open_window(3, 1280, 860)

    def shoot(_info: dict) -> None:
        QTimer.singleShot(200, lambda: (window.grab().save(out), window.close()))

    services.environment.probe_finished.connect(shoot)
    services.environment.probe_failed.connect(lambda r: (print(r), window.close()))
    services.environment.refresh()
    return run(app)


if __name__ == "__main__":
    sys.exit(main())

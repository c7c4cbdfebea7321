"""Offscreen screenshots of the health screens on the fake hl-smi's sick 8-card server (module 1 ports
down, module 2 double-bit ECC with a pending row replacement, module 3 at 0 C, module 5 in power
slowdown, module 6 held by pid 4242), made by clicking: the Devices tab once the doctor answered (each
row's health, "healthy and free", the picker), the Health view its badge opens, and the Hosts tab.
``python scripts/screenshot_health.py [OUT_DIR] [WIDTHxHEIGHT]`` (default docs/screens 1280x800):
devices-sick-WxH.png, health-view-WxH.png, hosts-sick-WxH.png."""

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
    size = sys.argv[2] if len(sys.argv) > 2 else "1280x800"
    width, height = (int(n) for n in size.split("x"))
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
    app, services, window = open_window(0, width, height)
    assert services.health is not None
    services.health.start()
    services.poller.start()
    tab = window.devices_tab
    wait_until(app, lambda: services.health.health("local") is not None, 60)  # type: ignore[union-attr]
    badge = tab.health_badge
    wait_until(app, lambda: "Health:" in badge.text() and "not checked" not in badge.text(), 10)
    wait_until(app, lambda: tab.usable_label.text().startswith("Healthy and free"), 10)

    def settle() -> None:
        for _ in range(20):
            app.processEvents()
            time.sleep(0.05)

    settle()
    window.grab().save(str(out / f"devices-sick-{size}.png"))
    QTest.mouseClick(badge, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier, QPoint(5, 5))
    wait_until(app, lambda: window.health_view is not None and window.health_view.isVisible(), 10)
    settle()
    window.grab().save(str(out / f"health-view-{size}.png"))
    window.tabs.setCurrentWidget(window.hosts_tab)
    wait_until(app, lambda: window.hosts_tab._items["local"].childCount() == 8, 10)
    settle()
    window.grab().save(str(out / f"hosts-sick-{size}.png"))
    for name in ("devices-sick", "health-view", "hosts-sick"):
        print(out / f"{name}-{size}.png")
    window.close()
    from scripts.shot import run
    app.quit()
    return run(app)


if __name__ == "__main__":
    sys.exit(main())

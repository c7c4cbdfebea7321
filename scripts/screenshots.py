"""``python scripts/screenshots.py [OUTDIR]`` (``make screenshots``): start the real app, click through
every tab on its tab bar, and save one PNG per screen into OUTDIR (default docs/).

The platform is the current ``QT_QPA_PLATFORM`` when set; otherwise the display when there is one;
otherwise the script re-runs itself under ``xvfb-run`` when available, and falls back to ``offscreen``.
The Devices tab shows 8 recorded Gaudi cards: the app's poller runs a fake ``hl-smi`` replaying real
output (tests/fake_hl_smi.py), so every screen comes from the app's own code paths.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
HEADLESS = ("offscreen", "minimal", "vnc")
#: File names (under OUTDIR) of the first tabs, as the README shows them; every later tab is named
#: after its label ("Queue" -> queue.png).
NAMES = ("devices", "runner", "training", "environment")
#: Longest wait for the probe and the first device snapshots before shooting anyway.
READY_TIMEOUT_MS = 60_000


def _choose_platform() -> None:
    if os.environ.get("QT_QPA_PLATFORM") or os.environ.get("DISPLAY") or os.environ.get("WAYLAND_DISPLAY"):
        return
    xvfb = shutil.which("xvfb-run")
    if xvfb and not os.environ.get("_GAUDI_GUI_UNDER_XVFB"):
        os.environ["_GAUDI_GUI_UNDER_XVFB"] = "1"
        os.execv(xvfb, [xvfb, "-a", "-s", "-screen 0 1600x1200x24", sys.executable, *sys.argv])
    os.environ["QT_QPA_PLATFORM"] = "offscreen"


def _fake_hl_smi(folder: Path) -> Path:
    program = folder / "hl-smi"
    program.write_text(f"#!/bin/sh\nexec {sys.executable} {ROOT / 'tests' / 'fake_hl_smi.py'} \"$@\"\n")
    program.chmod(0o755)
    return program


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else "docs")
    out.mkdir(parents=True, exist_ok=True)
    _choose_platform()
    home = Path(tempfile.mkdtemp(prefix="gaudi-gui-shots-"))
    os.environ["GAUDI_GUI_HOME"] = str(home)
    os.environ["GAUDI_GUI_HL_SMI"] = str(_fake_hl_smi(home))
    os.environ.setdefault("FAKE_HLSMI_PERIOD", "0.2")
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from PySide6.QtCore import QPoint, Qt, QTimer
    from PySide6.QtTest import QTest
    from shot import open_window, run

    app, services, window = open_window(0, 1400, 1000)
    saved: list[Path] = []
    state = {"probe": False, "snapshots": 0}

    def on_probe(*_args: object) -> None:
        state["probe"] = True
        maybe_start()

    def on_samples(_samples: object) -> None:
        state["snapshots"] += 1
        maybe_start()

    started = [False]

    def maybe_start() -> None:
        # Shoot once the probe answered and the charts hold a few snapshots.
        if not started[0] and state["probe"] and state["snapshots"] >= 10:
            started[0] = True
            QTimer.singleShot(300, lambda: shoot(0))

    def shoot(index: int) -> None:
        if index >= window.tabs.count():  # Hosts with its 4 hosts: scripts/screenshot_hosts.py
            window.close()
            return
        bar = window.tabs.tabBar()
        center = bar.tabRect(index).center()
        QTest.mouseClick(bar, Qt.MouseButton.LeftButton, Qt.KeyboardModifier.NoModifier,
                         QPoint(center.x(), center.y()))
        if window.tabs.currentIndex() != index:
            print(f"screenshots: clicking tab {index} did not select it", file=sys.stderr)

        def grab() -> None:
            text = window.tabs.tabText(index).replace("&", "").lower()  # "H&osts": Alt+O
            label = "".join(c if c.isalnum() else "-" for c in text).strip("-")
            name = NAMES[index] if index < len(NAMES) else label
            path = out / f"{name}.png"
            if not window.grab().save(str(path)):
                print(f"screenshots: could not write {path}", file=sys.stderr)
            else:
                saved.append(path)
            shoot(index + 1)

        # Let the click's repaint and any layout settle before grabbing.
        QTimer.singleShot(400, grab)

    services.environment.probe_finished.connect(on_probe)
    services.environment.probe_failed.connect(on_probe)
    services.poller.samples_received.connect(on_samples)
    services.poller.start()
    services.environment.refresh()

    def give_up_waiting() -> None:
        if not started[0]:
            print(f"screenshots: probe={state['probe']} snapshots={state['snapshots']} after "
                  f"{READY_TIMEOUT_MS} ms; shooting anyway", file=sys.stderr)
            started[0] = True
            shoot(0)

    QTimer.singleShot(READY_TIMEOUT_MS, give_up_waiting)
    run(app)
    shutil.rmtree(home, ignore_errors=True)
    for path in saved:
        print(path)
    return 0 if len(saved) == window.tabs.count() else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))

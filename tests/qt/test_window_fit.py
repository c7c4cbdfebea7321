"""The first window fits the screen (issue 37 item 16): it opened at 1280x860 whatever the screen, so on
a 1024x700 or 800-px-high screen Health, "Pick healthy & free" and the status bar were off-screen.

In this process the offscreen platform's screen is 800x800 (an 800-px-high screen); a child process
runs the real window on a 1024x700 screen (the offscreen platform's ``configfile`` option describes
its screens)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from PySide6.QtCore import QPoint, QRect

from gaudi_gui.app import create_services
from gaudi_gui.ui.main_window import MainWindow
from tests.helpers import close_window


def _on_screen(window: MainWindow, widget: object) -> bool:
    from PySide6.QtWidgets import QWidget
    assert isinstance(widget, QWidget)
    area = window.screen().availableGeometry()
    return area.contains(QRect(widget.mapToGlobal(QPoint(0, 0)), widget.size()))


def test_the_first_window_fits_an_800_px_high_screen(qtbot) -> None:
    window = MainWindow(create_services())
    qtbot.addWidget(window, before_close_func=lambda w: close_window(qtbot, w))
    window.show()
    qtbot.waitExposed(window)
    area = window.screen().availableGeometry()
    assert area.height() == 800  # what this test is about: the offscreen platform's screen
    assert area.contains(window.frameGeometry()), (window.frameGeometry(), area)
    assert _on_screen(window, window.statusBar())


def test_a_saved_geometry_that_no_longer_fits_is_brought_back_on_screen(qtbot) -> None:
    first = MainWindow(create_services())
    qtbot.addWidget(first)
    first.show()
    first.setGeometry(2400, 1600, 1280, 860)  # as saved on a larger screen, or a monitor gone
    first.close()
    second = MainWindow(create_services())
    qtbot.addWidget(second, before_close_func=lambda w: close_window(qtbot, w))
    second.show()
    qtbot.waitExposed(second)
    area = second.screen().availableGeometry()
    assert area.contains(second.frameGeometry()), (second.frameGeometry(), area)


_PROBE = r"""
import json, sys, time
from PySide6.QtCore import QPoint, QRect, QTimer
from PySide6.QtWidgets import QApplication
app = QApplication([])
from gaudi_gui.app import create_services
from gaudi_gui.ui.main_window import MainWindow
services = create_services(app)
window = MainWindow(services)
window.show()
services.poller.start()  # as the app starts it once the window is painted
window.ensure_tabs()
window.show_health()
devices = window.devices_tab
deadline = time.monotonic() + 60
while not devices.pick_button.isVisible() and time.monotonic() < deadline:
    app.processEvents()
    time.sleep(0.02)
for _ in range(20):
    app.processEvents()
area = window.screen().availableGeometry()
def seen(w):
    return w.isVisible() and area.contains(QRect(w.mapToGlobal(QPoint(0, 0)), w.size()))
print(json.dumps({"screen": [area.width(), area.height()],
                  "frame": window.frameGeometry().getRect(),
                  "window_fits": area.contains(window.frameGeometry()),
                  "status_bar": seen(window.statusBar()), "pick": seen(devices.pick_button),
                  "health": seen(window.health_view)}), flush=True)
QTimer.singleShot(0, window.close)
app.exec()
"""


def test_the_first_window_fits_a_1024x700_screen_with_health_and_pick_in_view(tmp_path: Path,
                                                                              fake_hl_smi: Path) -> None:
    config = tmp_path / "screen.json"
    config.write_text(json.dumps({"screens": [{"name": "small", "x": 0, "y": 0, "width": 1024,
                                               "height": 700, "logicalDpi": 96}]}))
    env = {**os.environ, "QT_QPA_PLATFORM": f"offscreen:configfile={config}"}
    done = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, env=env,
                          timeout=240, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stderr[-2000:]
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    assert seen["screen"] == [1024, 700]
    assert seen["window_fits"], seen
    assert seen["status_bar"] and seen["pick"] and seen["health"], seen

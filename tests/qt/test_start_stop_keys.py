"""Start and Stop from the keyboard (issue 37, item 18: Start was 36 Tab presses away): Ctrl+Return
starts and Ctrl+. stops in Training and Serve, pressed with the focus in a field of the view, each
starting and stopping a real child; the keys are named in the buttons' tooltips; and the Model
runner's own Ctrl+Return does not take Serve's when the runner tab is shown beside the Serve dock.
(Evaluate's keys are pressed in test_demo_eval.py, on a trained demo run.)"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QWidget
from pytestqt.qtbot import QtBot

from gaudi_gui.app import create_services
from gaudi_gui.core.serve import pick_free_port
from gaudi_gui.ui.main_window import MainWindow
from gaudi_gui.ui.serve_panel import ServePanel
from tests import helpers

pytestmark = pytest.mark.slow

CTRL = Qt.KeyboardModifier.ControlModifier


def press_start(qtbot: QtBot, widget: QWidget) -> None:
    widget.setFocus()
    qtbot.waitUntil(widget.hasFocus, timeout=5000)
    qtbot.keyClick(widget, Qt.Key.Key_Return, CTRL)


def press_stop(qtbot: QtBot, widget: QWidget) -> None:
    widget.setFocus()
    qtbot.waitUntil(widget.hasFocus, timeout=5000)
    qtbot.keyClick(widget, Qt.Key.Key_Period, CTRL)


@pytest.mark.usefixtures("demo_model")
def test_training_starts_on_ctrl_return_and_stops_on_ctrl_period(qtbot: QtBot, tmp_path: Path) -> None:
    services, tab = helpers.training_tab(qtbot, tmp_path)
    try:
        assert "Ctrl+Return" in tab.btn["Start"].toolTip()
        assert "Ctrl+." in tab.btn["Stop"].toolTip()
        helpers.set_arg(tab, "output_dir", str(tmp_path / "out"))
        helpers.set_arg(tab, "max_steps", "2000")
        helpers.set_arg(tab, "logging_steps", "1")
        field = tab.form.editors["max_steps"].editor
        press_start(qtbot, field)
        job = tab.job
        qtbot.waitUntil(lambda: job.run is not None and tab.btn["Stop"].isEnabled(), timeout=120_000)
        qtbot.waitUntil(lambda: job.progress.step >= 1, timeout=120_000)
        assert "Ctrl+." in tab.btn["Stop"].toolTip()  # still named once the tooltip follows the run
        with qtbot.waitSignal(job.finished, timeout=180_000) as ended:
            press_stop(qtbot, field)
        assert ended.args[1] == "stopped", tab.status.text()
        assert job.progress.step < 2000
    finally:
        helpers.end_training_tab(qtbot, services, tab)


@pytest.fixture
def window(qtbot: QtBot) -> Iterator[MainWindow]:
    win = MainWindow(create_services())
    qtbot.addWidget(win, before_close_func=lambda w: helpers.close_window(qtbot, w))
    with qtbot.waitActive(win, timeout=20_000):
        win.show()
    yield win


@pytest.mark.usefixtures("demo_model")
def test_serve_starts_and_stops_by_keys_beside_the_runner(qtbot: QtBot, window: MainWindow) -> None:
    # The Model runner shown (Ctrl+2), its Ctrl+Return bound, and the Serve dock beside it (Ctrl+Shift+S).
    qtbot.keyClick(window, Qt.Key.Key_2, CTRL)
    qtbot.waitUntil(lambda: window.tabs.currentIndex() == 1, timeout=5000)
    qtbot.keyClick(window, Qt.Key.Key_S, CTRL | Qt.KeyboardModifier.ShiftModifier)
    qtbot.waitUntil(lambda: window.serve_panel is not None and window.serve_panel.isVisible(), timeout=5000)
    panel = window.serve_panel
    assert isinstance(panel, ServePanel)
    assert "Ctrl+Return" in panel.start_button.toolTip() and "Ctrl+." in panel.stop_button.toolTip()
    panel.port.selectAll()
    qtbot.keyClicks(panel.port, str(pick_free_port()))
    press_start(qtbot, panel.port)
    qtbot.waitUntil(panel.stop_button.isEnabled, timeout=10_000)
    assert not panel.start_button.isEnabled()
    with qtbot.waitSignal(panel.service.finished, timeout=60_000) as ended:
        press_stop(qtbot, panel.port)
    assert ended.args[0] is True  # stopped by the user
    qtbot.waitUntil(panel.start_button.isEnabled, timeout=10_000)

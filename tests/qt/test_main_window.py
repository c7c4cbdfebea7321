"""The app shell: tabs, the environment probe shown, settings kept, and an orderly close: the close
choices (Cancel, Leave running, Stop) clicked in the real dialog over a real training run, and the
run left going re-attached by the next window."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtWidgets import QDockWidget, QLabel

from gaudi_gui.app import create_services
from gaudi_gui.core.runstore import checkpoint_complete
from gaudi_gui.ui.main_window import MainWindow
from gaudi_gui.ui.training_tab import TrainingTab
from tests.helpers import answer_dialog, click, close_window, form_ready, set_arg


@pytest.fixture
def window(qtbot) -> Iterator[MainWindow]:
    services = create_services()
    win = MainWindow(services)
    qtbot.addWidget(win, before_close_func=lambda w: close_window(qtbot, w))
    win.show()
    # pytest-qt closes it after the test as a person does (close_window: Stop and quit when jobs run).
    yield win


def test_tabs_and_probe_in_status_bar(qtbot, window: MainWindow) -> None:
    titles = [window.tabs.tabText(i).replace("&", "") for i in range(window.tabs.count())]
    assert titles == ["Devices", "Model runner", "Training", "Environment", "Hosts", "Models"]
    with qtbot.waitSignal(window.services.environment.probe_finished, timeout=60000) as blocker:
        window.services.environment.refresh()
    info = blocker.args[0]
    assert info["device"] in ("cpu", "cuda", "hpu")
    assert info["packages"]["torch"]
    assert "device:" in window._device_label.text() and "probing" not in window._device_label.text()
    env_tab = window.environment_tab
    assert env_tab.packages.rowCount() >= 6
    text = env_tab.report_text()
    assert "transformers" in text and "HABANA_VISIBLE_MODULES" in text
    env_tab.copy_report()
    from PySide6.QtGui import QGuiApplication

    assert QGuiApplication.clipboard().text() == text


def test_ctrl_number_switches_tabs(qtbot, window: MainWindow) -> None:
    from PySide6.QtCore import Qt

    window.activateWindow()
    qtbot.keyClick(window, Qt.Key.Key_3, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: window.tabs.currentIndex() == 2, timeout=2000)


def test_geometry_and_tab_are_remembered(qtbot) -> None:
    first = MainWindow(create_services())
    qtbot.addWidget(first)
    first.show()
    first.resize(731, 533)
    first.tabs.setCurrentIndex(3)
    first.close()
    second = MainWindow(create_services())
    qtbot.addWidget(second)
    second.show()
    assert second.tabs.currentIndex() == 3
    assert (second.width(), second.height()) == (731, 533)
    second.close()


def _open_training_tab(qtbot, window: MainWindow) -> TrainingTab:
    """Click the Training tab's title; the tab once it is shown."""
    from PySide6.QtCore import Qt

    bar = window.tabs.tabBar()
    titles = [window.tabs.tabText(i).replace("&", "") for i in range(window.tabs.count())]
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(titles.index("Training")).center())
    tab = window.training_tab
    qtbot.waitUntil(tab.isVisible, timeout=5000)
    return tab


def _start_training(qtbot, tab: TrainingTab, out: Path) -> None:
    """Start a long run on the demo model with the Start button; back once it logged a step."""
    qtbot.waitUntil(lambda: form_ready(tab), timeout=120000)
    set_arg(tab, "output_dir", str(out))
    set_arg(tab, "max_steps", "100000")
    set_arg(tab, "save_steps", "100000")
    set_arg(tab, "logging_steps", "1")
    click(qtbot, tab.btn["Start"])
    qtbot.waitUntil(lambda: tab.job.run is not None, timeout=60000)
    qtbot.waitUntil(lambda: len(tab.job.records) > 0, timeout=180000)


@pytest.mark.usefixtures("demo_model")
def test_close_choices_leave_running_restart_reattach_stop(qtbot, tmp_path: Path) -> None:
    """Cancel keeps the window and the run; "Leave running and quit" closes it with the run going;
    the next window follows that run again; "Stop and quit" there stops it with a checkpoint and
    closes once it ended. Every choice is a click on the real dialog's button."""
    first = MainWindow(create_services())
    qtbot.addWidget(first)
    first.show()
    _start_training(qtbot, _open_training_tab(qtbot, first), tmp_path / "out")
    run = first.training_tab.job.run
    assert run is not None

    answer = answer_dialog(qtbot, "Cancel")
    first.close()
    assert answer.clicked, "no close dialog was shown"
    assert "1 job(s) are still running" in answer.text and "training run" in answer.text
    assert first.isVisible() and run.processes_alive()

    answer = answer_dialog(qtbot, "Leave running and quit")
    with qtbot.waitSignal(first.closed, timeout=30000):
        first.close()
    assert answer.clicked and not first.isVisible()
    assert run.processes_alive() and run.status().state == "running"

    # The next start of the app follows the run: its curve so far, then new steps.
    second = MainWindow(create_services())
    qtbot.addWidget(second)
    second.show()
    tab = _open_training_tab(qtbot, second)
    qtbot.waitUntil(lambda: tab.job.run == run and tab.job.attached, timeout=30000)
    # Its curve so far streams in from the run's first event, then new steps.
    qtbot.waitUntil(lambda: tab.chart.point_count() > 0, timeout=30000)
    seen = len(tab.job.records)
    qtbot.waitUntil(lambda: len(tab.job.records) > seen, timeout=60000)
    # The status bar says a job runs, as it does for a run this window started.
    qtbot.waitUntil(lambda: "1 job(s) running" in [label.text() for label in
                                                   second.statusBar().findChildren(QLabel)], timeout=5000)

    answer = answer_dialog(qtbot, "Stop and quit")
    with qtbot.waitSignal(second.closed, timeout=180000):
        second.close()
    assert answer.clicked
    qtbot.waitUntil(lambda: not second.isVisible(), timeout=10000)
    assert tab.status.text().startswith("Stopped at step"), tab.status.text()
    status = run.status()
    assert status.state == "stopped", status
    assert not run.processes_alive()
    checkpoint = run.latest_checkpoint()
    assert checkpoint is not None and checkpoint_complete(checkpoint)


def test_training_output_opens_in_the_runner(qtbot, window: MainWindow, tmp_path) -> None:
    window.ensure_tabs()
    missing = str(tmp_path / "run" / "final")
    window.training_tab.load_in_runner_requested.emit(missing)
    assert window.tabs.currentIndex() == 1
    assert window.runner_tab.model.currentText() == missing
    assert "no such folder" in window.runner_tab.model_status.text()


def _click_menu_item(qtbot, window: MainWindow, menu_title: str, item: str) -> None:
    """Open a menu by clicking its title in the menu bar, then click the item, as a person does."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QMenu

    bar = window.menuBar()
    (action,) = [a for a in bar.actions() if a.text().replace("&", "") == menu_title]
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.actionGeometry(action).center())
    menu = action.menu()
    assert isinstance(menu, QMenu)
    qtbot.waitUntil(menu.isVisible, timeout=3000)
    (entry,) = [a for a in menu.actions() if a.text().replace("&", "") == item]
    qtbot.mouseClick(menu, Qt.MouseButton.LeftButton, pos=menu.actionGeometry(entry).center())


def test_every_menu_item_and_shortcut_by_click(qtbot, window: MainWindow) -> None:
    from PySide6.QtCore import Qt

    window.activateWindow()
    for index, name in enumerate(("Devices", "Model runner", "Training", "Environment")):
        _click_menu_item(qtbot, window, "View", name)
        qtbot.waitUntil(lambda i=index: window.tabs.currentIndex() == i, timeout=3000)
    for index in (3, 2, 1, 0):
        qtbot.keyClick(window, getattr(Qt.Key, f"Key_{index + 1}"), Qt.KeyboardModifier.ControlModifier)
        qtbot.waitUntil(lambda i=index: window.tabs.currentIndex() == i, timeout=3000)
    # Every later tab (Hosts, Models) by its menu entry and by its Ctrl+N.
    for index in range(4, window.tabs.count()):
        _click_menu_item(qtbot, window, "View", window.tabs.tabText(index).replace("&", ""))
        qtbot.waitUntil(lambda i=index: window.tabs.currentIndex() == i, timeout=3000)
        window.tabs.setCurrentIndex(0)
        qtbot.keyClick(window, getattr(Qt.Key, f"Key_{index + 1}"), Qt.KeyboardModifier.ControlModifier)
        qtbot.waitUntil(lambda i=index: window.tabs.currentIndex() == i, timeout=3000)
    # The Queue view: View → Queue, then (closed) Ctrl+Shift+Q.
    _click_menu_item(qtbot, window, "View", "Queue")
    qtbot.waitUntil(lambda: window.queue_view is not None and window.queue_view.isVisible(), timeout=10000)
    dock = window.findChild(QDockWidget, "queue_dock")
    assert isinstance(dock, QDockWidget)
    dock.close()
    qtbot.waitUntil(lambda: not dock.isVisible(), timeout=3000)
    window.activateWindow()
    ctrl_shift = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    qtbot.keyClick(window, Qt.Key.Key_Q, ctrl_shift)
    qtbot.waitUntil(dock.isVisible, timeout=5000)
    answer = answer_dialog(qtbot, "OK")
    _click_menu_item(qtbot, window, "Help", "About gaudi-gui")
    qtbot.waitUntil(lambda: answer.clicked, timeout=5000)
    assert "gaudi-gui" in answer.text
    _click_menu_item(qtbot, window, "File", "Quit")
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=5000)


def test_ctrl_q_quits(qtbot, window: MainWindow) -> None:
    from PySide6.QtCore import Qt

    window.activateWindow()
    qtbot.keyClick(window, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=5000)


@pytest.mark.parametrize("size", [(1280, 800), (1024, 700)])
def test_the_serve_dock_fits_a_small_screen(qtbot, window: MainWindow, size: tuple[int, int]) -> None:
    """With the Serve dock opened from the View menu beside the Model runner, a window sized to a
    1280x800 (or 1024x700) screen keeps that size: no tab, the dock nor a long line forces it wider
    (the dock scrolls rather than holding the window's height)."""
    from PySide6.QtCore import Qt

    window.ensure_tabs()
    window.activateWindow()
    bar = window.tabs.tabBar()
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(1).center())
    qtbot.waitUntil(lambda: window.tabs.currentWidget() is window.runner_tab, timeout=3000)
    _click_menu_item(qtbot, window, "View", "Serve")
    qtbot.waitUntil(lambda: window.serve_panel is not None and window.serve_panel.isVisible(), timeout=5000)
    panel = window.serve_panel
    assert panel is not None
    width, height = size
    window.resize(width, height)
    qtbot.waitUntil(lambda: window.runner_tab.width() > 0 and panel.width() > 0, timeout=3000)
    qtbot.wait(50)  # the layouts settle
    assert window.width() <= width, (window.width(), window.minimumSizeHint())
    assert window.height() <= height, (window.height(), window.minimumSizeHint())
    # Both stay usable: the runner's chat and the panel each keep room.
    assert window.runner_tab.view.width() >= 250 and panel.width() >= 250



@pytest.mark.parametrize("size", [(1280, 800), (1024, 700)])
def test_serve_and_health_share_a_small_screen(qtbot, window: MainWindow, size: tuple[int, int]) -> None:
    """Issue 25, item 16: with Serve and Health open, Health below took ~45 % of the height (the
    runner's transcript shrank to ~4 lines, the Training tab's Start was hidden at 1024x700), and a
    wide Health row could hold the window wider than the screen. On a window under 900 px tall the
    two docks share the right-hand side as tabs, Health's actions wrap, and the window keeps its size."""
    from PySide6.QtCore import Qt

    width, height = size
    window.resize(width, height)
    window.ensure_tabs()
    window.activateWindow()
    bar = window.tabs.tabBar()
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(1).center())
    qtbot.waitUntil(lambda: window.tabs.currentWidget() is window.runner_tab, timeout=3000)
    _click_menu_item(qtbot, window, "View", "Serve")
    qtbot.waitUntil(lambda: window.serve_panel is not None and window.serve_panel.isVisible(), timeout=5000)
    _click_menu_item(qtbot, window, "View", "Health")
    qtbot.waitUntil(lambda: window.health_view is not None and window.health_view.isVisible(), timeout=5000)
    qtbot.wait(50)  # the layouts settle
    assert window.width() <= width and window.height() <= height, (window.size(), window.minimumSizeHint())
    from PySide6.QtWidgets import QDockWidget
    serve_dock = window.findChild(QDockWidget, "serve_dock")
    assert isinstance(serve_dock, QDockWidget)
    assert [d.objectName() for d in window.tabifiedDockWidgets(serve_dock)] == ["health_dock"]
    # The transcript keeps most of the window's height, not four lines.
    assert window.runner_tab.view.height() >= height * 0.3, window.runner_tab.view.height()
    # The Training tab's Start stays in view.
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(2).center())
    qtbot.waitUntil(lambda: window.tabs.currentWidget() is window.training_tab, timeout=3000)
    qtbot.wait(50)
    assert not window.training_tab.btn["Start"].visibleRegion().isEmpty()

def test_training_and_serve_fit_a_1024_screen_by_stacking_the_columns(qtbot, window: MainWindow) -> None:
    """Issue 25, item 16, on the Training tab: with its schema loaded the form and the live column
    stood side by side at 826 px at least, so opening Serve held the window at 1165 px on a 1024-px
    screen. Narrower than two columns, the form now sits above Start and the chart (both scroll), and
    the columns stand side by side again when the window is wide enough."""
    from PySide6.QtCore import Qt

    window.resize(1024, 700)
    window.ensure_tabs()
    window.activateWindow()
    bar = window.tabs.tabBar()
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(2).center())
    tab = window.training_tab
    qtbot.waitUntil(lambda: window.tabs.currentWidget() is tab and form_ready(tab),
                    timeout=120000)
    _click_menu_item(qtbot, window, "View", "Serve")
    qtbot.waitUntil(lambda: window.serve_panel is not None and window.serve_panel.isVisible(), timeout=5000)
    _click_menu_item(qtbot, window, "View", "Health")
    qtbot.waitUntil(lambda: window.health_view is not None and window.health_view.isVisible(), timeout=5000)
    qtbot.waitUntil(lambda: tab.splitter.orientation() == Qt.Orientation.Vertical, timeout=3000)
    qtbot.wait(50)  # the layouts settle
    assert window.width() <= 1024 and window.height() <= 700, (window.size(), window.minimumSizeHint())
    assert tab.form_scroll.width() >= tab.form.minimumSizeHint().width(), "the form is clipped"
    assert not tab.btn["Start"].visibleRegion().isEmpty()
    # A wider window puts them side by side again.
    window.resize(1600, 900)
    qtbot.waitUntil(lambda: tab.splitter.orientation() == Qt.Orientation.Horizontal, timeout=3000)
    assert not tab.btn["Start"].visibleRegion().isEmpty()


@pytest.mark.usefixtures("demo_model")
def test_closing_with_serve_running_names_it_and_ends_it(qtbot, window: MainWindow) -> None:
    """Issue 25, item 15: closing the window while Serve runs asked nothing and killed it. Now the
    dialog names the server and offers the three choices of every job (issue 26: a server is a
    detached job), and Stop and quit ends it cleanly before the window closes."""
    from PySide6.QtCore import Qt

    from gaudi_gui.core.serve import pick_free_port, port_free

    # Issue 37, item 13: the dialog also names the Model runner holding a loaded model, and each by
    # what the user chose (builtin:demo), not the model's cache folder.
    runner = window.runner_tab
    window.tabs.setCurrentWidget(runner)
    with qtbot.waitSignal(runner.client.model_loaded, timeout=180_000):
        click(qtbot, runner.load_button)
    window.activateWindow()
    ctrl_shift = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    qtbot.keyClick(window, Qt.Key.Key_S, ctrl_shift)
    qtbot.waitUntil(lambda: window.serve_panel is not None and window.serve_panel.isVisible(), timeout=5000)
    panel = window.serve_panel
    assert panel is not None
    port = pick_free_port()
    panel.port.selectAll()
    qtbot.keyClicks(panel.port, str(port))
    click(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: panel.status.text().startswith("ready"), timeout=180_000)
    server = panel.service

    answer = answer_dialog(qtbot, "Cancel")
    window.close()
    assert answer.clicked, "no close dialog was shown"
    assert f"Serve: builtin:demo at http://127.0.0.1:{port}" in answer.text, answer.text
    assert "Model runner: builtin:demo loaded" in answer.text, answer.text
    assert "2 job(s)" in answer.text
    assert "the job goes on and is followed again at the next start" in answer.text
    assert "Leave running and quit" in answer.buttons and "Stop and quit" in answer.buttons
    assert window.isVisible() and server.is_running()

    answer = answer_dialog(qtbot, "Stop and quit")
    with qtbot.waitSignal(window.closed, timeout=60_000):
        window.close()
    assert answer.clicked
    qtbot.waitUntil(lambda: not server.is_running() and port_free(port), timeout=30_000)
    qtbot.waitUntil(lambda: not runner.client.is_running(), timeout=30_000)
    assert panel.status.text().startswith("stopped"), panel.status.text()

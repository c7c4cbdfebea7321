"""The app shell: tabs, the environment probe shown, settings kept, and an orderly close."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from gaudi_gui.app import create_services
from gaudi_gui.ui.main_window import MainWindow


class FakeJobs:
    """A JobOwner whose job ends a few event-loop turns after stop_jobs()."""

    def __init__(self) -> None:
        self.running = ["training run demo-1 (step 3/10)"]
        self.stopped = False
        self.detached = False

    def active_jobs(self) -> list[str]:
        return list(self.running)

    def stop_jobs(self) -> None:
        self.stopped = True
        from PySide6.QtCore import QTimer

        QTimer.singleShot(200, self.running.clear)

    def detach_jobs(self) -> list[str]:
        self.detached = True
        return list(self.running)

    def shutdown(self) -> None:
        pass


@pytest.fixture
def window(qtbot) -> Iterator[MainWindow]:
    services = create_services()
    win = MainWindow(services)
    qtbot.addWidget(win)
    win.show()
    yield win
    if not win._shut_down:
        win._shutdown_tabs()


def test_tabs_and_probe_in_status_bar(qtbot, window: MainWindow) -> None:
    titles = [window.tabs.tabText(i).replace("&", "") for i in range(window.tabs.count())]
    assert titles == ["Devices", "Model runner", "Training", "Environment", "Hosts"]
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


def test_close_with_running_job_cancel_keeps_window(qtbot, window: MainWindow,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = FakeJobs()
    monkeypatch.setattr(window, "_owners", lambda: [jobs])
    monkeypatch.setattr(MainWindow, "_ask_about_jobs", lambda self, j: "cancel")
    window.close()
    assert window.isVisible() and not jobs.stopped and not jobs.detached


def test_close_with_running_job_stop_waits_for_it(qtbot, window: MainWindow,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = FakeJobs()
    monkeypatch.setattr(window, "_owners", lambda: [jobs])
    monkeypatch.setattr(MainWindow, "_ask_about_jobs", lambda self, j: "stop")
    with qtbot.waitSignal(window.closed, timeout=10000):
        window.close()
    assert jobs.stopped and not jobs.running
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=5000)


def test_close_with_running_job_leave_detaches(qtbot, window: MainWindow,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    jobs = FakeJobs()
    monkeypatch.setattr(window, "_owners", lambda: [jobs])
    monkeypatch.setattr(MainWindow, "_ask_about_jobs", lambda self, j: "leave")
    with qtbot.waitSignal(window.closed, timeout=5000):
        window.close()
    assert jobs.detached and not jobs.stopped


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


def test_every_menu_item_and_shortcut_by_click(qtbot, window: MainWindow,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QMessageBox

    window.activateWindow()
    for index, name in enumerate(("Devices", "Model runner", "Training", "Environment")):
        _click_menu_item(qtbot, window, "View", name)
        qtbot.waitUntil(lambda i=index: window.tabs.currentIndex() == i, timeout=3000)
    for index in (3, 2, 1, 0):
        qtbot.keyClick(window, getattr(Qt.Key, f"Key_{index + 1}"), Qt.KeyboardModifier.ControlModifier)
        qtbot.waitUntil(lambda i=index: window.tabs.currentIndex() == i, timeout=3000)
    shown: list[str] = []
    monkeypatch.setattr(QMessageBox, "about", staticmethod(lambda _p, title, text: shown.append(title)))
    _click_menu_item(qtbot, window, "Help", "About gaudi-gui")
    qtbot.waitUntil(lambda: bool(shown), timeout=3000)
    _click_menu_item(qtbot, window, "File", "Quit")
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=5000)


def test_ctrl_q_quits(qtbot, window: MainWindow) -> None:
    from PySide6.QtCore import Qt

    window.activateWindow()
    qtbot.keyClick(window, Qt.Key.Key_Q, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(lambda: not window.isVisible(), timeout=5000)

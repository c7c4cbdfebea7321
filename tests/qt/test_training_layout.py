"""The Training tab at 1280x800 and 1024x700: readable charts, a visible remembered splitter, no
horizontal scrolling in the form, dialogs that start at home, and form edits that survive a restart."""

# mypy: disable-error-code="union-attr,attr-defined"
from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QFileDialog

from gaudi_gui.app import create_services
from gaudi_gui.core.runstore import RunStore
from gaudi_gui.ui.training_tab import TrainingTab
from tests.helpers import form_ready


def _tab(qtbot, services, size: tuple[int, int]) -> TrainingTab:
    w = TrainingTab(services)
    qtbot.addWidget(w)
    w.resize(*size)
    w.show()
    qtbot.waitExposed(w)
    qtbot.waitUntil(lambda: form_ready(w), timeout=60000)
    return w


@pytest.fixture
def services(tmp_path: Path):
    s = create_services()
    s.settings.set("training/runs_dir", str(tmp_path / "runs"))
    s.training.store = RunStore(tmp_path / "runs")
    yield s
    s.training.shutdown()


@pytest.mark.parametrize("size", [(1280, 800), (1024, 700)])
def test_layout_is_readable(qtbot, services, size: tuple[int, int]) -> None:
    w = _tab(qtbot, services, size)
    qtbot.waitUntil(lambda: w.chart.lr_plot.height() > 0, timeout=5000)
    for plot in (w.chart.loss_plot, w.chart.lr_plot, w.chart.device_plot):
        assert plot.height() >= 85, (plot, plot.height())
    # The form fits its column: no horizontal scrolling.
    assert not w.form_scroll.horizontalScrollBar().isVisible()
    assert w.splitter.handleWidth() >= 5
    w.shutdown()


def test_splitter_position_and_unsaved_edits_survive_a_restart(qtbot, services) -> None:
    first = _tab(qtbot, services, (1280, 800))
    handle = first.splitter.handle(1)
    start = first.splitter.sizes()[0]
    centre = handle.rect().center()
    qtbot.mousePress(handle, Qt.MouseButton.LeftButton, pos=centre)
    qtbot.mouseMove(handle, QPoint(centre.x() + 120, centre.y()))
    qtbot.mouseRelease(handle, Qt.MouseButton.LeftButton, pos=QPoint(centre.x() + 120, centre.y()))
    qtbot.waitUntil(lambda: first.splitter.sizes()[0] > start + 40, timeout=3000)
    moved = first.splitter.sizes()[0]
    editor = first.form.editors["max_steps"].editor
    editor.clear()
    qtbot.keyClicks(editor, "77")
    first.shutdown()  # the app closing: the draft is written now, not only after the debounce
    second = _tab(qtbot, services, (1280, 800))
    assert second.form.editors["max_steps"].editor.text() == "77"
    assert abs(second.splitter.sizes()[0] - moved) <= 10
    second.shutdown()


def test_file_dialogs_start_at_home_then_the_last_folder(qtbot, services, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    w = _tab(qtbot, services, (1280, 800))
    seen: list[str] = []
    target = tmp_path / "jobs" / "mine.json"
    target.parent.mkdir()

    def save(_parent, _title, start, _filter):
        seen.append(start)
        return str(target), ""

    def open_(_parent, _title, start, _filter):
        seen.append(start)
        return "", ""
    monkeypatch.setattr(QFileDialog, "getSaveFileName", staticmethod(save))
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(open_))
    qtbot.mouseClick(w.btn["Save job…"], Qt.MouseButton.LeftButton)
    assert Path(seen[0]).parent == Path.home()
    assert target.is_file()
    qtbot.mouseClick(w.btn["Load job…"], Qt.MouseButton.LeftButton)
    assert seen[1] == str(target.parent)
    w.shutdown()


def test_the_form_column_fits_the_form_before_its_schema_comes(qtbot, services, monkeypatch) -> None:
    """A fresh install has no cached schema: the form is shown before the schema child answers, and
    its column was fitted only when the schema came, so for those seconds (and in the meter
    screenshots) the form was cut on the right. The column now follows the form's layout."""
    from gaudi_gui.services.schema import SchemaLoader
    from gaudi_gui.ui import training_tab as tt

    monkeypatch.setattr(tt, "latest_cached", lambda: None)
    monkeypatch.setattr(SchemaLoader, "load", lambda self, *_a, **_k: None)  # no answer yet
    w = TrainingTab(services)
    qtbot.addWidget(w)
    w.resize(1024, 700)
    w.show()
    qtbot.waitExposed(w)
    assert w.form.schema is None
    qtbot.waitUntil(lambda: w.form_scroll.width() >= w.form.minimumSizeHint().width(), timeout=5000)
    assert w.form.width() >= w.form.minimumSizeHint().width()
    w.shutdown()  # its draft and log timers, as the window stops them at close

"""The Runs list's "Open in TensorBoard" / "Open in trackio" (issue 27), clicked: a real TensorBoard on a
free port of 127.0.0.1, the browser (intercepted with QDesktopServices.setUrlHandler) opened at the run,
the page fetched over HTTP, the same dashboard reused for the next run, and gone with the window; a
trackio missing from the Python that serves it is said with the pip command."""
# mypy: disable-error-code="union-attr"

from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QObject, Qt, QUrl, Slot
from PySide6.QtGui import QDesktopServices

from gaudi_gui.core import dashboard
from gaudi_gui.core.events import EventWriter
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, RunStore
from gaudi_gui.ui.training_runs import RunsTable
from tests.helpers import click


class _Browser(QObject):
    """Stands in for the browser: the URLs the app asked to open."""

    def __init__(self) -> None:
        super().__init__()
        self.urls: list[str] = []

    @Slot(QUrl)
    def take(self, url: QUrl) -> None:
        self.urls.append(url.toString())


def _run(store: RunStore, tmp_path: Path, name: str) -> Run:
    run = store.create(JobConfig(name=name, training_args={"output_dir": str(tmp_path / name)}))
    run.update_status(state="finished", step=3, max_steps=3, started_at=1_700_000_000.0,
                      ended_at=1_700_000_010.0, summary="Finished 3 steps")
    with EventWriter(run.events_path) as events:
        for step in (1, 2, 3):
            events.write("metrics", step=step, max_steps=3, loss=4.0 - step / 10, time=1_700_000_000.0 + step)
    return run


def _select(qtbot, table: RunsTable, run: Run) -> None:
    row = next(r for r in range(table.table.rowCount()) if table.table.item(r, 0).text().startswith(run.name))
    rect = table.table.visualRect(table.table.model().index(row, 0))
    click(qtbot, table.table.viewport(), rect.center())
    assert table.selected_runs() == [run]


def test_open_in_tensorboard_clicked_opens_the_browser_at_the_run(qtbot, tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    first, second = _run(store, tmp_path, "first"), _run(store, tmp_path, "second")
    browser = _Browser()
    QDesktopServices.setUrlHandler("http", browser, "take")  # type: ignore[arg-type]  # str at run time
    table = RunsTable(store)
    qtbot.addWidget(table)
    try:
        table.resize(1000, 500)
        table.show()
        qtbot.waitExposed(table)
        _select(qtbot, table, first)
        click(qtbot, table.buttons["Open in TensorBoard"])
        assert "opening" in table.status.text() and not table.buttons["Open in TensorBoard"].isEnabled()
        qtbot.waitUntil(lambda: len(browser.urls) == 1, timeout=120_000)
        url = browser.urls[0]
        assert url.startswith("http://127.0.0.1:") and f"runFilter={first.name}" in url
        assert dashboard.fetch(url)[0] == 200
        assert url in table.status.text() and "stops when this window closes" in table.status.text()
        assert table.buttons["Open in TensorBoard"].isEnabled()
        # The next run: the same dashboard (same port), the browser at that run.
        _select(qtbot, table, second)
        click(qtbot, table.buttons["Open in TensorBoard"])
        qtbot.waitUntil(lambda: len(browser.urls) == 2, timeout=60_000)
        assert browser.urls[1].split("?")[0] == url.split("?")[0]
        assert f"runFilter={second.name}" in browser.urls[1]
        assert dashboard.lists_run("tensorboard", url.split("?")[0], second.name)
        assert len(table.dashboards.running()) == 1

        # trackio missing from the Python that serves the dashboards: said at once, with the pip command.
        bare = tmp_path / "bare-python"
        bare.write_text(f"#!/bin/sh\nexec {__import__('sys').executable} -S \"$@\"\n")
        bare.chmod(0o755)
        table.dashboards.python = str(bare)
        click(qtbot, table.buttons["Open in trackio"])
        qtbot.waitUntil(lambda: "⚠" in table.status.text(), timeout=60_000)
        qtbot.waitUntil(lambda: ("trackio", "local") not in table.dashboards.running(), timeout=30_000)
        assert table.status.text().startswith("⚠ trackio is not installed in")  # its own words, once
        assert f"{bare} -m pip install 'trackio>=0.40'" in table.status.text()
        assert table.buttons["Open in trackio"].isEnabled() and len(browser.urls) == 2
    finally:
        # The window closes: the dashboards end with it (they are not jobs to keep).
        table.shutdown()
        QDesktopServices.unsetUrlHandler("http")
    qtbot.waitUntil(lambda: not table.dashboards.running(), timeout=30_000)
    assert dashboard.fetch(url.split("?")[0], timeout=1)[0] == 0


@pytest.mark.qt_log_ignore("This plugin does not support QPlatformServices::openUrl")
def test_open_in_tensorboard_without_a_browser_says_where_the_dashboard_is(qtbot, tmp_path: Path) -> None:
    """Issue 37 item 7: "opened in the browser" was said whatever the browser did. Here nothing
    intercepts the URL and the session has no browser (the offscreen platform cannot open one:
    QDesktopServices.openUrl answers False, as on a server's session without xdg-open): the
    status says so, with the address to open."""
    store = RunStore(tmp_path / "runs")
    run = _run(store, tmp_path, "alone")
    table = RunsTable(store)
    qtbot.addWidget(table)
    try:
        table.resize(1000, 500)
        table.show()
        qtbot.waitExposed(table)
        _select(qtbot, table, run)
        click(qtbot, table.buttons["Open in TensorBoard"])
        qtbot.waitUntil(lambda: ("tensorboard", "local") in table.dashboards.urls
                        and "TensorBoard: http" in table.status.text(), timeout=120_000)
        url = table.dashboards.urls[("tensorboard", "local")]
        assert f"runFilter={run.name}" in url and dashboard.fetch(url)[0] == 200  # the dashboard is there
        text = table.status.text()
        assert url in text and "no browser could be opened here" in text, text
        assert "opened in the browser" not in text
        assert table.status.textInteractionFlags() & Qt.TextInteractionFlag.TextSelectableByMouse
    finally:
        table.shutdown()
    qtbot.waitUntil(lambda: not table.dashboards.running(), timeout=30_000)

"""Serve and Evaluate are jobs that outlive the window (issue 26): started by clicking, left running
through the close dialog, taken up again by the next window (the Serve panel shows the endpoint, and
its Stop ends it), their run folders in the Runs list with their kind. Real children, the demo model,
real HTTP."""

from __future__ import annotations

import contextlib
import json
import urllib.request
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.exceptions import TimeoutError
from pytestqt.qtbot import QtBot

from gaudi_gui.app import create_services
from gaudi_gui.core import jobkind
from gaudi_gui.core.runstore import Run, RunStore
from gaudi_gui.core.serve import pick_free_port, port_free
from gaudi_gui.ui.main_window import MainWindow
from gaudi_gui.ui.serve_panel import ServePanel
from gaudi_gui.ui.training_runs import COLUMNS, RunsTable
from tests.helpers import answer_dialog, click, close_window


def _window(qtbot: QtBot) -> MainWindow:
    win = MainWindow(create_services())
    qtbot.addWidget(win, before_close_func=lambda w: close_window(qtbot, w) if w.isVisible() else None)
    win.show()
    return win


def _open_panel(qtbot: QtBot, window: MainWindow) -> ServePanel:
    ctrl_shift = Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.ShiftModifier
    for _ in range(3):  # a window shown a moment ago may miss the first key press (offscreen)
        window.activateWindow()
        qtbot.keyClick(window, Qt.Key.Key_S, ctrl_shift)
        with contextlib.suppress(TimeoutError):
            qtbot.waitUntil(lambda: window.serve_panel is not None and window.serve_panel.isVisible(),
                            timeout=2000)
            break
    assert window.serve_panel is not None and window.serve_panel.isVisible()
    return window.serve_panel


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/models", timeout=10) as response:
            return response.status == 200
    except OSError:
        return False


@pytest.mark.usefixtures("demo_model")
def test_a_server_left_running_is_reattached_by_the_next_window_and_stopped_there(qtbot: QtBot) -> None:
    first = _window(qtbot)
    panel = _open_panel(qtbot, first)
    port = pick_free_port()
    panel.port.selectAll()
    qtbot.keyClicks(panel.port, str(port))
    click(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: panel.status.text().startswith("ready"), timeout=180_000)
    url = f"http://127.0.0.1:{port}/v1"
    assert url in panel.url.text() and _answers(url)
    run = Run(panel.service.folder)
    assert run.kind == "serve" and run.supervisor() is not None

    answer = answer_dialog(qtbot, "Leave running and quit")
    with qtbot.waitSignal(first.closed, timeout=60_000):
        first.close()
    assert answer.clicked and "Serve: " in answer.text and url in answer.text
    # The window is gone; the server is not.
    assert run.status().state == "running" and _answers(url)

    second = _window(qtbot)
    again = _open_panel(qtbot, second)
    qtbot.waitUntil(lambda: url in again.url.text() and again.stop_button.isEnabled(), timeout=60_000)
    assert again.copy_button.isEnabled() and not again.start_button.isEnabled()
    assert again.service.folder == str(run.folder)
    click(qtbot, again.stop_button)
    qtbot.waitUntil(lambda: again.status.text().startswith("stopped"), timeout=60_000)
    assert port_free(port) and not _answers(url)
    qtbot.waitUntil(lambda: run.status().state != "running", timeout=60_000)  # the supervisor's last word
    status = run.status()
    assert (status.kind, status.state) == ("serve", "stopped") and "is free" in status.summary, status
    assert json.loads((run.folder / jobkind.ENDPOINT_NAME).read_text())["port"] == port


@pytest.mark.usefixtures("demo_model")
def test_the_runs_list_names_the_kind_and_offers_no_resume_for_a_server(qtbot: QtBot) -> None:
    window = _window(qtbot)
    panel = _open_panel(qtbot, window)
    port = pick_free_port()
    panel.port.selectAll()
    qtbot.keyClicks(panel.port, str(port))
    click(qtbot, panel.start_button)
    qtbot.waitUntil(lambda: bool(panel.service.folder), timeout=60_000)
    table = RunsTable(RunStore())
    qtbot.addWidget(table)
    table.show()
    qtbot.waitUntil(lambda: table.table.rowCount() == 1, timeout=10_000)
    kind = table.table.item(0, COLUMNS.index("kind"))
    assert kind is not None and kind.text() == "serve"
    table.table.selectRow(0)
    assert not table.buttons["Resume"].isEnabled() and not table.buttons["Try in runner"].isEnabled()
    assert table.buttons["Refresh"].isEnabled()
    click(qtbot, panel.stop_button)
    qtbot.waitUntil(lambda: panel.status.text().startswith(("stopped", "failed")), timeout=120_000)
    assert port_free(port)


def test_the_close_dialog_lists_a_server_and_an_evaluation(qtbot: QtBot, tiny_model_dir: Path,
                                                             tmp_path: Path) -> None:
    """Both jobs named, with Leave running offered; Leave running keeps the evaluation going with no
    window, and its results land in its run folder."""
    window = _window(qtbot)
    services = window.services
    serve = services.ensure_serve(services.settings.parent())
    evaluation = services.ensure_evaluation(services.settings.parent())
    from gaudi_gui.core.evaluation import EvalSpec
    from gaudi_gui.core.serve import ServeSpec
    port = pick_free_port()
    assert serve.start(ServeSpec(model=str(tiny_model_dir), port=port, device="cpu")) == []
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("".join(f"prompt {i}\n" for i in range(6)))
    spec = EvalSpec(model=str(tiny_model_dir), base=str(tiny_model_dir), prompts_file=str(prompts),
                    metrics=["exact_match"], max_new_tokens=16)
    assert evaluation.start(spec) == []
    qtbot.waitUntil(lambda: bool(serve.folder and evaluation.folder), timeout=60_000)
    answer = answer_dialog(qtbot, "Leave running and quit")
    with qtbot.waitSignal(window.closed, timeout=60_000):
        window.close()
    assert "Serve: " in answer.text and "Evaluate: " in answer.text, answer.text
    assert "the 2 jobs go on" in answer.text
    run = Run(evaluation.folder)
    qtbot.waitUntil((run.folder / jobkind.RESULT_NAME).is_file, timeout=120_000)
    qtbot.waitUntil(lambda: run.status().state == "finished", timeout=30_000)
    server = Run(serve.folder)
    assert server.status().state in ("queued", "running")
    from tests.integration.test_job_kinds import _cli
    assert _cli("runs", "stop", server.name).returncode == 0
    qtbot.waitUntil(lambda: server.status().state in ("stopped", "failed") and port_free(port),
                    timeout=60_000)

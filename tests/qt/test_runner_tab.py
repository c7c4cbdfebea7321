"""The Model runner tab end to end on the tiny demo model: load, chat, stream, stop, export."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from gaudi_gui.app import create_services
from gaudi_gui.services import generation_client as gc
from gaudi_gui.ui.runner_tab import RunnerTab

pytestmark = pytest.mark.usefixtures("demo_model")


@pytest.fixture
def tab(qtbot) -> Iterator[RunnerTab]:
    widget = RunnerTab(create_services())
    qtbot.addWidget(widget)
    widget.show()
    yield widget
    widget.shutdown()
    qtbot.waitUntil(lambda: not widget.client.is_running(), timeout=10000)


def _load(qtbot, tab: RunnerTab) -> None:
    assert tab.model.currentText() == "builtin:demo"
    with qtbot.waitSignal(tab.client.model_loaded, timeout=120000):
        tab.load_model()
    assert "Loaded" in tab.model_status.text() and "parameters" in tab.model_status.text()
    assert tab.send_button.isEnabled()


def test_chat_streams_two_turns_and_exports(qtbot, tab: RunnerTab, tmp_path: Path) -> None:
    _load(qtbot, tab)
    tab.chat_mode.setChecked(True)
    tab.do_sample.setChecked(False)
    tab.max_new_tokens.setValue(12)
    tokens: list[str] = []
    tab.client.token_received.connect(tokens.append)
    for question in ("What is the loss?", "And the learning rate?"):
        tab.prompt.setPlainText(question)
        with qtbot.waitSignal(tab.client.generation_finished, timeout=60000):
            tab.send()
    assert len(tab.conversation.turns) == 4
    assert len(tokens) > 2  # streamed piece by piece, not in one block
    assert tab.conversation.last_answer() and tab.conversation.last_answer() in tab.view.toPlainText()
    assert "tok/s" in tab.stats.text() and "TTFT" in tab.stats.text()
    tab.export(str(tmp_path / "chat.json"))
    data = json.loads((tmp_path / "chat.json").read_text())
    assert [t["role"] for t in data["turns"]] == ["user", "assistant", "user", "assistant"]
    tab.export(str(tmp_path / "chat.md"))
    assert "## Assistant" in (tmp_path / "chat.md").read_text()
    tab.copy_answer()
    from PySide6.QtGui import QGuiApplication

    assert QGuiApplication.clipboard().text() == tab.conversation.last_answer()


def test_stop_ends_generation_in_the_worker(qtbot, tab: RunnerTab) -> None:
    _load(qtbot, tab)
    tab.chat_mode.setChecked(False)
    tab.max_new_tokens.setValue(100000)
    tab.prompt.setPlainText("The learning rate")
    first: list[str] = []
    tab.client.token_received.connect(first.append)
    tab.send()
    qtbot.waitUntil(lambda: len(first) > 3, timeout=60000)
    assert tab.stop_button.isEnabled()
    with qtbot.waitSignal(tab.client.generation_finished, timeout=10000) as blocker:
        tab.stop()
    assert blocker.args[0]["stop_reason"] == "cancelled"
    assert tab.client.state == gc.LOADED and tab.send_button.isEnabled()


def test_bad_input_is_a_message_not_a_crash(qtbot, tab: RunnerTab, tmp_path: Path) -> None:
    tab.model.setCurrentText(str(tmp_path / "no-such-model"))
    tab.load_model()
    assert "no such folder" in tab.model_status.text()
    tab.model.setCurrentText("builtin:demo")
    _load(qtbot, tab)
    tab.do_sample.setChecked(True)
    tab.temperature.setValue(0.0)
    tab.prompt.setPlainText("hello")
    tab.send()
    assert "temperature" in tab.stats.text()
    assert tab.client.state == gc.LOADED


def test_worker_killed_mid_generation_is_reported(qtbot, tab: RunnerTab) -> None:
    _load(qtbot, tab)
    tab.chat_mode.setChecked(False)
    tab.max_new_tokens.setValue(100000)
    tab.prompt.setPlainText("The learning rate")
    tab.send()
    qtbot.waitUntil(lambda: tab.client.state == gc.GENERATING, timeout=10000)
    with qtbot.waitSignal(tab.client.worker_exited, timeout=10000):
        tab.client._runner.kill_tree()
    assert "killed by signal 9" in tab.model_status.text()
    assert tab.load_button.isEnabled()


def test_presets_round_trip(qtbot, tab: RunnerTab) -> None:
    tab.max_new_tokens.setValue(77)
    tab.save_preset("mine")
    tab.max_new_tokens.setValue(5)
    tab.presets.setCurrentText("mine")
    tab._apply_preset()
    assert tab.max_new_tokens.value() == 77
    assert "mine" in tab._settings.get("runner/presets")

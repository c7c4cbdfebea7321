"""The Model runner tab, driven as a person drives it: every button, shortcut and action is clicked or
typed on the real widget, and the tests wait for what a person would see. The main flow runs against
the real worker on the tiny demo model."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QFileDialog, QInputDialog, QMessageBox

from gaudi_gui.app import create_services
from gaudi_gui.core import generation
from gaudi_gui.services import generation_client as gc
from gaudi_gui.ui.runner_tab import RunnerTab
from tests.helpers import click

pytestmark = pytest.mark.usefixtures("demo_model")

LOAD_TIMEOUT_MS = 120_000


@pytest.fixture
def tab(qtbot) -> Iterator[RunnerTab]:
    widget = RunnerTab(create_services())
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    widget.activateWindow()
    qtbot.waitUntil(widget.isActiveWindow, timeout=5000)
    yield widget
    widget.shutdown()
    qtbot.waitUntil(lambda: not widget.client.is_running(), timeout=10000)


def click_load(qtbot, tab: RunnerTab) -> None:
    with qtbot.waitSignal(tab.client.model_loaded, timeout=LOAD_TIMEOUT_MS):
        click(qtbot, tab.load_button)
    qtbot.waitUntil(lambda: "Loaded" in tab.model_status.text() and tab.send_button.isEnabled())
    assert "parameters" in tab.model_status.text() and tab.load_progress.isHidden()


def type_prompt(qtbot, tab: RunnerTab, text: str) -> None:
    tab.prompt.clear()
    qtbot.keyClicks(tab.prompt, text)


def ctrl_return(qtbot, tab: RunnerTab) -> None:
    qtbot.keyClick(tab.prompt, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)


def test_load_send_stop_copy_export_restart_by_clicks(qtbot, tab: RunnerTab, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    assert tab.model.currentText() == "builtin:demo"
    assert tab.cancel_load_button.isHidden()
    click_load(qtbot, tab)
    assert tab._settings.get("runner/last_model") == "builtin:demo"

    # Send (button) a long answer, watch it stream, Stop (button).
    tab.chat_mode.setChecked(False)
    tab.do_sample.setChecked(False)
    tab.max_new_tokens.setValue(100_000)
    type_prompt(qtbot, tab, "The learning rate")
    click(qtbot, tab.send_button)
    start = len(tab.view.toPlainText())
    qtbot.waitUntil(lambda: len(tab.view.toPlainText()) > start + 20, timeout=60000)
    click(qtbot, tab.stop_button)
    qtbot.waitUntil(lambda: "cancelled" in tab.stats.text(), timeout=10000)
    assert tab.send_button.isEnabled() and not tab.stop_button.isEnabled()

    # Ctrl+Return sends, Esc stops.
    type_prompt(qtbot, tab, "The loss")
    qtbot.keyClick(tab.prompt, Qt.Key.Key_Return, Qt.KeyboardModifier.ControlModifier)
    qtbot.waitUntil(tab.stop_button.isEnabled, timeout=10000)
    qtbot.waitUntil(lambda: "generating" in tab.stats.text(), timeout=10000)
    qtbot.keyClick(tab.prompt, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: "cancelled" in tab.stats.text(), timeout=10000)

    # Ctrl+Enter (keypad) sends a chat turn that ends by itself; the answer is shown with its stats.
    tab.chat_mode.setChecked(True)
    tab.max_new_tokens.setValue(12)
    type_prompt(qtbot, tab, "What is the loss?")
    qtbot.keyClick(tab.prompt, Qt.Key.Key_Enter,
                   Qt.KeyboardModifier.ControlModifier | Qt.KeyboardModifier.KeypadModifier)
    qtbot.waitUntil(lambda: "tok/s" in tab.stats.text() and "TTFT" in tab.stats.text(), timeout=60000)
    answer = tab.conversation.last_answer()
    assert answer and answer in tab.view.toPlainText() and len(tab.conversation.turns) == 6

    # Copy answer / Copy chat say what they copied.
    click(qtbot, tab.copy_button)
    assert QGuiApplication.clipboard().text() == answer
    assert tab.notice.text().startswith("Copied the answer")
    click(qtbot, tab.copy_chat_button)
    assert "## Assistant" in QGuiApplication.clipboard().text()
    assert "Copied the conversation" in tab.notice.text()

    # Export… (the dialog answered by the test) writes the file and says so.
    target = tmp_path / "chat.json"
    monkeypatch.setattr(QFileDialog, "getSaveFileName", lambda *a, **k: (str(target), ""))
    click(qtbot, tab.export_button)
    data = json.loads(target.read_text())
    assert [t["role"] for t in data["turns"]][-2:] == ["user", "assistant"]
    assert str(target) in tab.notice.text()

    # Clear.
    click(qtbot, tab.clear_button)
    assert tab.view.toPlainText() == "" and not tab.conversation.turns
    assert "cleared" in tab.notice.text()

    # The worker dies mid-answer: said so; Restart worker brings the model back.
    tab.chat_mode.setChecked(False)
    tab.max_new_tokens.setValue(100_000)
    type_prompt(qtbot, tab, "The learning rate")
    click(qtbot, tab.send_button)
    qtbot.waitUntil(lambda: tab.client.state == gc.GENERATING, timeout=10000)
    with qtbot.waitSignal(tab.client.worker_exited, timeout=10000):
        os.kill(tab.client.pid(), 9)
    qtbot.waitUntil(lambda: "killed by signal 9" in tab.model_status.text())
    assert tab.load_button.isEnabled()
    with qtbot.waitSignal(tab.client.model_loaded, timeout=LOAD_TIMEOUT_MS):
        click(qtbot, tab.restart_button)

    # Unload.
    click(qtbot, tab.unload_button)
    qtbot.waitUntil(lambda: "unloaded" in tab.model_status.text(), timeout=10000)
    assert not tab.send_button.isEnabled() and tab.client.state == gc.IDLE


def test_failed_load_keeps_the_working_model_and_is_not_remembered(
        qtbot, tab: RunnerTab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # No offline flag, and a Hub endpoint where nothing listens: the quick reachability check answers.
    monkeypatch.delenv("HF_HUB_OFFLINE")
    monkeypatch.delenv("TRANSFORMERS_OFFLINE")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")

    tab.model.setCurrentText(str(tmp_path / "no-such-model"))
    click(qtbot, tab.load_button)
    assert "no such folder" in tab.model_status.text()
    assert not tab.client.is_running()

    tab.model.setCurrentText("builtin:demo")
    click_load(qtbot, tab)
    recent = tab._settings.get("runner/recent_models")

    tab.model.setCurrentText("some-org/not-cached")
    tab.dtype.setCurrentText("bf16")
    started = time.perf_counter()
    with qtbot.waitSignal(tab.client.load_failed, timeout=20000) as failed:
        click(qtbot, tab.load_button)
    took = time.perf_counter() - started
    assert failed.args[0] == "no_network", failed.args
    assert took < 5, f"an unreachable Hub took {took:.1f} s to report"
    qtbot.waitUntil(lambda: "still loaded" in tab.model_status.text())
    assert "no network" in tab.model_status.text()
    assert tab.client.state == gc.LOADED and tab.send_button.isEnabled()
    assert tab.client.options is not None and tab.client.options.model == "builtin:demo"
    assert tab._settings.get("runner/last_model") == "builtin:demo"
    assert tab._settings.get("runner/load_options").get("dtype") != "bf16"
    assert tab._settings.get("runner/recent_models") == recent
    assert tab.model.findText("some-org/not-cached") < 0

    # The working model still answers.
    tab.max_new_tokens.setValue(4)
    tab.do_sample.setChecked(False)
    type_prompt(qtbot, tab, "The model")
    click(qtbot, tab.send_button)
    qtbot.waitUntil(lambda: "tok/s" in tab.stats.text() or "tokens" in tab.stats.text(), timeout=60000)


def test_first_demo_load_shows_build_progress_and_can_be_cancelled(
        qtbot, tab: RunnerTab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    demo_dir = tmp_path / "unbuilt-demo"
    monkeypatch.setenv("GAUDI_GUI_DEMO_MODEL_DIR", str(demo_dir))
    click(qtbot, tab.load_button)
    assert tab.load_progress.isVisible() and tab.cancel_load_button.isVisible()
    qtbot.waitUntil(lambda: tab.load_progress.maximum() > 0 and tab.load_progress.value() >= 1,
                    timeout=LOAD_TIMEOUT_MS)
    assert "building the demo model" in tab.model_status.text()
    assert "demo" in tab.load_progress.text()
    with qtbot.waitSignal(tab.client.load_cancelled, timeout=10000):
        click(qtbot, tab.cancel_load_button)
    qtbot.waitUntil(lambda: "Load cancelled" in tab.model_status.text())
    assert tab.client.state == gc.STOPPED and tab.load_button.isEnabled()
    assert tab.load_progress.isHidden() and tab.cancel_load_button.isHidden()
    assert not (demo_dir / "config.json").exists()
    assert tab._settings.get("runner/recent_models") == []


class _BlackHole:
    """A 'Hub' that accepts connections and never answers: a load from it hangs (a stalled network)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.held.append(conn)

    def close(self) -> None:
        # On Linux a close() does not wake a thread blocked in accept(); a shutdown() does (EINVAL).
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self._thread.join(10)
        self.sock.close()
        for conn in self.held:
            conn.close()
        assert not self._thread.is_alive(), "the black hole's accept thread outlived its test"


def test_cancel_a_stalled_load_goes_back_to_the_previous_model(
        qtbot, tab: RunnerTab, monkeypatch: pytest.MonkeyPatch) -> None:
    hole = _BlackHole()
    try:
        monkeypatch.delenv("HF_HUB_OFFLINE")
        monkeypatch.delenv("TRANSFORMERS_OFFLINE")
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{hole.port}")
        click_load(qtbot, tab)
        first_pid = tab.client.pid()
        tab.model.setCurrentText("some-org/stalled")
        click(qtbot, tab.load_button)
        qtbot.waitUntil(lambda: "loading tokenizer" in tab.model_status.text(), timeout=LOAD_TIMEOUT_MS)
        with qtbot.waitSignal(tab.client.model_loaded, timeout=LOAD_TIMEOUT_MS) as loaded:
            click(qtbot, tab.cancel_load_button)
            qtbot.waitUntil(lambda: "Load cancelled" in tab.model_status.text(), timeout=10000)
        assert loaded.args[0]["model"] == "builtin:demo"
        assert tab.client.pid() != first_pid and tab.client.state == gc.LOADED
        assert tab._settings.get("runner/last_model") == "builtin:demo"
        assert tab.model.findText("some-org/stalled") < 0
    finally:
        hole.close()


def test_field_checks_at_the_field(qtbot, tab: RunnerTab) -> None:
    # Without a model Send is disabled, but Ctrl+Return still runs the checks a person would hit.
    assert not tab.send_button.isEnabled()
    # Empty prompt: said at the prompt, nothing sent.
    tab.prompt.clear()
    ctrl_return(qtbot, tab)
    assert tab.prompt_error.isVisible() and "Type a prompt" in tab.prompt_error.text()
    qtbot.keyClicks(tab.prompt, "hello")
    assert tab.prompt_error.isHidden()

    # Bounds live in the fields themselves; a non-finite value cannot be typed.
    assert tab.max_new_tokens.maximum() == generation.MAX_NEW_TOKENS
    assert tab.num_beams.maximum() == generation.MAX_BEAMS
    assert tab.temperature.minimum() == generation.TEMPERATURE_RANGE[0]
    assert tab.repetition_penalty.minimum() == generation.REPETITION_PENALTY_RANGE[0]
    before = tab.temperature.value()
    tab.temperature.lineEdit().selectAll()
    qtbot.keyClicks(tab.temperature, "nan")
    qtbot.keyClick(tab.temperature, Qt.Key.Key_Return)
    assert tab.temperature.value() == before

    # Cross-field problems are marked at their field.
    tab.do_sample.setChecked(True)
    tab.num_beams.setValue(2)
    ctrl_return(qtbot, tab)
    assert tab.params_error.isVisible() and "num_beams" in tab.params_error.text()
    assert "b00020" in tab.num_beams.styleSheet()
    tab.num_beams.setValue(1)
    assert tab.params_error.isHidden() and tab.num_beams.styleSheet() == ""
    qtbot.keyClicks(tab.seed, "abc")
    ctrl_return(qtbot, tab)
    assert "seed" in tab.params_error.text() and "b00020" in tab.seed.styleSheet()
    tab.seed.clear()

    # Stop strings are literal text (no unicode_escape): 。 stays 。, \x is two characters.
    tab.stop_strings.clear()
    tab.stop_strings.insert("。")  # QTest cannot type characters outside Latin-1
    qtbot.keyClicks(tab.stop_strings, ", \\x, \\n\\n, a\\,b")
    assert tab.params().stop == ["。", "\\x", "\n\n", "a,b"]

    # With valid fields and no model, Send says to load one.
    ctrl_return(qtbot, tab)
    assert "load a model first" in tab.stats.text()


def test_presets_by_clicks(qtbot, tab: RunnerTab, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(QInputDialog, "getText", lambda *a, **k: ("mine", True))
    tab.max_new_tokens.setValue(77)
    click(qtbot, tab.save_preset_button)
    assert tab.presets.currentText() == "mine" and "Saved preset 'mine'" in tab.notice.text()
    assert tab._settings.get("runner/presets")["mine"]["max_new_tokens"] == 77

    tab.max_new_tokens.setValue(5)
    assert tab.presets.currentText() == "mine (modified)"
    tab.max_new_tokens.setValue(77)
    assert tab.presets.currentText() == "mine"

    # Choose another preset with the keyboard (as a person does on a closed combo box).
    tab.presets.setFocus()
    qtbot.keyClick(tab.presets, Qt.Key.Key_Home)
    assert tab.preset_name() == "Balanced"
    assert tab.max_new_tokens.value() == generation.GenerationParams().max_new_tokens
    qtbot.keyClick(tab.presets, Qt.Key.Key_End)
    assert tab.preset_name() == "mine" and tab.max_new_tokens.value() == 77

    click(qtbot, tab.delete_preset_button)
    assert "mine" not in tab._settings.get("runner/presets")
    assert tab.presets.findData("mine") < 0 and "Deleted preset 'mine'" in tab.notice.text()
    qtbot.keyClick(tab.presets, Qt.Key.Key_Home)
    click(qtbot, tab.delete_preset_button)
    assert "built in" in tab.notice.text() and tab.presets.findData("Balanced") == 0


def test_browse_trust_and_copy_with_nothing(qtbot, tab: RunnerTab, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(QFileDialog, "getExistingDirectory", lambda *a, **k: str(tmp_path))
    click(qtbot, tab.browse_button)
    assert tab.model.currentText() == str(tmp_path)

    warned: list[str] = []
    monkeypatch.setattr(QMessageBox, "warning", lambda parent, title, text: warned.append(title))
    click(qtbot, tab.trust)
    assert tab.trust.isChecked() and warned == ["Trust remote code"]
    click(qtbot, tab.trust)
    assert not tab.trust.isChecked() and len(warned) == 1

    click(qtbot, tab.copy_button)
    assert "Nothing to copy" in tab.notice.text()
    click(qtbot, tab.copy_chat_button)
    assert "Nothing to copy" in tab.notice.text()

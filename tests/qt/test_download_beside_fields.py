"""Download… beside every model field (issue 28), as a person uses it: the Model runner, the Serve
panel, Evaluate and the Training form each say whether the named model is in the chosen place's Hub
cache, their Download… opens the Download dialog filled in with the model and the place, and once the
download is done every field says "cached" and offers the model first, with its size. The Download
dialog's "Use the token saved in the system keyring": off with the reason where the `keyring` package
is missing; with a keyring holding a token, the token reaches the Hub and nothing else (no argv, no
file).

Against tests/fake_hub.py on 127.0.0.1 (HF_ENDPOINT): nothing here reaches the network."""

from __future__ import annotations

import importlib.machinery
import os
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QApplication, QDialogButtonBox

from gaudi_gui.app import create_services
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import RunStore
from gaudi_gui.services import downloads
from gaudi_gui.ui.download_dialog import DownloadDialog
from gaudi_gui.ui.eval_view import EvalView
from gaudi_gui.ui.main_window import MainWindow
from gaudi_gui.ui.model_field import DETAIL_ROLE, ModelCacheState
from gaudi_gui.ui.models_tab import ModelsTab
from tests.fake_hub import FakeHub, FakeRepo
from tests.helpers import click, close_window, command_lines_while, models_tab, type_over

SECRET = "hf_KeyringTokenForTheTestsOnly0123456789ab"


def open_dialog(qtbot, button) -> DownloadDialog:
    """Click a Download… and wait for the Download dialog a person would see."""
    click(qtbot, button)
    qtbot.waitUntil(lambda: isinstance(QApplication.activeModalWidget(), DownloadDialog), timeout=5000)
    dialog = QApplication.activeModalWidget()
    assert isinstance(dialog, DownloadDialog)
    return dialog


def cancel_dialog(qtbot, dialog: DownloadDialog) -> None:
    cancel = dialog.buttons.button(QDialogButtonBox.StandardButton.Cancel)
    assert cancel is not None
    click(qtbot, cancel)
    qtbot.waitUntil(lambda: not dialog.isVisible(), timeout=5000)


def type_in_combo(qtbot, edit, text: str) -> None:
    """Click an editable drop-down's field, select what it holds, type ``text`` over it."""
    qtbot.mouseClick(edit, Qt.MouseButton.LeftButton)
    qtbot.keyClick(edit, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClicks(edit, text)
    qtbot.waitUntil(lambda: edit.text() == text, timeout=5000)


def wait_state(qtbot, state: ModelCacheState, words: str) -> None:
    qtbot.waitUntil(lambda: words in state.label.text(), timeout=30000)


def test_every_model_field_says_where_the_model_is_and_downloads_it_there(
        qtbot, fake_hub: FakeHub, tmp_path: Path) -> None:
    fake_hub.repos["org/small"] = FakeRepo(files={"config.json": b'{"model_type": "llama"}',
                                                  "model.safetensors": os.urandom(300_000)})
    window = MainWindow(create_services())
    qtbot.addWidget(window, before_close_func=lambda w: close_window(qtbot, w))
    window.resize(1280, 800)
    window.show()
    qtbot.waitExposed(window)

    # The Model runner: the demo model needs nothing; a Hub id not cached here offers Download….
    runner = window.runner_tab
    window.tabs.setCurrentWidget(runner)
    qtbot.waitUntil(lambda: "bundled demo model" in runner.model_cache.label.text(), timeout=5000)
    assert not runner.download_button.isEnabled()
    type_in_combo(qtbot, runner.model.lineEdit(), "org/small")
    wait_state(qtbot, runner.model_cache, "not in this machine's cache")
    assert runner.download_button.isEnabled()
    dialog = open_dialog(qtbot, runner.download_button)
    assert dialog.repo_id.text() == "org/small" and dialog.where.currentData() == "local"
    cancel_dialog(qtbot, dialog)

    # The Serve panel: the same, beside its own model field.
    serve = window.show_serve()
    assert serve is not None
    qtbot.waitUntil(serve.download_button.isVisible, timeout=5000)
    type_over(qtbot, serve.model, "org/small")
    wait_state(qtbot, serve.model_cache, "not in this machine's cache")
    dialog = open_dialog(qtbot, serve.download_button)
    assert dialog.repo_id.text() == "org/small" and dialog.where.currentData() == "local"
    cancel_dialog(qtbot, dialog)

    # Evaluate: a run trained from a Hub model; its base model must be where the evaluation runs.
    job = JobConfig(model="org/small", method="lora", name="beside")
    job.training_args = {"output_dir": str(tmp_path / "out")}
    (tmp_path / "out" / "adapter").mkdir(parents=True)
    (tmp_path / "out" / "adapter" / "adapter_config.json").write_text("{}")
    run = RunStore(tmp_path / "runs").create(job)
    run.update_status(state="finished")
    view = EvalView(run, parent=window.training_tab)  # finds the app's caches through its parents
    view.setWindowFlag(Qt.WindowType.Window, True)
    view.resize(1000, 700)
    view.show()
    qtbot.waitExposed(view)
    assert view.base_model.text() == "org/small"
    wait_state(qtbot, view.model_cache, "not in this machine's cache")
    dialog = open_dialog(qtbot, view.download_button)
    assert dialog.repo_id.text() == "org/small" and dialog.where.currentData() == "local"
    cancel_dialog(qtbot, dialog)

    # The Training form: its Download… is the one that downloads (to the placement: this machine).
    training = window.training_tab
    window.tabs.setCurrentWidget(training)
    form = training.form
    qtbot.waitUntil(form.download_button.isVisible, timeout=5000)
    type_in_combo(qtbot, form.model.lineEdit(), "org/small")
    wait_state(qtbot, training.model_cache, "not in this machine's cache")
    dialog = open_dialog(qtbot, form.download_button)
    assert dialog.repo_id.text() == "org/small" and dialog.where.currentData() == "local"
    click(qtbot, dialog.download_button)
    models = window.models_tab
    qtbot.waitUntil(lambda: len(models.download_rows) == 1, timeout=5000)
    row = models.download_rows[0]
    qtbot.waitUntil(lambda: row.job.ok is not None, timeout=60000)
    assert row.job.ok, row.status.text()

    # Every field says so now, with the size, and its Download… is off (nothing to fetch).
    for state in (runner.model_cache, serve.model_cache, view.model_cache, training.model_cache):
        wait_state(qtbot, state, "cached on this machine, ")
        assert "no network needed" in state.label.text()
        assert not state.button.isEnabled()

    # The cache goes by the exact spelling: another case is not a load without the network.
    window.tabs.setCurrentWidget(runner)
    type_in_combo(qtbot, runner.model.lineEdit(), "ORG/Small")
    wait_state(qtbot, runner.model_cache, "it holds org/small")
    assert runner.download_button.isEnabled()

    # Cached models first in a drop-down field, with their size beside them; typing still works.
    combo = form.model
    assert combo.itemText(0) == "org/small" and "KB" in str(combo.itemData(0, DETAIL_ROLE))
    window.tabs.setCurrentWidget(training)
    qtbot.waitUntil(combo.isVisible, timeout=5000)
    click(qtbot, combo, QPoint(combo.width() - 8, combo.height() // 2))  # its arrow
    qtbot.waitUntil(combo.view().isVisible, timeout=5000)
    qtbot.keyClick(combo.view(), Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not combo.view().isVisible(), timeout=5000)
    view.close()
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow, timeout=5000)
    # And as the user types in Serve's plain field: the cache's models that match, in a list.
    type_over(qtbot, serve.model, "org/sm")
    popup = serve.model_cache.completer.popup()
    assert popup is not None
    qtbot.waitUntil(popup.isVisible, timeout=5000)
    shown = popup.model()
    assert shown is not None and shown.index(0, 0).data() == "org/small"
    assert "KB" in str(shown.index(0, 0).data(DETAIL_ROLE))
    qtbot.keyClick(popup, Qt.Key.Key_Down)
    qtbot.keyClick(popup, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: serve.model.text() == "org/small", timeout=5000)
    type_over(qtbot, serve.model, "/no/such/folder")
    qtbot.waitUntil(lambda: "a folder" in serve.model_cache.label.text(), timeout=5000)
    assert serve.model.text() == "/no/such/folder"


@pytest.fixture
def tab(qtbot) -> Iterator[ModelsTab]:
    yield from models_tab(qtbot)


def test_keyring_option_is_off_with_the_reason_where_keyring_is_missing(
        qtbot, tab: ModelsTab, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "keyring", None)  # as on a machine without the package
    dialog = open_dialog(qtbot, tab.download_button)
    box = dialog.use_keyring
    assert box.isVisible() and not box.isEnabled() and not box.isChecked()
    assert "keyring` is not installed" in box.toolTip() and "needs the Python package" in box.text()
    assert dialog.problem.text() == ""  # not an error: the dialog works as before
    cancel_dialog(qtbot, dialog)


def _keyring_with(token: str, monkeypatch: pytest.MonkeyPatch, request: pytest.FixtureRequest) -> None:
    """A system keyring holding ``token`` under gaudi-gui's entry: through keyring's own API (an
    in-memory backend, the old one put back after the test) where the package is installed, else a
    stand-in module of the same name (this venv has no keyring)."""
    try:
        import keyring
        from keyring.backend import KeyringBackend
    except ImportError:
        stub = types.ModuleType("keyring")
        stub.__spec__ = importlib.machinery.ModuleSpec("keyring", None)
        stored = {(downloads.KEYRING_SERVICE, downloads.KEYRING_USERNAME): token}
        stub.get_password = lambda service, name: stored.get((service, name))  # type: ignore[attr-defined]
        monkeypatch.setitem(sys.modules, "keyring", stub)
        return

    class Memory(KeyringBackend):
        priority = 1

        def get_password(self, service: str, username: str) -> str | None:
            return token if (service, username) == (downloads.KEYRING_SERVICE,
                                                    downloads.KEYRING_USERNAME) else None

        def set_password(self, service: str, username: str, password: str) -> None:
            raise NotImplementedError

        def delete_password(self, service: str, username: str) -> None:
            raise NotImplementedError

    before = keyring.get_keyring()
    keyring.set_keyring(Memory())
    request.addfinalizer(lambda: keyring.set_keyring(before))


def test_the_keyring_token_reaches_the_hub_and_nothing_else(
        qtbot, fake_hub: FakeHub, tab: ModelsTab, monkeypatch: pytest.MonkeyPatch,
        request: pytest.FixtureRequest) -> None:
    # (The fake Hub's environment before the tab: its first listing starts the agent, whose
    # environment the download inherits.)
    # An empty keyring first: the box says where to save a token, and unticks itself.
    _keyring_with("", monkeypatch, request)
    dialog = open_dialog(qtbot, tab.download_button)
    assert dialog.use_keyring.isEnabled()
    click(qtbot, dialog.use_keyring)
    qtbot.waitUntil(lambda: "keyring set gaudi-gui huggingface" in dialog.problem.text(), timeout=5000)
    assert not dialog.use_keyring.isChecked()
    cancel_dialog(qtbot, dialog)

    _keyring_with(SECRET, monkeypatch, request)
    fake_hub.repos["org/gated"] = FakeRepo(files={"config.json": b"{}"}, gated=True)
    dialog = open_dialog(qtbot, tab.download_button)
    qtbot.keyClicks(dialog.repo_id, "org/gated")
    click(qtbot, dialog.use_keyring)
    qtbot.waitUntil(dialog.use_keyring.isChecked, timeout=5000)
    assert not dialog.token.isEnabled() and dialog.token.text() == ""
    assert SECRET not in dialog.token.text() + dialog.problem.text()
    # A queued job would keep the token in the queue's files: refused, said at the dialog.
    click(qtbot, dialog.queue_button)
    qtbot.waitUntil(lambda: "cannot be queued" in dialog.problem.text(), timeout=5000)
    assert dialog.isVisible() and SECRET not in dialog.problem.text()
    click(qtbot, dialog.download_button)
    qtbot.waitUntil(lambda: len(tab.download_rows) == 1, timeout=5000)
    row = tab.download_rows[0]
    argvs = command_lines_while(qtbot, "org/gated", lambda: row.job.ok is not None)
    assert not any(SECRET in a for a in argvs)
    # The agent's job (no child of the window): the token went in job.start's env, not its words.
    assert SECRET not in " ".join(row.job.request.words())
    qtbot.waitUntil(lambda: row.job.ok is not None, timeout=30000)
    assert not row.job.ok and "gated" in row.status.text()
    assert f"Bearer {SECRET}" in fake_hub.authorizations  # the keyring's token was the one used
    assert SECRET not in row.status.text() + row.notes.text()
    for folder in (Path(os.environ["GAUDI_GUI_HOME"]), Path(os.environ["HF_HOME"])):
        for path in (p for p in folder.rglob("*") if p.is_file()):
            assert SECRET.encode() not in path.read_bytes(), path


def test_cached_models_are_offered_most_recently_used_first() -> None:
    answer = {"models": [
        {"repo_id": "org/old", "repo_type": "model", "size_on_disk": 10, "last_accessed": 100.0,
         "revisions": [{"commit": "a" * 40, "refs": ["main"], "size_on_disk": 10}]},
        {"repo_id": "org/new", "repo_type": "model", "size_on_disk": 20, "last_accessed": 300.0,
         "revisions": [{"commit": "b" * 40, "refs": [], "size_on_disk": 20}]},
        {"repo_id": "org/data", "repo_type": "dataset", "size_on_disk": 5, "last_accessed": 999.0,
         "revisions": [{"commit": "c" * 40, "refs": ["main"], "size_on_disk": 5}]},
        {"repo_id": "org/empty", "repo_type": "model", "size_on_disk": 0, "last_accessed": 500.0,
         "revisions": []}]}
    repos = downloads.cached_repos(answer)
    assert [r["repo_id"] for r in repos] == ["org/new", "org/old"]  # newest use first; models only
    assert repos[1]["size"] == 10 and repos[1]["refs"] == ["main"]
    import time

    from gaudi_gui.ui.model_field import describe
    now = time.time()
    assert describe({"size": 1_500_000_000, "last_used": now - 3 * 86400 - 5}) == "1.5 GB · used 3 days ago"
    assert describe({"size": 1_500_000_000, "last_used": now - 5 * 3600 - 5}).endswith("used 5 h ago")
    assert describe({"size": 0, "last_used": 0}) == "0 B"


@pytest.mark.parametrize(("text", "hub"), [
    ("org/name", True), ("gpt2", True), ("builtin:demo", False), ("/abs/folder", False), ("~/m", False),
    ("./rel", False), ("org/name/extra", False), ("org/../x", False), ("org--x/y", False), ("", False),
    ("org/name; rm -rf /", False)])
def test_what_counts_as_a_hub_id_in_a_field(text: str, hub: bool) -> None:
    from gaudi_gui.ui.model_field import hub_id_or_none

    assert (hub_id_or_none(text) is not None) is hub

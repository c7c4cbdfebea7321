"""The Models tab as a person uses it (issue 28): Download… typed and clicked, progress in bytes, rate,
ETA and files, a stall retried and said in words, Cancel, a gated repo's message, the library listing
this machine's cache, and a downloaded model taken to the Model runner and loaded there offline.

Against tests/fake_hub.py on 127.0.0.1 (HF_ENDPOINT): nothing here reaches the network."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QApplication

from gaudi_gui.app import create_services
from gaudi_gui.core import hub
from gaudi_gui.core.runstore import Run
from gaudi_gui.ui.download_dialog import DownloadDialog
from gaudi_gui.ui.main_window import MainWindow
from gaudi_gui.ui.models_tab import ModelsTab
from tests.fake_hub import FakeHub, FakeRepo, repo_from_folder
from tests.helpers import answer_dialog, click, close_window, command_lines_while, models_tab

SECRET = "hf_FakeTokenForTheTestsOnly0123456789abcd"


@pytest.fixture
def tab(qtbot, fake_hub: FakeHub) -> Iterator[ModelsTab]:
    # The fake Hub's environment first: the tab's first listing starts the agent, which keeps the
    # environment it started with (its downloads inherit it).
    yield from models_tab(qtbot)


def cell(tab: ModelsTab, row: int, column: int) -> str:
    item = tab.table.item(row, column)
    assert item is not None
    return item.text()


def window_children(since: float) -> list[list[str]]:
    """The command lines of the processes this (the window's) process started since ``since`` (a time:
    the test's start; an xdist worker runs many tests, and what an earlier one started, such as a
    session's Slurm cluster, is not this test's) and that still run."""
    out = []
    for proc in psutil.Process().children(recursive=True):
        try:
            if proc.status() != psutil.STATUS_ZOMBIE and proc.create_time() >= since - 0.05:
                out.append(proc.cmdline())
        except psutil.Error:
            continue
    return out


def select_row(qtbot, tab: ModelsTab, row: int) -> None:
    item = tab.table.item(row, 0)
    assert item is not None
    qtbot.mouseClick(tab.table.viewport(), Qt.MouseButton.LeftButton,
                     pos=tab.table.visualItemRect(item).center())
    qtbot.waitUntil(lambda: tab.selected() is not None, timeout=5000)


def download_by_clicks(qtbot, tab: ModelsTab, repo_id: str, *, stall_s: str = "",
                       token: str = "") -> None:
    """Download… clicked, the id (and the stall time, a token) typed, Download clicked."""
    click(qtbot, tab.download_button)
    qtbot.waitUntil(lambda: isinstance(QApplication.activeModalWidget(), DownloadDialog), timeout=5000)
    dialog = QApplication.activeModalWidget()
    assert isinstance(dialog, DownloadDialog)
    assert not dialog.download_button.isEnabled()  # nothing typed yet
    qtbot.keyClicks(dialog.repo_id, repo_id)
    if stall_s:
        qtbot.mouseClick(dialog.stall.lineEdit(), Qt.MouseButton.LeftButton)
        qtbot.keyClick(dialog.stall, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
        qtbot.keyClicks(dialog.stall, stall_s)
        assert dialog.stall.value() == float(stall_s)
    if token:
        qtbot.keyClicks(dialog.token, token)
    qtbot.waitUntil(dialog.download_button.isEnabled, timeout=2000)
    count = len(tab.download_rows)
    click(qtbot, dialog.download_button)
    qtbot.waitUntil(lambda: len(tab.download_rows) == count + 1, timeout=5000)
    qtbot.waitUntil(tab.download_rows[0].isVisible, timeout=5000)


def test_download_shows_progress_lists_the_model_and_loads_offline_in_the_runner(
        qtbot, fake_hub: FakeHub, tiny_model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = repo_from_folder(tiny_model_dir)
    fake_hub.repos["org/tiny-llama"] = repo
    total = sum(len(data) for data in repo.files.values())
    window = MainWindow(create_services())
    qtbot.addWidget(window, before_close_func=lambda w: close_window(qtbot, w))
    window.show()
    tab = window.models_tab
    window.tabs.setCurrentWidget(tab)
    qtbot.waitUntil(lambda: "this machine" in tab.status.text() and not tab.is_listing(), timeout=30000)
    assert tab.table.rowCount() == 0

    # Named in the Model runner's field, Download… beside it opens the dialog with it filled in.
    runner = window.runner_tab
    window.tabs.setCurrentWidget(runner)
    qtbot.waitUntil(runner.download_button.isVisible, timeout=5000)
    field = runner.model.lineEdit()
    qtbot.mouseClick(field, Qt.MouseButton.LeftButton)
    qtbot.keyClick(field, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClicks(field, "org/tiny-llama")
    click(qtbot, runner.download_button)
    qtbot.waitUntil(lambda: isinstance(QApplication.activeModalWidget(), DownloadDialog), timeout=5000)
    dialog = QApplication.activeModalWidget()
    assert isinstance(dialog, DownloadDialog) and window.tabs.currentWidget() is tab
    assert dialog.repo_id.text() == "org/tiny-llama" and dialog.where.currentData() == "local"
    qtbot.waitUntil(dialog.download_button.isEnabled, timeout=2000)
    click(qtbot, dialog.download_button)
    qtbot.waitUntil(lambda: len(tab.download_rows) == 1, timeout=5000)
    row = tab.download_rows[0]
    assert row.cancel_button.isVisible() and "org/tiny-llama" in row.title.text()
    seen: list[str] = []
    row.job.progress_changed.connect(lambda _e: seen.append(row.status.text()))
    qtbot.waitUntil(lambda: row.job.ok is not None, timeout=60000)
    assert row.job.ok, row.status.text()
    # What a person read while it ran: bytes of the total, a rate, an ETA and the files.
    assert seen and all("/s · ETA" in text and "files" in text for text in seen)
    assert row.status.text().startswith("Done.")
    assert f"of {hub.human(total)}" in row.status.text()
    assert f"files {len(repo.files)} of {len(repo.files)}" in row.status.text()
    assert "files" in row.notes.text() and "to download" in row.notes.text()  # the plan, in words
    assert row.bar.value() == row.bar.maximum()
    assert not row.cancel_button.isVisible() and row.runner_button.isVisible()

    # The library lists it, on this machine, with its commit and size.
    qtbot.waitUntil(lambda: tab.table.rowCount() == 1, timeout=30000)
    cells = [cell(tab, 0, c) for c in range(tab.table.columnCount())]
    assert cells[0] == "org/tiny-llama" and cells[1].startswith(repo.sha[:12]) and "(main)" in cells[1]
    assert cells[4] == "local (this machine)" and cells[2].endswith("B")

    # Into the runner, and Load with the network off.
    runner.model.setCurrentText("builtin:demo")  # as if another model were there
    click(qtbot, row.runner_button)
    assert window.tabs.currentWidget() is runner
    assert runner.model.currentText() == "org/tiny-llama"
    gets = fake_hub.file_gets()
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    # The download was the agent's job, so the agent (the runner's worker is its child) runs already,
    # with the environment it started with: it is started again, as one would after going offline.
    agent = window.services.ensure_agent()
    before = agent.agent.get("pid")
    assert before, "the download did not go through the agent"
    agent.request("shutdown", None, force=True)
    qtbot.waitUntil(lambda: agent.agent.get("pid") not in (None, before), timeout=60000)
    with qtbot.waitSignal(runner.client.model_loaded, timeout=120_000):
        click(qtbot, runner.load_button)
    qtbot.waitUntil(lambda: "Loaded" in runner.model_status.text(), timeout=10000)
    assert fake_hub.file_gets() == gets

    # And into the Training form, on the place where it is cached.
    window.tabs.setCurrentWidget(tab)
    qtbot.waitUntil(row.training_button.isVisible, timeout=5000)
    click(qtbot, row.training_button)
    training = window.training_tab
    assert window.tabs.currentWidget() is training
    assert training.form.model.currentText() == "org/tiny-llama"
    assert training.placement.host_combo.currentData() == "local"

    # The library's own buttons: Refresh lists it again; its row, selected, goes to either tab.
    window.tabs.setCurrentWidget(tab)
    click(qtbot, tab.refresh_button)
    qtbot.waitUntil(lambda: not tab.is_listing() and tab.table.rowCount() == 1, timeout=30000)
    select_row(qtbot, tab, 0)
    runner.model.setCurrentText("builtin:demo")
    training.form.model.setCurrentText("builtin:demo")
    click(qtbot, tab.use_runner_button)
    assert window.tabs.currentWidget() is runner and runner.model.currentText() == "org/tiny-llama"
    window.tabs.setCurrentWidget(tab)
    click(qtbot, tab.use_training_button)
    assert window.tabs.currentWidget() is training
    assert training.form.model.currentText() == "org/tiny-llama"


def test_a_stall_is_said_and_retried_then_cancel_and_a_gated_repo(qtbot, tab: ModelsTab,
                                                                    fake_hub: FakeHub) -> None:
    started = time.time()
    repo = FakeRepo(files={"config.json": b'{"a": 1}', "model.safetensors": os.urandom(2_000_000)})
    fake_hub.repos["org/stall"] = repo
    fake_hub.stall("org/stall", "model.safetensors", times=1)
    download_by_clicks(qtbot, tab, "org/stall", stall_s="1")
    row = tab.download_rows[0]
    qtbot.waitUntil(lambda: row.job.ok is not None, timeout=50000)
    assert row.job.ok, row.status.text()
    notes = row.notes.text()
    assert "stalled: no byte arrived for" in notes and "retrying in" in notes
    assert "attempt 2 of 4" in notes
    assert row.status.text().startswith("Done.")
    # Ended: what held while it ran is told in the past.
    assert "goes on if the window closes" not in notes
    assert any(n.startswith("ran as a job of its own") for n in row.job.notes), row.job.notes

    # The library lists it; Delete… asks with the space it frees, and frees it.
    qtbot.waitUntil(lambda: tab.table.rowCount() == 1 and not tab.is_listing(), timeout=30000)
    assert "local (this machine): 1 revision, 2.0 MB; " in tab.status.text() and " free" in tab.status.text()
    select_row(qtbot, tab, 0)
    answer = answer_dialog(qtbot, "Delete")
    click(qtbot, tab.delete_button)
    assert answer.clicked and "org/stall @" in answer.text and "This frees 2.0 MB" in answer.text
    qtbot.waitUntil(lambda: tab.table.rowCount() == 0 and "freed 2.0 MB" in tab.status.text(),
                    timeout=30000)
    assert not list((Path(os.environ["HF_HOME"]) / "hub").glob("models--org--stall/snapshots/*"))

    # A download that stalls on every attempt, cancelled by its button: no process is left.
    fake_hub.repos["org/stuck"] = FakeRepo(files={"model.safetensors": os.urandom(1_000_000)})
    fake_hub.stall("org/stuck", "model.safetensors", times=10)
    fake_hub.stalled.clear()
    download_by_clicks(qtbot, tab, "org/stuck", stall_s="30")
    stuck = tab.download_rows[0]
    qtbot.waitUntil(fake_hub.stalled.is_set, timeout=30000)
    assert tab.places.active_jobs() and "org/stuck" in tab.places.active_jobs()[0]
    # The agent runs it: the window has no child process (no download, no `runs follow`, no ssh).
    assert window_children(started) == []
    qtbot.waitUntil(lambda: bool(stuck.job.folder), timeout=10000)
    click(qtbot, stuck.cancel_button)
    qtbot.waitUntil(lambda: stuck.job.ok is not None, timeout=20000)
    # Cancel was the agent's job.stop: the job's own record says it was stopped.
    assert Run(Path(stuck.job.folder)).status().state == "stopped"
    assert window_children(started) == []
    # Said once ("Cancelled. cancelled: …" before), and no longer "it goes on if the window closes".
    assert stuck.status.text() == ("Cancelled. Finished files stay in the cache; downloading again "
                                   "continues with the rest.")
    assert "goes on if the window closes" not in stuck.notes.text()
    assert "ran as a job of its own" in stuck.notes.text()
    assert not tab.places.active_jobs()
    # (This test's processes only: another checkout's suite may be running the same test beside it.)
    home = os.environ["GAUDI_GUI_HOME"]
    commands = [p.info["cmdline"] for p in psutil.process_iter(["cmdline", "environ"])
                if "org/stuck" in " ".join(p.info["cmdline"] or [])
                and (p.info["environ"] or {}).get("GAUDI_GUI_HOME") == home]
    assert not commands, commands

    # A gated repo: the message says what to do, and the typed token is nowhere to be read.
    fake_hub.repos["org/gated"] = FakeRepo(files={"config.json": b"{}"}, gated=True)
    download_by_clicks(qtbot, tab, "org/gated", token=SECRET)
    gated = tab.download_rows[0]
    # Not on the command line of what runs (the download and its attempt's child), while it runs.
    argvs = command_lines_while(qtbot, "org/gated", lambda: gated.job.ok is not None)
    assert not any(SECRET in a for a in argvs)
    # The agent's job (no child of the window): the token went in job.start's env, not its words.
    assert SECRET not in " ".join(gated.job.request.words())
    qtbot.waitUntil(lambda: gated.job.ok is not None, timeout=30000)
    assert not gated.job.ok
    text = gated.status.text()
    assert text.startswith("Failed.") and "gated" in text and "hf auth login" in text
    assert f"Bearer {SECRET}" in fake_hub.authorizations  # the token was used by the download
    assert SECRET not in text + gated.notes.text()
    # A download with a typed token is a job of the agent too (before: a child of the window).
    assert any(n.startswith("ran as a job of its own") for n in gated.job.notes), gated.job.notes
    for folder in (Path(os.environ["GAUDI_GUI_HOME"]), Path(os.environ["HF_HOME"])):
        for path in (p for p in folder.rglob("*") if p.is_file()):
            assert SECRET.encode() not in path.read_bytes(), path


def test_a_download_that_failed_midway_is_listed_incomplete(qtbot, tab: ModelsTab, fake_hub: FakeHub) -> None:
    """Its weights answer 404: the row fails naming the file at once, and the library lists the
    revision (config and tokenizer arrived) marked incomplete, saying which file never arrived."""
    fake_hub.repos["org/half"] = FakeRepo(files={"config.json": b'{"a": 1}', "tokenizer.json": b"{}",
                                                 "model.safetensors": os.urandom(500_000)})
    fake_hub.fail("org/half", "model.safetensors", 404, head=False)
    download_by_clicks(qtbot, tab, "org/half")
    row = tab.download_rows[0]
    qtbot.waitUntil(lambda: row.job.ok is not None, timeout=60000)
    assert not row.job.ok and "model.safetensors of org/half was not found (404)" in row.status.text()
    click(qtbot, tab.refresh_button)
    qtbot.waitUntil(lambda: not tab.is_listing() and tab.table.rowCount() == 1, timeout=30000)
    assert cell(tab, 0, 0) == "org/half ⚠ incomplete"
    item = tab.table.item(0, 0)
    assert item is not None and "model.safetensors never arrived" in item.toolTip()
    assert "local (this machine): 1 revision (1 incomplete), " in tab.status.text()
    # A model field naming it says so (not "cached: no network needed") and offers Download….
    from PySide6.QtWidgets import QLineEdit

    from gaudi_gui.core.remote import Host
    from gaudi_gui.ui.model_field import ModelCacheState

    field = QLineEdit()
    state = ModelCacheState(field, tab.places, Host.local)
    qtbot.addWidget(field)
    qtbot.addWidget(state)
    field.show()
    state.show()
    qtbot.keyClicks(field, "org/half")
    qtbot.waitUntil(lambda: "incomplete" in state.label.text(), timeout=10000)
    assert "model.safetensors never arrived" in state.label.text() and state.button.isEnabled()


def test_a_download_is_a_job_left_running_at_close_and_followed_again_by_the_next_window(
        qtbot, fake_hub: FakeHub) -> None:
    fake_hub.repos["org/long"] = FakeRepo(files={"model.safetensors": os.urandom(800_000)})
    fake_hub.stall("org/long", "model.safetensors", times=10)
    first = MainWindow(create_services())
    qtbot.addWidget(first, before_close_func=lambda w: close_window(qtbot, w))
    first.show()
    tab = first.models_tab
    first.tabs.setCurrentWidget(tab)
    download_by_clicks(qtbot, tab, "org/long", stall_s="120")
    job = tab.download_rows[0].job
    qtbot.waitUntil(lambda: bool(job.folder) and fake_hub.stalled.is_set(), timeout=30000)
    assert "a job of its own" in tab.download_rows[0].notes.text()
    run = Run(job.folder)
    assert run.kind == "download"

    # The close dialog names it and offers to leave it running; it goes on without the window.
    answer = answer_dialog(qtbot, "Leave running and quit")
    first.close()
    qtbot.waitUntil(lambda: not first.isVisible(), timeout=30000)
    assert answer.clicked and "Download org/long" in answer.text
    assert run.supervisor() is not None and run.status().state == "running"

    second = MainWindow(create_services())
    qtbot.addWidget(second, before_close_func=lambda w: close_window(qtbot, w))
    second.show()
    tab2 = second.models_tab
    second.tabs.setCurrentWidget(tab2)
    qtbot.waitUntil(lambda: len(tab2.download_rows) == 1, timeout=30000)
    row = tab2.download_rows[0]
    assert row.job.folder == job.folder
    # The agent's jobs name the run; the model's id comes with its plan, replayed at once.
    qtbot.waitUntil(lambda: "org/long" in row.title.text(), timeout=10000)
    qtbot.waitUntil(lambda: "followed again" in row.notes.text() and "1 file, " in row.notes.text(),
                    timeout=30000)
    qtbot.waitUntil(row.cancel_button.isVisible, timeout=5000)
    click(qtbot, row.cancel_button)
    qtbot.waitUntil(lambda: row.job.ok is not None, timeout=30000)
    assert row.status.text().startswith("Cancelled.")
    assert run.status().state == "stopped"


def test_queue_in_the_download_dialog(qtbot, tab: ModelsTab, fake_hub: FakeHub) -> None:
    """Issue 29: the Download dialog's Queue, clicked: the download goes into this machine's queue and
    its agent runs it (no window needed); a typed token is refused for a queued job (it would
    wait in the queue's files), said in the dialog."""
    from gaudi_gui.core import queue

    fake_hub.repos["org/queued"] = FakeRepo(files={"config.json": b'{"a": 1}',
                                                   "model.safetensors": b"q" * 4096})
    click(qtbot, tab.download_button)
    qtbot.waitUntil(lambda: isinstance(QApplication.activeModalWidget(), DownloadDialog), timeout=5000)
    dialog = QApplication.activeModalWidget()
    assert isinstance(dialog, DownloadDialog) and dialog.queue_button.isVisible()
    qtbot.keyClicks(dialog.repo_id, "org/queued")
    qtbot.keyClicks(dialog.token, SECRET)
    click(qtbot, dialog.queue_button)
    assert "cannot be queued" in dialog.problem.text() and dialog.isVisible()
    dialog.token.selectAll()
    qtbot.keyClick(dialog.token, Qt.Key.Key_Delete)
    click(qtbot, dialog.queue_button)
    qtbot.waitUntil(lambda: not dialog.isVisible(), timeout=5000)
    assert tab.status.text() == "org/queued: queued on this machine (View → Queue)"

    def ended() -> queue.Entry | None:
        state = queue.read_state() if queue.state_path().exists() else None
        done = [e for e in (state.entries if state else []) if e.state == "ended"]
        return done[0] if done else None

    qtbot.waitUntil(lambda: ended() is not None, timeout=120000)
    entry = ended()
    assert entry is not None and (entry.kind, entry.outcome) == ("download", "finished"), entry
    assert fake_hub.file_gets() == 2
    for folder in (Path(os.environ["GAUDI_GUI_HOME"]), Path(os.environ["HF_HOME"])):
        for path in (p for p in folder.rglob("*") if p.is_file()):
            assert SECRET.encode() not in path.read_bytes(), path

"""The Models tab with a host (issue 28) against the real SSH test server: a model downloaded by clicks
into the host's own Hub cache (not this machine's), checked, listed there by the host's agent
(``models.list``) and deleted there (``models.delete``), the window starting no process for either;
a host that cannot be reached said in words; and a download whose connection is cut mid-file: it is
a job on the host and goes on, the window says so, follows it again, and Cancel ends it there (nothing
left running); one left running is followed again by the next window at its start (its close dialog
names it) before the Models tab is ever opened.
The fake Hub is on 127.0.0.1 (HF_ENDPOINT, which the host's commands inherit from the test server)."""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QApplication

from gaudi_gui.app import create_services
from gaudi_gui.core import remote
from gaudi_gui.core.remote import Host
from gaudi_gui.ui.download_dialog import DownloadDialog
from gaudi_gui.ui.main_window import MainWindow
from gaudi_gui.ui.models_tab import ModelsTab
from tests.fake_hub import FakeHub, FakeRepo
from tests.helpers import answer_dialog, choose, choose_runner_host, click, close_window, models_tab
from tests.remote.conftest import SshHost


@pytest.fixture
def host(fake_hub: FakeHub, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         request: pytest.FixtureRequest) -> Iterator[tuple[SshHost, Path]]:
    """The SSH host, started with a Hub cache of its own (HF_HOME), and this side's kept."""
    local = os.environ["HF_HOME"]
    remote_hf = tmp_path / "remote-hf"
    monkeypatch.setenv("HF_HOME", str(remote_hf))
    ssh_host: SshHost = request.getfixturevalue("ssh_host")
    monkeypatch.setenv("HF_HOME", local)
    remote.save_hosts([Host.parse(ssh_host.dest)])
    yield ssh_host, remote_hf


@pytest.fixture
def tab(qtbot, host: tuple[SshHost, Path]) -> Iterator[ModelsTab]:
    yield from models_tab(qtbot)


def cache_model(hub_dir: Path, repo_id: str, data: bytes) -> str:
    """A revision of ``repo_id`` in the Hub cache ``hub_dir`` as huggingface_hub writes it (a blob, a
    snapshot linking to it, the ``main`` ref); its commit."""
    repo = hub_dir / ("models--" + repo_id.replace("/", "--"))
    commit = hashlib.sha1(repo_id.encode()).hexdigest()
    blob = hashlib.sha256(data).hexdigest()
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / blob).write_bytes(data)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    (repo / "snapshots" / commit).mkdir(parents=True)
    (repo / "snapshots" / commit / "model.safetensors").symlink_to(f"../../blobs/{blob}")
    return commit


def cell(tab: ModelsTab, row: int, column: int) -> str:
    item = tab.table.item(row, column)
    assert item is not None
    return item.text()




def test_listing_and_deleting_here_and_on_a_host_start_no_process_in_the_window(
        qtbot, host: tuple[SshHost, Path]) -> None:
    """Issue 38, a thin window: the Models tab lists this machine's and the host's caches and deletes a
    model in each by clicks, and the window has no child process at any moment (the agents list and
    delete; the host's is reached through this machine's agent's one ssh session)."""
    ssh_host, remote_hf = host
    cache_model(Path(os.environ["HF_HOME"]) / "hub", "org/here", b"h" * 300_000)
    cache_model(remote_hf / "hub", "org/there", b"t" * 500_000)
    seen: list[str] = []

    def children_while(done: bool) -> bool:
        seen.extend(ssh_host.window_children())
        return done

    tabs = models_tab(qtbot)
    tab = next(tabs)
    try:
        seen.extend(ssh_host.window_children())  # the listings asked when the tab was first shown
        qtbot.waitUntil(lambda: children_while(tab.table.rowCount() == 2 and not tab.is_listing()),
                        timeout=60000)
        assert {cell(tab, r, 0): cell(tab, r, 4) for r in range(2)} == {
            "org/there": ssh_host.dest, "org/here": "local (this machine)"}
        assert "local (this machine): 1 revision, 300.0 KB" in tab.status.text(), tab.status.text()
        assert f"{ssh_host.dest}: 1 revision, 500.0 KB" in tab.status.text(), tab.status.text()

        click(qtbot, tab.refresh_button)
        seen.extend(ssh_host.window_children())
        qtbot.waitUntil(lambda: children_while(tab.table.rowCount() == 2 and not tab.is_listing()),
                        timeout=60000)

        for repo_id, where, cache in (("org/there", ssh_host.dest, remote_hf),
                                      ("org/here", "local (this machine)", Path(os.environ["HF_HOME"]))):
            row = next(r for r in range(tab.table.rowCount()) if cell(tab, r, 0) == repo_id)
            item = tab.table.item(row, 0)
            assert item is not None
            qtbot.mouseClick(tab.table.viewport(), Qt.MouseButton.LeftButton,
                             pos=tab.table.visualItemRect(item).center())
            qtbot.waitUntil(lambda repo_id=repo_id: (tab.selected() or {}).get("repo_id") == repo_id,
                            timeout=5000)
            answer = answer_dialog(qtbot, "Delete")
            click(qtbot, tab.delete_button)
            seen.extend(ssh_host.window_children())
            assert answer.clicked and f"cache of {where}?" in answer.text, answer.text
            qtbot.waitUntil(lambda repo_id=repo_id: children_while(
                f"deleted {repo_id}, freed" in tab.status.text() and not tab.is_listing()), timeout=60000)
            assert repo_id not in [cell(tab, r, 0) for r in range(tab.table.rowCount())]
            assert not list((cache / "hub").glob(f"models--{repo_id.replace('/', '--')}/snapshots/*"))
        assert tab.table.rowCount() == 0
        assert sorted(set(seen)) == []  # the window started no process: no `gaudi-gui models`, no ssh
    finally:
        for _ in tabs:
            pass


def test_a_host_that_cannot_be_reached_is_said_in_words_and_the_others_are_listed(
        qtbot, host: tuple[SshHost, Path]) -> None:
    """A saved host whose key is refused: its line says why, in words, while this machine and the
    reachable host are listed; the window's event loop keeps turning and it starts no process."""
    ssh_host, remote_hf = host
    remote.save_hosts([Host.parse(ssh_host.dest), Host.parse("gg-nokey")])
    cache_model(remote_hf / "hub", "org/there", b"t" * 2000)
    gaps: list[float] = []
    last = [time.monotonic()]

    def tick() -> None:
        now = time.monotonic()
        gaps.append(now - last[0])
        last[0] = now

    tabs = models_tab(qtbot)
    tab = next(tabs)
    timer = QTimer()
    timer.timeout.connect(tick)
    last[0] = time.monotonic()
    timer.start(20)
    try:
        qtbot.waitUntil(lambda: "gg-nokey: " in tab.status.text(), timeout=5000)
        qtbot.waitUntil(lambda: not tab.is_listing(), timeout=60000)
        lines = tab.status.text().splitlines()
        nokey = next(line for line in lines if line.startswith("gg-nokey: "))
        assert "ssh-copy-id gg-nokey" in nokey, lines
        assert any(line.startswith(f"{ssh_host.dest}: 1 revision") for line in lines), lines
        assert any(line.startswith("local (this machine): 0 revisions") for line in lines), lines
        assert [cell(tab, r, 0) for r in range(tab.table.rowCount())] == ["org/there"]
        assert ssh_host.window_children() == []
        timer.stop()
        assert max(gaps) < 1.0, max(gaps)  # the window never waited on a host (a loaded CI: 1 s)
    finally:
        timer.stop()
        for _ in tabs:
            pass


def download_to(qtbot, tab: ModelsTab, repo_id: str, dest: str, stall_s: str = "") -> None:
    click(qtbot, tab.download_button)
    qtbot.waitUntil(lambda: isinstance(QApplication.activeModalWidget(), DownloadDialog), timeout=5000)
    dialog = QApplication.activeModalWidget()
    assert isinstance(dialog, DownloadDialog)
    qtbot.keyClicks(dialog.repo_id, repo_id)
    choose(qtbot, dialog.where, dest)
    # No token field for a host: the host's own login is used, nothing secret crosses the link.
    assert not dialog.token.isEnabled() and "own login" in dialog.token.placeholderText()
    if stall_s:
        qtbot.mouseClick(dialog.stall.lineEdit(), Qt.MouseButton.LeftButton)
        qtbot.keyClick(dialog.stall, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
        qtbot.keyClicks(dialog.stall, stall_s)
    count = len(tab.download_rows)
    click(qtbot, dialog.download_button)
    qtbot.waitUntil(lambda: len(tab.download_rows) == count + 1, timeout=5000)
    qtbot.waitUntil(tab.download_rows[0].isVisible, timeout=5000)


def test_download_to_a_host_lands_in_its_cache_and_a_cut_link_ends_it_there(
        qtbot, tab: ModelsTab, fake_hub: FakeHub, host: tuple[SshHost, Path]) -> None:
    ssh_host, remote_hf = host
    qtbot.waitUntil(lambda: not tab.is_listing(), timeout=30000)
    assert f"{ssh_host.dest}: 0 revisions" in tab.status.text(), tab.status.text()

    repo = FakeRepo(files={"config.json": b'{"a": 1}', "model.safetensors": os.urandom(1_500_000)})
    fake_hub.repos["org/on-host"] = repo
    download_to(qtbot, tab, "org/on-host", ssh_host.dest)
    row = tab.download_rows[0]
    qtbot.waitUntil(lambda: row.job.ok is not None, timeout=60000)
    assert row.job.ok, row.status.text()
    assert row.job.path.startswith(str(remote_hf)), row.job.path
    assert "checked 2 files" in row.notes.text()
    assert (remote_hf / "hub" / "models--org--on-host").is_dir()
    assert not (Path(os.environ["HF_HOME"]) / "hub" / "models--org--on-host").exists()
    qtbot.waitUntil(lambda: tab.table.rowCount() == 1 and not tab.is_listing(), timeout=30000)
    assert cell(tab, 0, 0) == "org/on-host" and cell(tab, 0, 4) == ssh_host.dest
    # The host's agent ran it (it and the link's relay stay); nothing of the download is left.
    assert ssh_host.wait_no_processes(but_agent=True) == []

    # Deleted there, after a question that names the host and the space.
    item = tab.table.item(0, 0)
    assert item is not None
    qtbot.mouseClick(tab.table.viewport(), Qt.MouseButton.LeftButton,
                     pos=tab.table.visualItemRect(item).center())
    qtbot.waitUntil(lambda: tab.selected() is not None, timeout=5000)
    answer = answer_dialog(qtbot, "Delete")
    click(qtbot, tab.delete_button)
    assert answer.clicked and f"cache of {ssh_host.dest}?" in answer.text
    assert "This frees 1.5 MB" in answer.text
    qtbot.waitUntil(lambda: tab.table.rowCount() == 0 and "freed 1.5 MB" in tab.status.text(), timeout=30000)
    assert not list((remote_hf / "hub").glob("models--org--on-host/snapshots/*"))

    # The link is cut while a file is half sent: the download is a job on the host and goes on; the
    # window says so, connects again and follows it; Cancel then ends it there.
    fake_hub.repos["org/cut"] = FakeRepo(files={"model.safetensors": os.urandom(1_000_000)})
    fake_hub.stall("org/cut", "model.safetensors", times=10)
    fake_hub.stalled.clear()
    download_to(qtbot, tab, "org/cut", ssh_host.dest, stall_s="120")
    cut = tab.download_rows[0]
    qtbot.waitUntil(lambda: bool(cut.job.folder) and fake_hub.stalled.is_set(), timeout=30000)
    assert cut.job.folder.startswith(str(ssh_host.runs_dir))
    assert "or the connection drops" in cut.notes.text()
    # The host's agent runs it, reached through this machine's agent: the window runs no ssh of its own.
    assert ssh_host.window_children() == []
    ssh_host.drop()
    qtbot.waitUntil(lambda: f"the connection to {ssh_host.dest} dropped" in cut.notes.text(), timeout=30000)
    assert any(" download org/cut" in line for line in ssh_host.command_lines())  # it goes on there
    qtbot.waitUntil(lambda: "connected again" in cut.notes.text(), timeout=30000)
    assert cut.job.is_running() and cut.job.ok is None
    click(qtbot, cut.cancel_button)
    qtbot.waitUntil(lambda: cut.job.ok is not None, timeout=30000)
    assert cut.status.text().startswith("Cancelled."), cut.status.text()
    assert ssh_host.wait_no_processes(but_agent=True) == []

    # Left running on the host when the window goes (what "Leave running and quit" does), and
    # followed again by the next window's Models tab when it is first looked at.
    fake_hub.repos["org/again"] = FakeRepo(files={"model.safetensors": os.urandom(700_000)})
    fake_hub.stall("org/again", "model.safetensors", times=10)
    fake_hub.stalled.clear()
    download_to(qtbot, tab, "org/again", ssh_host.dest, stall_s="120")
    first = tab.download_rows[0].job
    qtbot.waitUntil(lambda: bool(first.folder) and fake_hub.stalled.is_set(), timeout=30000)
    assert tab.places.detach_jobs() == [first.folder]
    assert not tab.places.active_jobs()
    assert any(" download org/again" in line for line in ssh_host.command_lines())

    # The next window follows it again at its start, before the Models tab is ever looked at: the
    # close dialog names it; the Models tab, opened later, shows its row, and Cancel ends it there.
    later = MainWindow(create_services())
    qtbot.addWidget(later, before_close_func=lambda w: close_window(qtbot, w))
    later.resize(1280, 800)
    later.show()
    later.tabs.setCurrentIndex(0)
    places = later.services.ensure_models()
    qtbot.waitUntil(lambda: any("org/again" in j for j in later.active_jobs()), timeout=30000)
    assert not later.models_tab._listed_once  # the Models tab was never looked at
    job = next(d for d in places.running() if d.host.name == ssh_host.dest)
    assert job.folder == first.folder
    answer = answer_dialog(qtbot, "Cancel")
    later.close()
    qtbot.waitUntil(lambda: answer.clicked, timeout=10000)
    assert f"Download org/again → {ssh_host.dest}" in answer.text, answer.text
    assert later.isVisible() and job.is_running()  # Cancel: nothing closed, nothing stopped
    models = later.models_tab
    later.tabs.setCurrentWidget(models)
    qtbot.waitUntil(lambda: len(models.download_rows) == 1, timeout=10000)
    again = models.download_rows[0]
    assert again.job is job
    qtbot.waitUntil(lambda: "org/again" in again.title.text() and "followed again" in again.notes.text(),
                    timeout=30000)
    qtbot.waitUntil(again.cancel_button.isVisible, timeout=5000)
    click(qtbot, again.cancel_button)
    qtbot.waitUntil(lambda: again.job.ok is not None, timeout=30000)
    assert again.status.text().startswith("Cancelled."), again.status.text()
    # (The whole window watches the host's cards meanwhile, and the host's agent and the link's relay
    # stay: only the download must be gone: its command, its attempt, its supervisor. Not "download"
    # alone: a checkout's path may hold the word, as the test's hl-smi's does in a worktree so named.)
    left = ["?"]
    for _ in range(60):
        left = [p for p in ssh_host.wait_no_processes(0.5, but_agent=True)
                if " download " in p or "org/again" in p or "download-again" in p or "runs follow" in p]
        if not left:
            break
        qtbot.wait(500)
    assert not left, left
    qtbot.waitUntil(lambda: not models.is_listing() and not places.is_reattaching(), timeout=30000)


def test_the_runner_field_reads_the_hosts_cache_and_downloads_there(
        qtbot, fake_hub: FakeHub, host: tuple[SshHost, Path]) -> None:
    """The runner's model field with a host chosen: the line reads that host's cache (over ssh, in
    the background: "checking…" first), Download… beside it downloads there, and then it says cached
    on that host (not on this machine)."""
    ssh_host, remote_hf = host
    fake_hub.repos["org/for-host"] = FakeRepo(files={"config.json": b'{"a": 1}',
                                                     "model.safetensors": os.urandom(200_000)})
    window = MainWindow(create_services())
    qtbot.addWidget(window, before_close_func=lambda w: close_window(qtbot, w))
    window.resize(1280, 800)
    window.show()
    runner = window.runner_tab
    window.tabs.setCurrentWidget(runner)
    choose_runner_host(qtbot, runner, ssh_host.dest)
    edit = runner.model.lineEdit()
    qtbot.mouseClick(edit, Qt.MouseButton.LeftButton)
    qtbot.keyClick(edit, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClicks(edit, "org/for-host")
    state = runner.model_cache
    # The GUI goes on while the host is asked: the line says so, then what the host holds.
    qtbot.waitUntil(lambda: f"{ssh_host.dest}'s" in state.label.text(), timeout=5000)
    qtbot.waitUntil(lambda: f"not in {ssh_host.dest}'s cache" in state.label.text(), timeout=30000)
    click(qtbot, runner.download_button)
    qtbot.waitUntil(lambda: isinstance(QApplication.activeModalWidget(), DownloadDialog), timeout=5000)
    dialog = QApplication.activeModalWidget()
    assert isinstance(dialog, DownloadDialog)
    assert dialog.repo_id.text() == "org/for-host" and dialog.where.currentData() == ssh_host.dest
    assert not dialog.use_keyring.isEnabled()  # a host's download uses the host's own login
    click(qtbot, dialog.download_button)
    models = window.models_tab
    qtbot.waitUntil(lambda: len(models.download_rows) == 1, timeout=5000)
    row = models.download_rows[0]
    qtbot.waitUntil(lambda: row.job.ok is not None, timeout=60000)
    assert row.job.ok, row.status.text()
    qtbot.waitUntil(lambda: f"cached on {ssh_host.dest}, " in state.label.text(), timeout=30000)
    assert not runner.download_button.isEnabled()
    assert (remote_hf / "hub" / "models--org--for-host").is_dir()
    assert not (Path(os.environ["HF_HOME"]) / "hub" / "models--org--for-host").exists()
    qtbot.waitUntil(lambda: not window.services.ensure_models().is_checking_cache()
                    and not models.is_listing(), timeout=30000)

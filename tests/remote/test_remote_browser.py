"""The Model runner's "Browse HOST" dialog against a real SSH server: the host's folders listed by the
host's own ``gaudi-gui ls --json`` over ssh, walked by a person's double-clicks and keys into a folder
whose name would run code in a shell, the chosen host path in the model field, the host's Hugging Face
cache offered as Hub ids, an unknown folder and an ssh failure said in the dialog; and ``gaudi-gui ls``
itself (its JSON, a missing folder, the Hub cache, --host)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QListWidget, QListWidgetItem

from gaudi_gui.app import create_services
from gaudi_gui.core import remote
from gaudi_gui.core.remote import Host
from gaudi_gui.ui import remote_browser
from gaudi_gui.ui.remote_browser import RemoteBrowser
from gaudi_gui.ui.runner_tab import RunnerTab
from tests.helpers import choose_runner_host, click
from tests.remote.conftest import SshHost

EVIL_FOLDER = "my models $(touch X)"
LIST_TIMEOUT_MS = 30_000


@pytest.fixture
def tab(qtbot, ssh_host: SshHost) -> Iterator[RunnerTab]:
    remote.save_hosts([Host.parse(ssh_host.dest), Host.parse("gg-nokey")])
    # Each test builds its own services: no folder remembered from another test.
    widget = RunnerTab(create_services())
    qtbot.addWidget(widget)
    widget.show()
    qtbot.waitExposed(widget)
    widget.activateWindow()
    yield widget
    widget.shutdown()


def open_browser(qtbot, tab: RunnerTab) -> RemoteBrowser:
    """Click Browse… and wait for the dialog's first answer."""
    click(qtbot, tab.browse_button)
    dialog = tab.remote_browser
    assert dialog is not None and dialog.isVisible()
    assert dialog.windowTitle() == f"Browse {tab.client.host.name}"
    # While the listing runs the dialog says so and Choose waits.
    assert dialog.status.text() == "loading…" and not dialog.choose_button.isEnabled()
    qtbot.waitUntil(dialog.choose_button.isEnabled, timeout=LIST_TIMEOUT_MS)
    return dialog


def entry(view: QListWidget, name: str) -> QListWidgetItem:
    for row in range(view.count()):
        item = view.item(row)
        if item.text() == name or item.text().split("/")[0] == name or item.text().split()[0] == name:
            return item
    raise AssertionError(f"{name!r} is not listed: {[view.item(r).text() for r in range(view.count())]}")


def item_center(view: QListWidget, item: QListWidgetItem):
    view.scrollToItem(item)
    return view.visualItemRect(item).center()


def double_click(qtbot, view: QListWidget, item: QListWidgetItem) -> None:
    # A person's double-click is press, release, then a second press that arrives as a double-click;
    # QTest's mouseDClick sends only that last event (Qt 6), which an item view takes as a first press.
    pos = item_center(view, item)
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=pos)
    qtbot.mouseDClick(view.viewport(), Qt.MouseButton.LeftButton, pos=pos)


def single_click(qtbot, view: QListWidget, item: QListWidgetItem) -> None:
    qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, pos=item_center(view, item))
    assert view.currentItem() is item and item.isSelected()


def shows(qtbot, dialog: RemoteBrowser, folder: Path | str) -> None:
    qtbot.waitUntil(lambda: dialog.choose_button.isEnabled() and dialog.folder == str(folder),
                    timeout=LIST_TIMEOUT_MS)
    assert dialog.path.text() == str(folder)


def type_path(qtbot, dialog: RemoteBrowser, path: str) -> None:
    dialog.path.clear()
    qtbot.keyClicks(dialog.path, path)
    qtbot.keyClick(dialog.path, Qt.Key.Key_Return)


def test_browse_a_host_into_a_hostile_folder_name_and_choose_it(
        qtbot, tab: RunnerTab, ssh_host: SshHost, tmp_path: Path) -> None:
    parent = ssh_host.home / EVIL_FOLDER
    model = parent / "tiny model"
    model.mkdir(parents=True)
    (model / "config.json").write_text("{}")
    (parent / "plain").mkdir()
    (parent / "notes.txt").write_text("hello")
    canaries = [d / "X" for d in (ssh_host.home, parent, model, Path.cwd(), Path.home(), tmp_path)]
    assert not any(c.exists() for c in canaries)
    # The host's Hub cache (the server's HF_HOME is this test's), as huggingface_hub writes it: a
    # blob, a snapshot linking to it, the ref.
    repo = Path(os.environ["HF_HOME"]) / "hub" / "models--tiny-org--tiny-llm"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc").write_bytes(b"0" * 2048)
    (repo / "snapshots" / "rev1").mkdir(parents=True)
    (repo / "snapshots" / "rev1" / "config.json").symlink_to("../../blobs/abc")
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text("rev1")

    choose_runner_host(qtbot, tab, ssh_host.dest)
    assert tab.browse_button.isEnabled()
    dialog = open_browser(qtbot, tab)
    assert dialog.folder, dialog.status.text()  # the host's home (its user's), listed over ssh

    # Type the folder, press Enter; double-click the hostile name; select the model folder and Enter.
    type_path(qtbot, dialog, str(ssh_host.home))
    shows(qtbot, dialog, ssh_host.home)
    evil = entry(dialog.entries, EVIL_FOLDER)
    assert remote_browser.MODEL_MARK not in evil.text()
    double_click(qtbot, dialog.entries, evil)
    shows(qtbot, dialog, parent)
    assert dialog.entries.item(0).text() == ".."
    names = [dialog.entries.item(r).text() for r in range(dialog.entries.count())]
    # Folders first (the model folder marked), then files.
    assert names[1:3] == ["plain/", "tiny model/" + remote_browser.MODEL_MARK], names
    assert names[3].startswith("notes.txt")
    single_click(qtbot, dialog.entries, entry(dialog.entries, "tiny model"))
    qtbot.keyClick(dialog.entries, Qt.Key.Key_Return)
    shows(qtbot, dialog, model)
    assert "model folder" in dialog.status.text()
    assert entry(dialog.entries, "config.json")

    # ".." goes up; Choose takes the selected folder.
    double_click(qtbot, dialog.entries, entry(dialog.entries, ".."))
    shows(qtbot, dialog, parent)
    single_click(qtbot, dialog.entries, entry(dialog.entries, "tiny model"))
    click(qtbot, dialog.choose_button)
    qtbot.waitUntil(lambda: tab.remote_browser is None, timeout=5000)
    assert tab.model.currentText() == str(model)

    # Again: it opens where it was last (the model folder's parent); Cancel keeps the field.
    dialog = open_browser(qtbot, tab)
    assert dialog.folder == str(parent)
    click(qtbot, dialog.cancel_button)
    qtbot.waitUntil(lambda: tab.remote_browser is None, timeout=5000)
    assert tab.model.currentText() == str(model)

    # With nothing selected, Choose takes the folder shown (here: typed, then listed).
    dialog = open_browser(qtbot, tab)
    type_path(qtbot, dialog, str(model))
    shows(qtbot, dialog, model)
    click(qtbot, dialog.choose_button)
    qtbot.waitUntil(lambda: tab.remote_browser is None, timeout=5000)
    assert tab.model.currentText() == str(model)

    # The Hugging Face cache tab: the host's cached models as Hub ids.
    dialog = open_browser(qtbot, tab)
    bar = dialog.tabs.tabBar()
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(1).center())
    assert dialog.tabs.currentWidget() is dialog.hub_models
    qtbot.waitUntil(lambda: dialog.choose_button.isEnabled() and dialog.hub_models.count() > 0,
                    timeout=LIST_TIMEOUT_MS)
    hub = entry(dialog.hub_models, "tiny-org/tiny-llm")
    assert "2.0 KiB" in hub.text()
    single_click(qtbot, dialog.hub_models, hub)
    click(qtbot, dialog.choose_button)
    qtbot.waitUntil(lambda: tab.remote_browser is None, timeout=5000)
    assert tab.model.currentText() == "tiny-org/tiny-llm"

    assert not any(c.exists() for c in canaries), [str(c) for c in canaries if c.exists()]
    assert ssh_host.wait_no_processes(but_agent=True) == []  # the host's agent answered


def test_an_ssh_failure_and_an_unknown_folder_are_said_in_the_dialog(
        qtbot, tab: RunnerTab, ssh_host: SshHost) -> None:
    # First, before any connection to the server exists (ssh would share it: same address, port, user).
    choose_runner_host(qtbot, tab, "gg-nokey")  # a host whose server does not accept our key
    before = tab.model.currentText()
    dialog = open_browser(qtbot, tab)
    assert "ssh-copy-id gg-nokey" in dialog.status.text() and "255" not in dialog.status.text()
    assert dialog.entries.count() == 0
    click(qtbot, dialog.cancel_button)
    qtbot.waitUntil(lambda: tab.remote_browser is None, timeout=5000)

    choose_runner_host(qtbot, tab, ssh_host.dest)
    dialog = open_browser(qtbot, tab)
    missing = "/no such dir/$(touch X)"
    with qtbot.waitSignal(dialog.listing_failed, timeout=LIST_TIMEOUT_MS) as failed:
        type_path(qtbot, dialog, missing)
    assert failed.args == ["folder", f"no such folder: {missing}"]
    assert dialog.status.text() == f"no such folder: {missing}" and dialog.isVisible()
    assert dialog.entries.count() == 0
    click(qtbot, dialog.choose_button)  # nothing is shown: nothing to choose, the dialog stays
    assert dialog.isVisible() and "No folder is shown" in dialog.status.text()
    click(qtbot, dialog.cancel_button)
    qtbot.waitUntil(lambda: tab.remote_browser is None, timeout=5000)
    assert tab.model.currentText() == before
    assert not (ssh_host.home / "X").exists() and not Path("X").exists()
    assert ssh_host.wait_no_processes(but_agent=True) == []  # the host's agent answered


# -- gaudi-gui ls ---------------------------------------------------------------------------------------

def gaudi_gui(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=60, check=False)


def test_ls_json_shape_missing_folder_and_hf_cache(tmp_path: Path) -> None:
    folder = tmp_path / "a folder $(touch X)"
    (folder / "model").mkdir(parents=True)
    (folder / "model" / "config.json").write_text("{}")
    (folder / "adapter").mkdir()
    (folder / "adapter" / "adapter_config.json").write_text("{}")
    (folder / "Zplain").mkdir()
    (folder / "b.txt").write_text("12345")
    done = gaudi_gui("ls", str(folder), "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["path"] == str(folder) and answer["parent"] == str(tmp_path)
    assert answer["model"] is False and answer["truncated"] is False and answer["skipped"] == 0
    assert answer["entries"] == [
        {"name": "adapter", "is_dir": True, "size": 0, "model": True},
        {"name": "model", "is_dir": True, "size": 0, "model": True},
        {"name": "Zplain", "is_dir": True, "size": 0, "model": False},
        {"name": "b.txt", "is_dir": False, "size": 5, "model": False},
    ]
    assert json.loads(gaudi_gui("ls", "--json", "--", str(folder / "model")).stdout)["model"] is True
    home = json.loads(gaudi_gui("ls", "--json").stdout)
    assert home["path"] == os.path.expanduser("~")

    for path, words in ((tmp_path / "missing", "no such folder"), (folder / "b.txt", "not a folder")):
        done = gaudi_gui("ls", str(path), "--json")
        assert done.returncode != 0 and done.stdout == ""
        assert done.stderr.count("\n") == 1 and done.stderr == f"gaudi-gui ls: {words}: {path}\n"
    assert not (folder / "X").exists() and not Path("X").exists()

    hub = tmp_path / "hf-home" / "hub"  # HF_HOME of this test (tests/conftest.py)
    # A cache as huggingface_hub writes it: blobs, a snapshot of links into them, the ref.
    for kind, name in (("models", "org--name"), ("datasets", "org--data")):
        repo = hub / f"{kind}--{name}"
        (repo / "blobs").mkdir(parents=True)
        (repo / "blobs" / "abc123").write_bytes(b"abc")
        (repo / "snapshots" / "rev1").mkdir(parents=True)
        (repo / "snapshots" / "rev1" / "config.json").symlink_to("../../blobs/abc123")
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("rev1")
    (hub / "models--broken--one").mkdir()  # no snapshots: named as a problem, the others still listed
    cache = json.loads(gaudi_gui("ls", "--json", "--hf-cache").stdout)
    assert cache["cache"] == str(hub) and cache["models"] == [
        {"id": "org/name", "path": str(hub / "models--org--name"), "size": 3}]
    assert any("models--broken--one" in p for p in cache["problems"]), cache


def test_ls_on_a_host(ssh_host: SshHost) -> None:
    (ssh_host.home / "m $(id)").mkdir()
    (ssh_host.home / "m $(id)" / "config.json").write_text("{}")
    done = gaudi_gui("ls", "--host", ssh_host.dest, str(ssh_host.home), "--json")
    assert done.returncode == 0, done.stderr
    answer = json.loads(done.stdout)
    assert answer["path"] == str(ssh_host.home)
    assert {"name": "m $(id)", "is_dir": True, "size": 0, "model": True} in answer["entries"]
    done = gaudi_gui("ls", "--host", ssh_host.dest, str(ssh_host.home / "nope"), "--json")
    assert done.returncode == 1 and done.stderr.strip().endswith(f"no such folder: {ssh_host.home / 'nope'}")

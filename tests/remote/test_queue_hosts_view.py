"""A saved host's queue in the window (issue 29), over the real SSH test server: the Hosts overview's
Queue column says the host's queue length, and the Queue view's Machine selector, clicked as a person
clicks it, shows the host's queue (the job's kind, its state, why it waits); Remove, clicked, takes
the job out of the host's queue. The host's queue is its agent's, reached through this machine's agent
and its one link to the host (``queue`` events with the host's name)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from PySide6.QtCore import Qt

from gaudi_gui.app import create_services
from gaudi_gui.core import queue, remote
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run
from gaudi_gui.ui.hosts_tab import QUEUE, HostsTab
from gaudi_gui.ui.queue_view import QueueView
from tests.helpers import choose
from tests.remote.conftest import SshHost


def gg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=180, env=dict(os.environ))


def rows(view: QueueView) -> list[tuple[str, ...]]:
    table = view.table
    return [tuple((table.item(r, c).text() if table.item(r, c) is not None else "")  # type: ignore[union-attr]
                  for c in range(table.columnCount())) for r in range(table.rowCount())]


def test_a_hosts_queue_in_the_hosts_overview_and_the_queue_view(qtbot, ssh_host: SshHost,
                                                               tmp_path: Path) -> None:
    remote.save_hosts([remote.Host.parse(ssh_host.dest)])
    job = JobConfig(name="on-gg-remote")
    job.training_args = {"max_steps": 2, "save_strategy": "no"}
    job.save(tmp_path / "job.json")
    assert gg("queue", "pause", "--host", ssh_host.dest).returncode == 0  # nothing starts there
    added = gg("queue", "add", "--host", ssh_host.dest, "--config", str(tmp_path / "job.json"),
               "--cards", "2", "--json")
    assert added.returncode == 0, added.stderr
    entry_id = json.loads(added.stdout)["entry"]

    services = create_services()
    tab = HostsTab(services)
    qtbot.addWidget(tab)
    tab.resize(1400, 600)
    tab.show()
    local = services.ensure_queue()
    view = QueueView(local, host_names=lambda: [h.name for h in remote.saved_hosts()],
                     host_queue=services.ensure_host_queue)
    qtbot.addWidget(view)
    view.resize(1000, 400)
    view.show()
    try:
        # The overview: the host's row says its queue's length once its gaudi-gui answered.
        qtbot.waitUntil(lambda: tab._items[ssh_host.dest].text(QUEUE) == "1 queued", timeout=45000)
        assert "the queue is paused" in tab._items[ssh_host.dest].toolTip(QUEUE)

        # The Queue view shows this machine's (empty) queue; the selector is clicked to the host.
        assert view.machine.itemText(0) == "this machine" and view.machine.itemText(1) == ssh_host.dest
        choose(qtbot, view.machine, ssh_host.dest)  # a click opens the list, arrows, Return
        qtbot.waitUntil(lambda: [r[1].split()[0] for r in rows(view)] == [entry_id], timeout=45000)
        (row,) = rows(view)
        assert row[0] == "1" and row[2] == "training" and row[3] == "waiting for 2 cards"
        assert row[5] == "the queue is paused"
        assert view.summary.text().startswith(f"{ssh_host.dest}: ") and "paused" in view.summary.text()

        # Remove, clicked: the host's queue takes the job out; the view says so.
        view.table.selectRow(0)
        assert view.remove_button.isEnabled()
        qtbot.mouseClick(view.remove_button, Qt.MouseButton.LeftButton)
        qtbot.waitUntil(lambda: rows(view) and rows(view)[0][3] == "ended: removed", timeout=45000)
        # The request's answer may come after the queue's event that showed the row ended.
        qtbot.waitUntil(lambda: f"removed {entry_id}" in view.message.text(), timeout=45000)
        state = queue.read_state(ssh_host.home / "data" / "queue")
        assert [(e.id, e.outcome) for e in state.entries] == [(entry_id, "removed")]
        assert not queue.read_state().entries  # this machine's queue was never touched
    finally:
        tab.shutdown()
        services.stop_host_queues()
        local.shutdown()
        services.poller.stop()
    qtbot.waitUntil(lambda: not services.host_queues[ssh_host.dest].is_running(), timeout=10000)
    assert gg("queue", "resume", "--host", ssh_host.dest).returncode == 0
    assert ssh_host.wait_no_processes(60, but_agent=True) == []  # the host's agent stays


def test_an_evaluation_queued_on_a_host_runs_there_with_the_connection_cut(
        demo_model: Path, ssh_host: SshHost) -> None:
    """``queue add --host DEST --kind eval -- WORDS``: the words travel as data (on the agents' wire),
    the host's agent checks them (its own ``queue check``) and starts the evaluation under its own
    detached supervisor: an evaluate run folder on the host."""
    added = gg("queue", "add", "--host", ssh_host.dest, "--kind", "eval", "--cards", "1,", "--json", "--",
               "--model", str(demo_model), "--base", str(demo_model), "--prompt", "it's $(touch canary)",
               "--max-new-tokens", "4", "--metrics", "exact_match")
    assert added.returncode == 0, added.stderr
    entry_id = json.loads(added.stdout)["entry"]
    ssh_host.drop()
    root = ssh_host.home / "data" / "queue"

    def ended() -> queue.Entry | None:
        entry = queue.read_state(root).find(entry_id)
        return entry if entry is not None and entry.state == "ended" else None

    while (entry := ended()) is None:
        time.sleep(0.2)
    assert entry.outcome == "finished", entry.summary
    assert entry.kind == "eval" and entry.cards_used == [1]
    run = Run(entry.run_folder)
    assert run.folder.parent == ssh_host.runs_dir and run.kind == "eval"
    assert not (ssh_host.home / "canary").exists() and not Path("canary").exists()
    assert ssh_host.wait_no_processes(60, but_agent=True) == []  # the host's agent stays


def test_a_host_that_refuses_us_is_said_in_the_queue_view(qtbot, ssh_host: SshHost) -> None:
    remote.save_hosts([remote.Host.parse("gg-nokey")])  # the server does not accept its key
    services = create_services()
    local = services.ensure_queue()
    view = QueueView(local, host_names=lambda: [h.name for h in remote.saved_hosts()],
                     host_queue=services.ensure_host_queue)
    qtbot.addWidget(view)
    view.show()
    try:
        choose(qtbot, view.machine, "gg-nokey")
        qtbot.waitUntil(lambda: view.message.text().startswith("gg-nokey: "), timeout=45000)
        assert view.summary.text() == view.message.text().removeprefix("gg-nokey: ")
        assert "asking" not in view.summary.text() and view.table.rowCount() == 0
        assert not view.remove_button.isEnabled()
        # Back to this machine: its own (empty) queue again.
        choose(qtbot, view.machine, "local")
        qtbot.waitUntil(lambda: view.summary.text() == "the queue is empty", timeout=5000)
    finally:
        services.stop_host_queues()
        local.shutdown()
    qtbot.waitUntil(lambda: not services.host_queues["gg-nokey"].is_running(), timeout=10000)


def test_queue_clicked_with_a_host_placement_queues_the_job_on_that_host(qtbot, ssh_host: SshHost,
                                                                         tmp_path: Path) -> None:
    """The Training tab's Queue with the host chosen as placement: the job goes into the host's own
    queue (its agent's ``queue.add``, checked there), not this machine's; the host's queue list shows it."""
    from tests.helpers import click, close_training_tab, set_arg, training_tab

    remote.save_hosts([remote.Host.parse(ssh_host.dest)])
    assert gg("queue", "pause", "--host", ssh_host.dest).returncode == 0  # nothing starts there
    services, tab = training_tab(qtbot, tmp_path)
    entries: list[dict[str, object]] = []
    try:
        tab.placement.host_combo.setCurrentIndex(tab.placement.host_combo.findData(ssh_host.dest))
        tab.form.model.setCurrentText("builtin:demo")
        set_arg(tab, "output_dir", str(ssh_host.home / "queued-out"))  # a path on the host
        set_arg(tab, "max_steps", "2")
        click(qtbot, tab.btn["Queue"])
        qtbot.waitUntil(lambda: tab.status.text().startswith(f"queued on {ssh_host.dest}"), timeout=120000)
        listed = gg("queue", "list", "--host", ssh_host.dest, "--json")
        entries = json.loads(listed.stdout)["entries"]
        assert [(e["kind"], e["state"]) for e in entries] == [("train", "waiting")], entries
        assert entries[0]["output_dir"] == str(ssh_host.home / "queued-out")
        assert not queue.state_path().exists() or not queue.read_state().pending()  # not this machine's
    finally:
        close_training_tab(services, tab)
        for entry in entries:  # the host's queue, emptied
            gg("queue", "remove", "--host", ssh_host.dest, str(entry["id"]))


def test_queue_clicked_in_the_serve_panel_with_a_host_queues_the_server_there(qtbot,
                                                                            ssh_host: SshHost) -> None:
    """The Serve panel's Queue with a host chosen: a serve job in the host's own queue (its words as
    `serve --detach` takes them, each quoted for the host's shell), nothing in this machine's."""
    from tests.helpers import click
    from tests.qt.test_job_reattach import _open_panel, _window

    remote.save_hosts([remote.Host.parse(ssh_host.dest)])
    assert gg("queue", "pause", "--host", ssh_host.dest).returncode == 0  # nothing starts there
    window = _window(qtbot)
    panel = _open_panel(qtbot, window)
    click(qtbot, panel.host)  # the host list, opened and walked with the keys as a person does
    qtbot.waitUntil(panel.host.view().isVisible, timeout=5000)
    for _ in range(panel.host.count()):
        if panel.host.view().currentIndex().data() == ssh_host.dest:
            break
        qtbot.keyClick(panel.host.view(), Qt.Key.Key_Down)
    qtbot.keyClick(panel.host.view(), Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: panel.host.currentText() == ssh_host.dest, timeout=5000)
    entries: list[dict[str, object]] = []
    try:
        click(qtbot, panel.queue_button)
        qtbot.waitUntil(lambda: panel.status.text().startswith(f"queued on {ssh_host.dest}"), timeout=120000)
        entries = json.loads(gg("queue", "list", "--host", ssh_host.dest, "--json").stdout)["entries"]
        assert [(e["kind"], e["state"]) for e in entries] == [("serve", "waiting")], entries
        assert not queue.state_path().exists() or not queue.read_state().pending()  # not this machine's
    finally:
        for entry in entries:
            gg("queue", "remove", "--host", ssh_host.dest, str(entry["id"]))


def test_two_requests_to_a_host_each_get_their_own_answer(qtbot, ssh_host: SshHost) -> None:
    """An add and a Remove sent to a host's queue at the same moment (two ssh commands, answered in
    whatever order the host ends them): each sender gets its own answer, the Queue view's line gets
    both, each with its request's id."""
    from gaudi_gui.core.queue import CardRequest

    remote.save_hosts([remote.Host.parse(ssh_host.dest)])
    assert gg("queue", "pause", "--host", ssh_host.dest).returncode == 0  # nothing starts there
    services = create_services()
    place = services.ensure_host_queue(ssh_host.dest)
    added: list[tuple[bool, str]] = []
    seen: list[str] = []
    place.request_answered.connect(lambda request_id, _ok, _message: seen.append(request_id))
    entries: list[dict[str, object]] = []
    try:
        add = place.add_kind("download", ["org/name", "--stall-s", "60"], CardRequest(),
                             on_answer=lambda *answer: added.append(answer))
        remove = place.remove("q9")
        qtbot.waitUntil(lambda: len(seen) == 2, timeout=120000)
        assert sorted(seen) == sorted([add, remove]) and add != remove
        # The Remove's answer ("no queued job 'q9'") went to no add's sender.
        assert len(added) == 1 and added[0][0] is True and "queued q1" in added[0][1], added
        entries = json.loads(gg("queue", "list", "--host", ssh_host.dest, "--json").stdout)["entries"]
        assert [(e["kind"], e["name"]) for e in entries] == [("download", "download-name")]
    finally:
        services.stop_host_queues()
        for entry in entries:
            gg("queue", "remove", "--host", ssh_host.dest, str(entry["id"]))
    assert not place.is_running()
    assert gg("queue", "resume", "--host", ssh_host.dest).returncode == 0

"""Serve on this machine and on a saved host at once, through the agents (issue 38): the window starts
no process for either (``job.start`` to this machine's agent; for the host it carries the request over
its one ssh session to the host's agent), each panel shows its server ready, and Stop, clicked, ends
each with the state ``stopped`` (``job.stop``)."""

from __future__ import annotations

import dataclasses
from functools import partial

import pytest
from pytestqt.qtbot import QtBot

from gaudi_gui.core import remote
from gaudi_gui.core.runstore import Run
from gaudi_gui.core.serve import pick_free_port, port_free
from tests.helpers import click
from tests.qt.test_job_reattach import _answers, _open_panel, _window
from tests.remote.conftest import SshHost


@pytest.mark.usefixtures("demo_model")
def test_a_server_here_and_one_on_a_host_are_the_agents_and_stop_by_click(qtbot: QtBot,
                                                                          ssh_host: SshHost) -> None:
    remote.save_hosts([remote.Host.parse(ssh_host.dest)])
    here_window, host_window = _window(qtbot), _window(qtbot)
    here = _open_panel(qtbot, here_window)
    port = pick_free_port()
    here.port.selectAll()
    qtbot.keyClicks(here.port, str(port))
    click(qtbot, here.start_button)

    there = _open_panel(qtbot, host_window)
    there.host.setCurrentIndex(there.host.findText(ssh_host.dest))
    local, far = pick_free_port(), pick_free_port()
    there.port.selectAll()
    qtbot.keyClicks(there.port, str(local))
    # The "host" is this machine: its server listens on another port there than the forward's here.
    spec = dataclasses.replace(there.spec(), max_model_len=0)
    assert there.service.start(spec, there.placement(), remote_port=far) == []

    url = f"http://127.0.0.1:{port}/v1"
    qtbot.waitUntil(lambda: url in here.url.text(), timeout=180_000)
    qtbot.waitUntil(lambda: f"127.0.0.1:{local}" in there.url.text(), timeout=180_000)
    assert _answers(url) and _answers(f"http://127.0.0.1:{local}/v1")
    # Both run, and neither is the window's: no child of this process was started for them.
    assert ssh_host.window_children() == []
    here_run, host_run = Run(here.service.folder), Run(there.service.folder)
    assert host_run.folder.parent == ssh_host.runs_dir and here_run.folder.parent != ssh_host.runs_dir
    assert here_run.supervisor() is not None and host_run.supervisor() is not None

    click(qtbot, here.stop_button)
    click(qtbot, there.stop_button)
    qtbot.waitUntil(lambda: here.status.text().startswith("stopped"), timeout=120_000)
    qtbot.waitUntil(lambda: there.status.text().startswith("stopped"), timeout=120_000)
    for run in (here_run, host_run):
        qtbot.waitUntil(partial(lambda r: r.status().state != "running", run), timeout=60_000)
        assert (run.status().kind, run.status().state) == ("serve", "stopped"), run.status()
    qtbot.waitUntil(lambda: port_free(port) and port_free(local) and port_free(far), timeout=60_000)
    assert here_window.running_jobs() == [] and host_window.running_jobs() == []
    assert ssh_host.window_children() == []


@pytest.mark.usefixtures("demo_model")
def test_a_cut_connection_is_said_and_the_server_on_the_host_followed_again(qtbot: QtBot,
                                                                           ssh_host: SshHost) -> None:
    """The server goes on through a cut; the panel says the connection was lost, follows it again when
    the link is back (its endpoint forwarded again, its requests not shown twice), and Stop ends it."""
    remote.save_hosts([remote.Host.parse(ssh_host.dest)])
    window = _window(qtbot)
    panel = _open_panel(qtbot, window)
    panel.host.setCurrentIndex(panel.host.findText(ssh_host.dest))
    local, far = pick_free_port(), pick_free_port()
    panel.port.selectAll()
    qtbot.keyClicks(panel.port, str(local))
    spec = dataclasses.replace(panel.spec(), max_model_len=0)
    assert panel.service.start(spec, panel.placement(), remote_port=far) == []
    url = f"http://127.0.0.1:{local}/v1"
    qtbot.waitUntil(lambda: url in panel.url.text(), timeout=180_000)
    assert _answers(url)
    qtbot.waitUntil(lambda: panel.requests.rowCount() >= 1, timeout=30_000)
    rows = panel.requests.rowCount()

    ssh_host.drop()
    qtbot.waitUntil(lambda: "was lost" in panel.status.text(), timeout=30_000)
    assert panel.stop_button.isEnabled()  # the server goes on there
    qtbot.waitUntil(lambda: "following again" in panel.status.text(), timeout=60_000)
    qtbot.waitUntil(lambda: _answers(url), timeout=60_000)  # forwarded again on the new connection
    qtbot.waitUntil(lambda: panel.requests.rowCount() >= rows + 1, timeout=30_000)
    qtbot.wait(1000)  # the replayed history would come now: none of it is shown again
    assert panel.requests.rowCount() == rows + 1, panel.requests.rowCount()

    click(qtbot, panel.stop_button)
    qtbot.waitUntil(lambda: panel.status.text().startswith("stopped"), timeout=120_000)
    run = Run(panel.service.folder)
    qtbot.waitUntil(lambda: run.status().state != "running", timeout=60_000)
    assert run.status().state == "stopped", run.status()

"""``gaudi-gui serve --host DEST --detach`` (issue 26): the server's supervisor and run folder are the
host's, so a cut connection leaves it serving; it is followed and reached again over a new connection
(``runs show --host``, the forward asked for again) and ``runs stop --host`` ends it, leaving nothing
running there."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from gaudi_gui.commands.serve import forward
from gaudi_gui.core import remote
from gaudi_gui.core.placement import Forward
from gaudi_gui.core.serve import pick_free_port, port_free
from tests.helpers import answer_dialog, click
from tests.qt.test_job_reattach import _open_panel, _window
from tests.remote.conftest import SshHost


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          stdin=subprocess.DEVNULL, timeout=180)


def _answers(port: int) -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/models", timeout=10) as response:
            return response.status == 200
    except OSError:
        return False


def _engines(ssh_host: SshHost) -> list[str]:
    return [line for line in ssh_host.command_lines() if "transformers" in line]


def test_a_server_on_a_host_survives_a_cut_connection_and_is_stopped_after(ssh_host: SshHost,
                                                                           demo_model: Path) -> None:
    local, remote = pick_free_port(), pick_free_port()
    done = _cli("serve", "--host", ssh_host.dest, "--model", "builtin:demo", "--device", "cpu", "--port",
                str(local), "--remote-port", str(remote), "--detach", "--json")
    assert done.returncode == 0, done.stderr
    info = json.loads(done.stdout.strip().splitlines()[-1])
    assert info["kind"] == "serve" and info["host"] == ssh_host.dest
    assert info["url"] == f"http://127.0.0.1:{local}/v1"
    assert Path(info["folder"]).parent == ssh_host.runs_dir  # the host's own runs store
    while not _answers(local):  # through the forward, once the engine is ready
        time.sleep(0.2)

    ssh_host.drop()  # a network cut: every connection goes at once
    while not port_free(local):  # the forward went with the connection
        time.sleep(0.1)
    assert _engines(ssh_host), "the server must outlive the connection"
    shown = _cli("runs", "--host", ssh_host.dest, "show", info["name"])
    assert "(serve): running" in shown.stdout, (shown.stdout, shown.stderr)
    assert forward(ssh_host.dest, Forward(local, remote))  # a new connection, the same endpoint
    assert _answers(local)

    stop = _cli("runs", "--host", ssh_host.dest, "stop", info["name"])
    assert stop.returncode == 0, stop.stderr
    assert ssh_host.wait_no_processes(timeout=60) == []
    status = json.loads((Path(info["folder"]) / "status.json").read_text())
    assert (status["kind"], status["state"]) == ("serve", "stopped"), status


@pytest.mark.usefixtures("demo_model")
def test_the_serve_panel_re_attaches_a_server_left_on_a_host_after_a_cut(qtbot: QtBot,
                                                                        ssh_host: SshHost) -> None:
    """The app starts the host's own detached server (here with another port there than here: the
    "host" is this machine), leaves it running at close, the connection is cut, and the next window
    follows it again, forwards its port again, and its Stop ends it there."""
    remote.save_hosts([remote.Host.parse(ssh_host.dest)])
    local, far = pick_free_port(), pick_free_port()
    first = _window(qtbot)
    panel = _open_panel(qtbot, first)
    panel.host.setCurrentIndex(panel.host.findText(ssh_host.dest))
    panel.port.selectAll()
    qtbot.keyClicks(panel.port, str(local))
    # (The panel sizes --max-model-len for a host's vLLM; the demo model's context is 512.)
    spec = dataclasses.replace(panel.spec(), max_model_len=0)
    assert panel.service.start(spec, panel.placement(), remote_port=far) == []
    try:
        qtbot.waitUntil(lambda: f"127.0.0.1:{local}" in panel.url.text(), timeout=180_000)
    except Exception:
        raise AssertionError((panel.status.text(), panel.field_error.text(), panel.service.lines,
                              panel.service.folder, panel.service.last_argv)) from None
    assert _answers(local) and "--detach" in panel.service.last_argv
    answer = answer_dialog(qtbot, "Leave running and quit")
    with qtbot.waitSignal(first.closed, timeout=60_000):
        first.close()
    assert answer.clicked and "Serve: " in answer.text

    ssh_host.drop()
    while not port_free(local):  # the forward went with the connection
        time.sleep(0.1)
    assert _engines(ssh_host), "the server must outlive the connection"

    second = _window(qtbot)
    again = _open_panel(qtbot, second)
    try:
        qtbot.waitUntil(lambda: f"127.0.0.1:{local}" in again.url.text() and again.stop_button.isEnabled(),
                        timeout=120_000)
    except Exception:
        raise AssertionError((again.status.text(), again.url.text(), again.service.lines[-5:],
                              again.service.folder, again.service.host)) from None
    assert _answers(local)
    click(qtbot, again.stop_button)
    qtbot.waitUntil(lambda: again.status.text().startswith("stopped"), timeout=120_000)
    # Nothing of the server is left there (the window's own hl-smi poller of the host may run).
    qtbot.waitUntil(lambda: not [line for line in ssh_host.command_lines() if "serve" in line],
                    timeout=60_000)
    qtbot.waitUntil(lambda: port_free(local), timeout=30_000)  # the forward given back

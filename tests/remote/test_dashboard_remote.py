"""A run on a host opened in TensorBoard (issue 27): the export and the dashboard run on the host (from
the command line: the host's ``runs open`` over the multiplexed ssh connection of the test SSH server;
from the app: the host's agent's ``dashboard`` child, reached through this machine's agent), the
dashboard's port is forwarded here on the same connection, and the page answers at this machine's
URL; the command's end (Ctrl-C) and the app's shutdown leave nothing running on the host (but its
agent) and free the port here; a dropped connection ends a host's dashboard in words."""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import pytestqt.exceptions
from PySide6.QtCore import QProcess

from gaudi_gui.core import dashboard
from gaudi_gui.core.agentwire import Connection
from gaudi_gui.core.remote import Host
from gaudi_gui.services.dashboards import DashboardService
from tests.helpers import children_get_sigint, lines_of
from tests.remote.conftest import SshHost


def _host_run(ssh_host: SshHost, name: str) -> Path:
    folder = ssh_host.runs_dir / name
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    t0 = 1_700_000_000.0
    events = [{"type": "metrics", "rank": 0, "time": t0 + s, "step": s, "max_steps": 3, "loss": 3.0 - s / 4}
              for s in range(1, 4)]
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (folder / "status.json").write_text(json.dumps({"state": "finished", "started_at": t0}))
    return folder


def test_runs_open_on_a_host_forwards_the_dashboard_here(ssh_host: SshHost, tmp_path: Path) -> None:
    folder = _host_run(ssh_host, "run-h")
    # tensorboard missing from the host's Python: said from the host, with the pip command for it.
    bare = tmp_path / "bare-python"
    bare.write_text(f"#!/bin/sh\nexec {sys.executable} -S \"$@\"\n")
    bare.chmod(0o755)
    missing = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--host", ssh_host.dest, "open",
                              "run-h", "--tensorboard", "--no-browser", "--python", str(bare)],
                             capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)
    assert missing.returncode == 2, missing.stderr
    assert f"on {ssh_host.dest}: TensorBoard is not installed in {bare}" in missing.stderr
    assert f"`{bare} -m pip install tensorboard`" in missing.stderr and "Traceback" not in missing.stderr
    with children_get_sigint():  # its Ctrl-C (SIGINT) ends the dashboard there
        proc = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "runs", "--host", ssh_host.dest, "open",
                                 "run-h", "--tensorboard", "--no-browser", "--json"], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True)
    lines = lines_of(proc.stdout, keep_ends=True)
    try:
        line = lines.get(timeout=120)
        assert line, proc.stderr.read() if proc.stderr else ""
        message = json.loads(line)
        assert message["t"] == "opened", message
        url, port = message["url"], message["port"]
        assert url.startswith(f"http://127.0.0.1:{port}/") and port != message["remote_port"]
        assert dashboard.fetch(url)[0] == 200
        assert dashboard.lists_run("tensorboard", f"http://127.0.0.1:{port}/", "run-h")
        assert list(folder.glob("events.out.tfevents.*.gaudi-gui"))  # exported on the host, in its folder
        assert any("tensorboard.main" in c for c in ssh_host.command_lines())
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=60) == 0
        assert ssh_host.wait_no_processes() == []
        assert dashboard.fetch(url, timeout=1)[0] == 0  # the forward is cancelled
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _quiet_service() -> tuple[DashboardService, list[str]]:
    """A dashboard service that opens no browser, and the list its failures are told into."""
    service = DashboardService()
    service.open_browser = False
    failed: list[str] = []
    service.failed.connect(lambda _kind, why: failed.append(why))
    return service, failed


def test_the_app_opens_a_hosts_run_through_the_forward_and_ends_it_with_the_window(qtbot,
                                                                                   ssh_host: SshHost) -> None:
    folder = _host_run(ssh_host, "run-g")
    service, failed = _quiet_service()
    try:
        with qtbot.waitSignal(service.opened, timeout=120_000) as opened:
            service.open(str(folder), "tensorboard", Host.parse(ssh_host.dest))
        kind, url = opened.args
        assert kind == "tensorboard" and "runFilter=run-g" in url and not failed
        assert dashboard.fetch(url)[0] == 200
        assert service.running() == [("tensorboard", ssh_host.dest)]
        # The host's agent runs the command (its child, on the host); the window started none (the
        # forward is this machine's agent's).
        assert any(" runs open " in line and "--tensorboard" in line for line in ssh_host.command_lines())
        with contextlib.suppress(TimeoutError, pytestqt.exceptions.TimeoutError):
            qtbot.waitUntil(lambda: ssh_host.window_children() == [], timeout=30_000)
        assert ssh_host.window_children() == []
    finally:
        service.shutdown()
    qtbot.waitUntil(lambda: not service.running(), timeout=30_000)
    assert ssh_host.wait_no_processes(but_agent=True) == []  # the host's agent and its link's relay stay
    qtbot.waitUntil(lambda: dashboard.fetch(url, timeout=1)[0] == 0, timeout=30_000)


def test_a_hosts_dashboard_ends_with_a_dropped_connection_and_opens_again(qtbot, ssh_host: SshHost) -> None:
    """The connection to the host drops: the host's agent ends the dashboard with the link's session,
    the service forgets it (nobody waited: nothing to say), and the next open, asked at once, waits for
    the link to be made again and starts one again."""
    folder = _host_run(ssh_host, "run-d")
    service, failed = _quiet_service()
    try:
        with qtbot.waitSignal(service.opened, timeout=120_000) as opened:
            service.open(str(folder), "tensorboard", Host.parse(ssh_host.dest))
        ssh_host.drop()
        qtbot.waitUntil(lambda: not service.running(), timeout=30_000)
        assert not failed
        assert ssh_host.wait_no_processes(30, but_agent=True) == []
        with qtbot.waitSignal(service.opened, timeout=120_000) as again:
            service.open(str(folder), "tensorboard", Host.parse(ssh_host.dest))
        assert dashboard.fetch(again.args[1])[0] == 200 and not failed
        assert opened.args[0] == again.args[0] == "tensorboard"
    finally:
        service.shutdown()
    qtbot.waitUntil(lambda: not service.running(), timeout=30_000)
    assert ssh_host.wait_no_processes(30, but_agent=True) == []


@pytest.mark.sshd(max_sessions=2)
def test_a_hosts_dashboard_is_forwarded_by_the_agent_in_at_most_two_sessions(
        qtbot, ssh_host: SshHost, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38: the forward of a host's dashboard is asked of this machine's agent (``hosts.forward``),
    which runs it on the connection of its one link to the host. The window starts no process at all
    (not even a short ``ssh -O forward``), and the host's server counts at most 2 sessions (its
    MaxSessions here) while the dashboard is open through the forward."""
    started: list[str] = []
    start = QProcess.start

    def spy(process: QProcess, *args: Any, **kwargs: Any) -> None:
        started.append(" ".join([*map(str, args)] or [process.program(), *process.arguments()]))
        start(process, *args, **kwargs)

    monkeypatch.setattr(QProcess, "start", spy)
    folder = _host_run(ssh_host, "run-f")
    service, failed = _quiet_service()
    try:
        with qtbot.waitSignal(service.opened, timeout=120_000) as opened:
            service.open(str(folder), "tensorboard", Host.parse(ssh_host.dest))
        url = opened.args[1]
        assert dashboard.fetch(url)[0] == 200 and not failed
        assert started == [] and ssh_host.window_children() == []
        now, peak = ssh_host.sessions()
        assert now <= 2 and peak <= 2, (now, peak)
        with Connection.open() as conn:
            links = conn.request("status")["services"]["hosts"]["links"]
        port = int(url.split("127.0.0.1:", 1)[1].split("/", 1)[0])
        forward = service.boards[("tensorboard", ssh_host.dest)].forward
        assert forward is not None
        assert [link["forwards"] for link in links if link["host"] == ssh_host.dest] == [
            [f"{port}->{forward.remote_port}"]]
    finally:
        service.shutdown()
    qtbot.waitUntil(lambda: not service.running(), timeout=30_000)
    qtbot.waitUntil(lambda: dashboard.fetch(url, timeout=1)[0] == 0, timeout=30_000)  # cancelled
    assert started == [] and ssh_host.sessions()[1] <= 2



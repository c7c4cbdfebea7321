"""The agent itself: started on demand, one per user and state folder, private, ends when idle, relayed
over stdio (what a workstation runs through ssh), and what ``agent --status`` says."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gaudi_gui.core import agentwire
from gaudi_gui.core.agentwire import AgentError, Connection
from tests.helpers import wait_gone

CLI = [sys.executable, "-m", "gaudi_gui"]


def _agent_pid() -> int:
    with Connection.open(start=False) as conn:
        return int(conn.agent["pid"])


def test_the_first_client_starts_the_agent_and_later_ones_share_it() -> None:
    with Connection.open() as first, Connection.open() as second:
        assert first.agent["pid"] == second.agent["pid"]
        pid = first.agent["pid"]
        clients = first.request("status")["clients"]
        assert len(clients) == 2
        # Not a child of ours: the starter returned and was reaped; the agent runs on its own.
        assert pid not in [p.pid for p in psutil.Process().children(recursive=True)]
        assert psutil.Process(pid).ppid() != os.getpid()


def test_two_agents_started_at_once_leave_one_listening() -> None:
    starters = [subprocess.Popen([*CLI, "agent", "--daemon"]) for _ in range(3)]
    for proc in starters:
        assert proc.wait(timeout=30) == 0
    deadline = time.monotonic() + 20
    while agentwire.try_connect() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    pid = _agent_pid()
    time.sleep(0.5)  # the two late ones find the lock taken and end
    agents = [p for p in psutil.process_iter(["cmdline", "environ"])
              if p.info["cmdline"] and p.info["cmdline"][-2:] == ["agent", "--daemon"]
              and (p.info["environ"] or {}).get("GAUDI_GUI_HOME") == os.environ["GAUDI_GUI_HOME"]
              and p.status() != psutil.STATUS_ZOMBIE]
    assert [p.pid for p in agents] == [pid]


def test_the_socket_and_its_folder_are_private() -> None:
    with Connection.open():
        path = agentwire.socket_path()
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        assert stat.S_IMODE(path.parent.parent.stat().st_mode) == 0o700
        assert len(str(path)) < 100


def test_a_folder_of_another_owner_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    runtime = tmp_path / "run"
    (runtime / "gaudi-gui").mkdir(parents=True)
    (runtime / "gaudi-gui" / agentwire.state_key()).symlink_to(tmp_path)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    with pytest.raises(AgentError, match="not a folder of this user"):
        agentwire.socket_path()


def test_bad_lines_and_unknown_requests_get_words_not_a_dropped_agent() -> None:
    with Connection.open() as conn:
        conn._sock.sendall(b"not json\n")
        reply = conn.receive(10)
        assert reply is not None and reply["re"] == 0 and not reply["ok"] and "not JSON" in reply["error"]
        conn._sock.sendall(json.dumps({"v": 99, "id": 5, "op": "status"}).encode() + b"\n")
        reply = conn.receive(10)
        assert reply is not None and "version 99" in reply["error"]
        with pytest.raises(AgentError, match="knows no operation 'bogus'"):
            conn.request("bogus")
        with pytest.raises(AgentError, match="no such event: nope"):
            conn.request("subscribe", events=["nope"])
        assert conn.request("ping")["ok"]


def test_a_message_with_nan_infinities_enums_and_tuples_goes_out_as_plain_json() -> None:
    import enum

    class Colour(enum.Enum):
        RED = "red"

    message = {"ev": "event", "events": [{"loss": float("nan"), "grad_norm": float("inf"), "step": 3,
                                          "pair": (1, 2), "colour": Colour.RED, 7: "seven"}]}
    line = agentwire.encode(message)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    assert b"NaN" not in line and b"Infinity" not in line
    back = agentwire.decode(line)
    assert back["events"] == [{"loss": None, "grad_norm": None, "step": 3, "pair": [1, 2], "colour": "red",
                               "7": "seven"}]
    assert back["v"] == agentwire.VERSION
    # The common case (nothing to clean) gives the same bytes as cleaning first.
    plain = {"ev": "log", "lines": ["a", "b"], "n": 1.5, "colour": Colour.RED}
    assert agentwire.decode(agentwire.encode(plain)) == {**plain, "colour": "red", "v": agentwire.VERSION}


def test_it_ends_itself_when_idle_and_a_client_starts_it_again(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GAUDI_GUI_AGENT_IDLE_S", "0.5")
    with Connection.open() as conn:
        pid = conn.agent["pid"]
        time.sleep(1.2)  # a connected client keeps it up, however long
        assert conn.request("ping")["ok"]
    assert wait_gone(pid, 15)
    assert agentwire.try_connect() is None
    with Connection.open() as conn:
        assert conn.agent["pid"] != pid
    log = agentwire.log_path().read_text()
    assert "idle for 0 s with nothing running: ending" in log or "idle for 1 s" in log


def test_stdio_relays_requests_and_ends_when_its_input_closes() -> None:
    relay = subprocess.Popen([*CLI, "agent", "--stdio"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert relay.stdin is not None and relay.stdout is not None
    relay.stdin.write(agentwire.encode({"id": 1, "op": "hello", "client": "stdio"}))
    relay.stdin.flush()
    hello = agentwire.decode(relay.stdout.readline())
    assert hello["re"] == 1 and hello["ok"] and hello["agent"]["pid"] == _agent_pid()
    relay.stdin.close()
    assert relay.wait(timeout=15) == 0
    # The agent outlives the relay (a dropped ssh session touches no work).
    assert agentwire.try_connect() is not None


def test_status_says_what_runs_and_where_its_log_is() -> None:
    none = subprocess.run([*CLI, "agent", "--status"], capture_output=True, text=True, timeout=60)
    assert none.returncode == 3 and "no agent runs" in none.stdout
    assert str(agentwire.log_path()) in none.stdout
    with Connection.open() as conn:
        out = subprocess.run([*CLI, "agent", "--status"], capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, out.stderr
        assert f"pid {conn.agent['pid']}" in out.stdout and str(agentwire.log_path()) in out.stdout
        assert "clients: 2" in out.stdout and "running: nothing" in out.stdout
    stop = subprocess.run([*CLI, "agent", "--stop"], capture_output=True, text=True, timeout=60)
    assert stop.returncode == 0 and "ending" in stop.stdout


def test_an_agent_whose_code_was_replaced_on_disk_ends_once_nothing_would_be_lost(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """After an upgrade (here: a module of the agent's own copy of the package written again), the agent
    running the old code says so, waits for the command that follows a job through it, then ends; the
    next client starts the new code. A window's connection does not hold it (the window connects again)."""
    import gaudi_gui

    code = tmp_path / "code"
    shutil.copytree(Path(gaudi_gui.__file__).parent, code / "gaudi_gui",
                    ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setenv("PYTHONPATH", str(code))  # the agent a client starts runs this copy
    monkeypatch.chdir(tmp_path)  # (`python -m` puts its working folder first on the path)
    monkeypatch.setenv("GAUDI_GUI_AGENT_CODE_CHECK_S", "0.3")
    window = Connection.open(client="window")
    pid = int(window.agent["pid"])
    assert psutil.Process(pid).environ().get("PYTHONPATH") == str(code)
    sock = agentwire.try_connect()
    assert sock is not None
    command = Connection(sock, client="cli")
    time.sleep(1.0)
    assert psutil.pid_exists(pid) and command.request("ping")["ok"]  # nothing changed: it stays

    module = code / "gaudi_gui" / "core" / "paths.py"
    module.write_text(module.read_text() + "\n# upgraded\n")
    os.utime(module, (time.time() + 5, time.time() + 5))
    deadline = time.monotonic() + 30
    said = ""
    while "ends once these end" not in said and time.monotonic() < deadline:
        time.sleep(0.3)
        said = subprocess.run([*CLI, "agent", "--status"], capture_output=True, text=True, timeout=60).stdout
    assert "the installed gaudi-gui changed: this agent ends once these end: a cli client" in said, said
    assert command.request("ping")["ok"]  # the command's stream goes on while it follows its job

    command.close()
    assert wait_gone(pid, 20), "the agent of the old code did not end once nothing held it"
    with pytest.raises(AgentError):
        window.request("ping", timeout=5)
    window.close()
    with Connection.open() as conn:
        assert int(conn.agent["pid"]) != pid and conn.agent["outdated"] == ""
    assert "the installed gaudi-gui changed (" in agentwire.log_path().read_text()

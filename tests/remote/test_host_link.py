"""A host costs one ssh session: the agent carries every request and subscription for a host over one
``ssh HOST gaudi-gui agent --stdio`` link, against a server that refuses a connection's third session
(MaxSessions 2). A cut link says so in words, comes back with its subscriptions, and touches nothing
that runs on the host."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from gaudi_gui import __version__
from gaudi_gui.core import agentwire, remote
from gaudi_gui.core.agentwire import AgentError, Connection
from tests.remote.conftest import ALIAS, SshHost


def _wait_event(conn: Connection, timeout: float, **fields: Any) -> dict[str, Any]:
    """The first event whose fields hold ``fields`` (a value ending in '…' matches a prefix)."""
    deadline = time.monotonic() + timeout
    seen: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        for event in conn.stream(timeout=max(0.05, deadline - time.monotonic())):
            seen.append(event)
            if all(str(event.get(k, "")).startswith(v[:-1]) if isinstance(v, str) and v.endswith("…")
                   else event.get(k) == v for k, v in fields.items()):
                return event
            if time.monotonic() > deadline:
                break
    raise AssertionError(f"no event with {fields} in {timeout} s; seen: {seen[-8:]}")


def _link(conn: Connection) -> dict[str, Any]:
    links = conn.request("status")["services"]["hosts"]["links"]
    return next(link for link in links if link["host"] == ALIAS)


@pytest.mark.sshd(max_sessions=2)
def test_one_session_carries_a_host_and_comes_back_after_a_cut(ssh_host: SshHost) -> None:
    # Work on the host that no link may touch: a long child of its own.
    code, out, _err = remote.call(remote.Host.parse(ALIAS),
                                  ["sh", "-c", "sleep 600 </dev/null >/dev/null 2>&1 & echo $!"])
    assert code == 0
    sleeper = psutil.Process(int(out.split()[-1]))

    with Connection.open() as conn, Connection.open() as other:
        conn.request("subscribe", events=["host"])  # this agent's word on its links
        assert conn.request("hosts.connect", host=ALIAS, timeout=120)["state"] == "up"
        # Many requests at once, of several services, on the one link.
        idents = [conn.send(op, host=ALIAS, **args) for _ in range(10)
                  for op, args in (("ping", {}), ("host.info", {}), ("status", {}),
                                   ("files.list", {"path": str(ssh_host.home)}))]
        replies: dict[int, dict[str, Any]] = {}
        deadline = time.monotonic() + 60
        while len(replies) < len(idents) and time.monotonic() < deadline:
            message = conn.receive(5)
            if message is not None and message.get("re") in idents:
                replies[message["re"]] = message
        assert all(r["ok"] for r in replies.values()) and len(replies) == len(idents)
        info = replies[idents[1]]["info"]
        assert info["gaudi_gui"] == __version__ and info["protocol"] == remote.REMOTE_PROTOCOL
        host_agent = replies[idents[2]]["agent"]
        assert Path(host_agent["log"]).is_relative_to(ssh_host.home)  # the host's agent, not ours
        assert replies[idents[3]]["path"] == str(ssh_host.home)
        with pytest.raises(AgentError, match="no such folder"):
            conn.request("files.list", host=ALIAS, path=str(ssh_host.home / "nowhere"))

        # Subscriptions through the host: its events come back to who subscribed, marked with it.
        conn.request("subscribe", host=ALIAS, events=["host"])
        other.request("subscribe", host=ALIAS, events=["notice"])
        sock = agentwire.try_connect(Path(host_agent["socket"]))
        assert sock is not None
        with Connection(sock, "test-on-the-host") as there:
            there.request("hosts.disconnect", host="elsewhere")
            _wait_event(conn, 20, ev="host", host=ALIAS, message="disconnected from elsewhere")
            assert not [e for e in other.stream(timeout=0.3) if e.get("ev") == "host"]

            assert ssh_host.sessions() == (1, 1)

            # The link's ssh killed, then the whole connection cut: said in words, made again.
            for cut in ("kill", "drop"):
                if cut == "kill":
                    os.kill(int(_link(conn)["pid"]), signal.SIGKILL)
                else:
                    ssh_host.drop()
                _wait_event(conn, 30, ev="host", host=ALIAS, state="connecting",
                            message=f"the connection to {ALIAS} was lost; connecting… (retry in 1 s)")
                _wait_event(conn, 60, ev="host", host=ALIAS, state="up")
                # The subscription was made again: the host's events reach the session again.
                there.request("hosts.disconnect", host="elsewhere")
                _wait_event(conn, 20, ev="host", host=ALIAS, message="disconnected from elsewhere")
                assert conn.request("ping", host=ALIAS)["ok"]

        # Nothing on the host was touched: the same agent, the child still running.
        assert conn.request("status", host=ALIAS)["agent"]["pid"] == host_agent["pid"]
        assert sleeper.is_running() and sleeper.status() != psutil.STATUS_ZOMBIE
        opened, peak = ssh_host.sessions()
        assert opened == 1 and peak <= 2, (opened, peak)
        conn.request("hosts.disconnect", host=ALIAS)
        _wait_event(conn, 20, ev="host", host=ALIAS, state="down")
    sleeper.kill()

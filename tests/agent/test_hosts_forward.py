"""The agent's ``hosts.forward`` (agent/hosts.py): the refusals come before anything runs — no host,
a destination that would be an ssh option or is no destination, a port that is not a TCP port, a port
here that someone holds — and no link to a host is opened for a refused request; a cancel of a forward
nobody opened says so instead of failing."""

from __future__ import annotations

import socket
from typing import Any

import pytest

from gaudi_gui.core.agentwire import AgentError, Connection


def test_a_forward_is_refused_for_a_bad_host_or_port_and_opens_no_link() -> None:
    good = {"local_port": 40123, "remote_port": 6006}
    cases: list[tuple[dict[str, Any], str]] = [
        ({"host": "", **good}, "needs a host"),
        ({"host": "local", **good}, "needs a host"),
        ({"host": "-oProxyCommand=touch /tmp/x", **good}, "cannot begin with '-'"),
        ({"host": "gg a; rm -rf ~", **good}, "not an SSH destination"),
        ({"host": "gg-a:99999", **good}, "port out of range"),
        ({"host": "gg-a", "local_port": 0, "remote_port": 6006}, "local_port must be a TCP port"),
        ({"host": "gg-a", "local_port": 65536, "remote_port": 6006}, "local_port must be a TCP port"),
        ({"host": "gg-a", "local_port": "8000", "remote_port": 6006}, "local_port must be a TCP port"),
        ({"host": "gg-a", "local_port": True, "remote_port": 6006}, "local_port must be a TCP port"),
        ({"host": "gg-a", "local_port": 40123}, r"remote_port must be a TCP port \(1 to 65535\), not None"),
        ({"host": "gg-a", "local_port": 40123, "remote_port": -1}, "remote_port must be a TCP port"),
        ({"host": "gg-a", "local_port": 40123, "remote_port": 1.5}, "remote_port must be a TCP port"),
    ]
    with Connection.open() as conn:
        for args, words in cases:
            with pytest.raises(AgentError, match=words):
                conn.request("hosts.forward", **args)
        # A port here that someone else listens on: ssh would answer 0 and forward nothing.
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            with pytest.raises(AgentError, match=f"port {port} is already taken on this machine"):
                conn.request("hosts.forward", host="gg-a", local_port=port, remote_port=6006)
        # None of these reached ssh: no link was opened for them.
        assert conn.request("status")["services"]["hosts"]["links"] == []
        # Giving back a forward that was never opened (no connection to the host): said, not failed.
        answer = conn.request("hosts.forward", host="gg-nowhere", local_port=40123, remote_port=6006,
                              cancel=True)
        assert answer["cancelled"] is False
        assert conn.request("status")["services"]["hosts"]["links"] == []

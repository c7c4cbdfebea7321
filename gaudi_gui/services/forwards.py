"""A port forward to a host, asked of this machine's agent (``hosts.forward``, docs/agent-protocol.md).

The agent runs ``ssh -O forward`` on the connection of its one link to the host and keeps the forward
with this window's session: it is cancelled when asked (``cancel=True``), when the window's session
ends and when the agent stops. The window starts no ssh for it and never waits: the answer comes back
to ``done`` on the event loop.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from gaudi_gui.core.placement import Forward
from gaudi_gui.services.agent_child import shared_client
from gaudi_gui.services.agent_client import AgentClient

#: ``done(ok, words)``: the forward is open (ok) or why not, in the agent's words.
Done = Callable[[bool, str], None]


def request_forward(host: str, forward: Forward, done: Done | None = None, *, cancel: bool = False,
                    client: AgentClient | None = None) -> None:
    """Ask the agent to forward ``forward.local_port`` here to ``forward.remote_port`` on ``host``'s
    loopback (or, with ``cancel``, to give it back)."""

    def reply(message: dict[str, Any]) -> None:
        if done is not None:
            # The asker may be gone by the time the answer comes (a closed view's service).
            with contextlib.suppress(RuntimeError):
                done(bool(message.get("ok")), str(message.get("error") or ""))

    (client or shared_client()).request("hosts.forward", reply, host=host, local_port=forward.local_port,
                                        remote_port=forward.remote_port, cancel=cancel)


__all__ = ["request_forward"]

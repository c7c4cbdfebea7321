"""The reading side of ``gaudi-gui runs follow``'s JSON lines, for every follower of a run (the app's
Qt part and the command line's threads): where to resume after a dropped connection, the run's last
status and its final one. The writing side is ``commands/runs.py``.

Lines: ``{"t": "event", "event": {...}, "end": N}`` (``end`` on a batch's last event: the events
offset to resume from), ``{"t": "log", "line": TEXT}``, ``{"t": "log_offset", "end": N}``,
``{"t": "status", "status": {...}}``, ``{"t": "alive"}`` (a heartbeat) and ``{"t": "end",
"status": {...}}`` once the run is over and everything was sent."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any


@dataclass
class FollowCursor:
    """One run followed through ``runs follow`` calls, one after the other."""

    events_from: int = 0
    log_from: int = 0
    #: The newest status the follower sent ({} before the first).
    status: dict[str, Any] = field(default_factory=dict)
    #: The run's final status once an "end" line came (None until then).
    final: dict[str, Any] | None = None

    def argv(self, folder: str) -> list[str]:
        """The ``gaudi-gui`` arguments that follow the run in ``folder`` from where the last call
        stopped."""
        return ["runs", "follow", folder, "--events-from", str(self.events_from),
                "--log-from", str(self.log_from)]

    def take(self, line: str | bytes) -> dict[str, Any] | None:
        """The message of one stdout line (None for a line that is not one), the offsets, status and
        final status moved on by it."""
        try:
            msg = json.loads(line)
        except ValueError:
            return None
        if not isinstance(msg, dict):
            return None
        kind = msg.get("t")
        end = msg.get("end")
        if kind == "event" and isinstance(end, int):
            self.events_from = end
        elif kind == "log_offset" and isinstance(end, int):
            self.log_from = end
        elif kind == "status" and isinstance(msg.get("status"), dict):
            self.status = msg["status"]
        elif kind == "end":
            status = msg.get("status")
            self.final = status if isinstance(status, dict) else {}
        return msg


__all__ = ["FollowCursor"]

"""The reading side of `runs follow`: what both followers (the app's part, the CLI's threads) resume
from and end on."""

from __future__ import annotations

import json

from gaudi_gui.core.follow_stream import FollowCursor


def test_the_cursor_resumes_after_the_last_batch_and_keeps_the_final_status() -> None:
    cursor = FollowCursor()
    assert cursor.argv("/r") == ["runs", "follow", "/r", "--events-from", "0", "--log-from", "0"]
    lines = [{"t": "event", "event": {"type": "metrics", "step": 1}},  # mid-batch: no offset yet
             {"t": "event", "event": {"type": "metrics", "step": 2}, "end": 120},
             {"t": "log", "line": "step 2"}, {"t": "log_offset", "end": 37},
             {"t": "status", "status": {"state": "running", "step": 2}}, {"t": "alive"}]
    for msg in lines:
        assert cursor.take(json.dumps(msg).encode()) == msg
    assert (cursor.events_from, cursor.log_from) == (120, 37)
    assert cursor.status == {"state": "running", "step": 2} and cursor.final is None
    assert cursor.argv("/r")[3:] == ["--events-from", "120", "--log-from", "37"]
    # What is not a message moves nothing: noise from a login shell, a list, an offset that is no int.
    for noise in ("Welcome to host", "[1, 2]", json.dumps({"t": "log_offset", "end": "9"})):
        cursor.take(noise)
    assert (cursor.events_from, cursor.log_from) == (120, 37)
    assert cursor.take("Welcome") is None and cursor.take("[1]") is None
    cursor.take(json.dumps({"t": "end", "status": {"state": "stopped", "checkpoint": "/r/c-2"}}))
    assert cursor.final == {"state": "stopped", "checkpoint": "/r/c-2"}
    assert FollowCursor().take('{"t": "end", "status": null}') == {"t": "end", "status": None}

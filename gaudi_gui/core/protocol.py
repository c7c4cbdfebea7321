"""The JSON-lines protocol between the Qt process and its child processes.

Every structured message is one line: ``PREFIX`` followed by a compact JSON object with a ``type`` key
(events, child -> parent) or a ``cmd`` key (commands, parent -> child). The prefix lets a reader pick the
protocol out of a stream that also carries ordinary log text (the training worker shares stdout with the
Trainer, tqdm and accelerate), and lets a worker ignore noise on stdin.

This module is Qt-free and torch-free: workers, services and the command line all use it.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

PREFIX = "@gaudi-gui "
PROTOCOL_VERSION = 1


class ProtocolError(ValueError):
    """A line carried the prefix but not a valid message."""


def _clean(value: Any) -> Any:
    # JSON has no NaN/Infinity; a NaN loss must still reach the UI, as null, not break the stream.
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, Mapping):
        return {str(k): _clean(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_clean(v) for v in value]
    return value


def encode(message: Mapping[str, Any]) -> str:
    """One protocol line (no trailing newline)."""
    if "type" not in message and "cmd" not in message:
        raise ProtocolError("a message needs a 'type' (event) or a 'cmd' (command) key")
    return PREFIX + json.dumps(_clean(message), separators=(",", ":"), ensure_ascii=False, default=str)


def event(kind: str, **fields: Any) -> str:
    return encode({"type": kind, **fields})


def command(name: str, **fields: Any) -> str:
    return encode({"cmd": name, **fields})


def decode(line: str) -> dict[str, Any] | None:
    """The message on ``line``, or None when the line is ordinary text.

    Raises ProtocolError when the line has the prefix but its payload is not a JSON object with a
    ``type`` or ``cmd`` key, so a truncated or corrupt message is reported instead of silently lost.
    """
    text = line.rstrip("\r\n")
    start = text.find(PREFIX)
    if start < 0:
        return None
    payload = text[start + len(PREFIX):]
    try:
        message = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"bad protocol line ({exc.msg}): {payload[:200]!r}") from exc
    if not isinstance(message, dict) or ("type" not in message and "cmd" not in message):
        raise ProtocolError(f"protocol line is not a message: {payload[:200]!r}")
    return message

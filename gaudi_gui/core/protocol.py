"""The JSON-lines protocol between the Qt process and its child processes.

Every structured message is one line that BEGINS with ``PREFIX``, followed by a compact JSON object with
a ``type`` key (events, child -> parent) or a ``cmd`` key (commands, parent -> child). The prefix lets a
reader pick the protocol out of a stream that also carries ordinary log text (the training worker shares
stdout with the Trainer, tqdm and accelerate), and lets a worker ignore noise on stdin.

Only a line that starts with the prefix is a message. Text that merely contains it (a dataset row, a
column name, a log line quoting an event) is ordinary text: anything else would let data a user trains
on spoof events such as ``finished`` with a made-up ``final_loss``. A reader never raises anything but
ProtocolError, whatever the line holds (deep nesting, huge numbers, lone surrogates).

This module is Qt-free and torch-free: workers, services and the command line all use it.
"""

from __future__ import annotations

import json
import math
import threading
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


#: The same cleaning for other JSON lines the app writes (the run's event file).
json_safe = _clean


def encode(message: Mapping[str, Any]) -> str:
    """One protocol line (no trailing newline)."""
    if "type" not in message and "cmd" not in message:
        raise ProtocolError("a message needs a 'type' (event) or a 'cmd' (command) key")
    return PREFIX + json.dumps(_clean(message), separators=(",", ":"), ensure_ascii=False, default=str)


def event(kind: str, **fields: Any) -> str:
    return encode({"type": kind, **fields})


def command(name: str, **fields: Any) -> str:
    return encode({"cmd": name, **fields})


_WRITE_LOCK = threading.Lock()


def write_line(stream: Any, text: str) -> None:
    """Write ``text`` and its newline to ``stream`` as one whole line, whatever other threads of this
    process write. ``print(text, flush=True)`` writes the text and the newline as two writes, so two
    threads (a server's request log and its state) can produce ``{event}{event}\\n\\n``: one broken
    line that the reader refuses. OSError (a reader that went away) is the caller's to handle."""
    with _WRITE_LOCK:
        stream.write(text + "\n")
        stream.flush()


def decode(line: str) -> dict[str, Any] | None:
    """The message on ``line``, or None when the line is ordinary text.

    Raises ProtocolError when the line has the prefix but its payload is not a JSON object with a
    ``type`` or ``cmd`` key, so a truncated or corrupt message is reported instead of silently lost.
    """
    if not isinstance(line, str):
        raise ProtocolError(f"a protocol line must be text, not {type(line).__name__}")
    text = line.rstrip("\r\n")
    if not text.startswith(PREFIX):
        return None
    payload = text[len(PREFIX):]
    try:
        message = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise ProtocolError(f"bad protocol line ({exc.msg}): {payload[:200]!r}") from exc
    except RecursionError as exc:
        # 100k '[' overflow the decoder's stack; a choking line is a bad line, not a crash.
        raise ProtocolError(f"protocol line nested too deeply: {payload[:200]!r}") from exc
    except (ValueError, TypeError, OverflowError, MemoryError) as exc:
        # ValueError: e.g. an integer with more digits than Python's int limit.
        raise ProtocolError(f"bad protocol line ({type(exc).__name__}): {payload[:200]!r}") from exc
    if not isinstance(message, dict) or ("type" not in message and "cmd" not in message):
        raise ProtocolError(f"protocol line is not a message: {payload[:200]!r}")
    return message

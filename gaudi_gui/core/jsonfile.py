"""Reading a small JSON file that may be damaged, with one readable sentence for what is wrong.

A run folder outlives the program that wrote it: a disk that filled up, a copy cut short or an editor
that saved in another encoding leaves files that every reader of the history meets. Each reader needs
the same words for the damage ("config.json is not UTF-8 (byte 0xff at 12)", "status.json is
truncated") so the run shows its own problem instead of a traceback that hides every other run.
Qt-free and torch-free.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

# What is left after the JSON decoder gave up at the end of a cut-off file: a partial literal or number.
_PARTIAL_TOKEN = re.compile(r"^\s*(t(r(ue?)?)?|f(a(l(se?)?)?)?|n(u(ll?)?)?|-?[0-9.eE+-]*)\s*$")


class FileProblem(ValueError):
    """A file that cannot be read as JSON; the message names the file and what is wrong."""


def decode(raw: bytes, name: str) -> str:
    """``raw`` as UTF-8 text; FileProblem naming the first bad byte and where it is."""
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileProblem(f"{name} is not UTF-8 (byte 0x{raw[exc.start]:02x} at {exc.start})") from None


def parse(text: str, name: str) -> Any:
    """``text`` as JSON; FileProblem saying "truncated" when the text stops in the middle of a
    document (a write cut short), else where the JSON is wrong."""
    if not text.strip():
        raise FileProblem(f"{name} is empty")
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if exc.msg.startswith("Unterminated string") or _PARTIAL_TOKEN.match(text[exc.pos:]):
            raise FileProblem(f"{name} is truncated") from None
        raise FileProblem(f"{name} is not JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})") from None
    except RecursionError:
        raise FileProblem(f"{name} is nested too deeply to read") from None


def read(path: str | Path, name: str = "") -> Any:
    """The JSON value in ``path``; FileProblem for a missing, unreadable, non-UTF-8, empty, truncated
    or malformed file. ``name``: how the message names the file (default: its file name)."""
    path = Path(path)
    name = name or path.name
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise FileProblem(f"{name} is missing") from None
    except OSError as exc:
        raise FileProblem(f"cannot read {name}: {exc.strerror or exc}") from None
    return parse(decode(raw, name), name)


__all__ = ["FileProblem", "decode", "parse", "read"]

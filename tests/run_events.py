"""What the command-line training tests read of a run folder, and how they wait for it (these tests
drive subprocesses, not a Qt event loop, so they poll)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def wait_until(condition: Callable[[], object], timeout: float = 60.0) -> bool:
    """True as soon as ``condition()`` holds, False after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return bool(condition())


def events(run: Path, kind: str) -> list[dict[str, Any]]:
    """The run's events of type ``kind`` (none while the file does not exist yet)."""
    try:
        lines = (run / "events.jsonl").read_text().splitlines()
    except OSError:
        return []
    return [e for e in map(json.loads, lines) if e.get("type") == kind]


def steps(run: Path) -> int:
    """The highest step the run's metrics events reached."""
    return max((int(e.get("step") or 0) for e in events(run, "metrics")), default=0)

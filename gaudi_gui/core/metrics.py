"""The training worker's metric lines (one JSON object per logging step) and what the UI derives."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any


def parse_line(line: str) -> dict[str, Any] | None:
    """One metrics.jsonl line as a dict, or None for blank/corrupt lines (a crash can cut the last)."""
    line = line.strip()
    if not line:
        return None
    try:
        value = json.loads(line)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return []
    return [m for m in (parse_line(line) for line in text.splitlines()) if m is not None]


def series(records: Iterable[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key`` over the records that carry it."""
    xs: list[float] = []
    ys: list[float] = []
    for rec in records:
        value = rec.get(key)
        step = rec.get("step")
        if isinstance(value, (int, float)) and isinstance(step, (int, float)):
            xs.append(float(step))
            ys.append(float(value))
    return xs, ys


@dataclass
class Progress:
    step: int = 0
    max_steps: int = 0
    elapsed: float = 0.0

    @property
    def fraction(self) -> float:
        return min(1.0, self.step / self.max_steps) if self.max_steps > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds left, from the average pace so far (None before the first step)."""
        if self.step <= 0 or self.max_steps <= 0 or self.elapsed <= 0:
            return None
        return max(0.0, (self.max_steps - self.step) * self.elapsed / self.step)

    def update(self, record: Mapping[str, Any]) -> None:
        if isinstance(record.get("step"), int):
            self.step = record["step"]
        if isinstance(record.get("max_steps"), int) and record["max_steps"] > 0:
            self.max_steps = record["max_steps"]
        if isinstance(record.get("elapsed"), (int, float)):
            self.elapsed = float(record["elapsed"])


def format_duration(seconds: float | None) -> str:
    if seconds is None:
        return "–"
    seconds = round(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def final_loss(records: Iterable[Mapping[str, Any]]) -> float | None:
    last = None
    for rec in records:
        if isinstance(rec.get("loss"), (int, float)):
            last = float(rec["loss"])
    return last

"""The training worker's metric lines (one JSON object per logging step) and what the UI derives."""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from gaudi_gui.core.events import EventType


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


_EVENT_ONLY_KEYS = ("type", "v", "rank")


def metric_record(event: Mapping[str, Any]) -> dict[str, Any] | None:
    """The metrics record carried by an events.jsonl ``metrics`` event, else None."""
    if event.get("type") != EventType.METRICS or not isinstance(event.get("step"), int):
        return None
    return {k: v for k, v in event.items() if k not in _EVENT_ONLY_KEYS}


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


def format_ago(ts: float) -> str:
    """'3m05s ago' for a time stamp ('?' for none): when a cached model was last used."""
    return format_duration(max(0.0, time.time() - ts)) + " ago" if ts else "?"


def format_size(size: int) -> str:
    """Bytes in binary units, as ``gaudi-gui ls`` and the remote browser show them: '512 B', '1.5 GiB'."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{size} B"  # pragma: no cover


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



#: The rewards TRL's preference trainers log per logging step beside the loss (DPOTrainer, ORPOTrainer,
#: KTOTrainer in TRL 1.16; KTO logs no accuracies), each averaged over the step's batches; the worker
#: puts them in the run's metrics records under these names, and the Training tab charts them.
REWARD_CHOSEN = "rewards/chosen"
REWARD_REJECTED = "rewards/rejected"
REWARD_MARGINS = "rewards/margins"
REWARD_ACCURACIES = "rewards/accuracies"
REWARD_SERIES = (REWARD_CHOSEN, REWARD_REJECTED, REWARD_MARGINS, REWARD_ACCURACIES)


def has_rewards(records: Iterable[Mapping[str, Any]]) -> bool:
    """Does any record carry a preference trainer's reward as a finite number (a DPO/ORPO/KTO run's
    records, not an SFT run's)?"""
    import math

    return any(isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)
               for r in records for v in (r.get(k) for k in REWARD_SERIES))

"""A run's events -> where it is: the one reducer of ``events.jsonl`` (``core.events.EventType``).

``RunProgress.apply(event)`` moves the state on by one event. The Training tab's ``TrainingJob`` (a Qt
adapter that turns its changes into signals), the supervisor (the step it writes into status.json),
the command line's followers (``note``) and the judgement of an ended run (``core.outcome``) read the
same state, so they cannot disagree. Qt-free and torch-free.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gaudi_gui.core.events import EventType
from gaudi_gui.core.metrics import metric_record


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _rank(event: Mapping[str, Any]) -> int:
    return _int(event.get("rank")) or 0


@dataclass
class RunProgress:
    """Where a run is. ``start_step``: where this launch began (a resumed run starts at its checkpoint's
    step); ``elapsed``: seconds since this launch began training, so the pace is (step - start_step) /
    elapsed, never the absolute step over this launch's time. The fields given are what its status said."""

    step: int = 0
    max_steps: int = 0
    elapsed: float = 0.0
    start_step: int = 0
    #: The worker's last phase ("loading", "resuming", "training", "evaluating", "finishing"); whether
    #: training began (the Trainer started, or a step was logged); how many processes train.
    phase: str = ""
    began: bool = False
    world_size: int = 0
    #: The last logged training loss, and every metrics record in order (the chart's points).
    loss: float | None = None
    records: list[dict[str, Any]] = field(default_factory=list)
    #: The checkpoint being written (its step, since when on this machine's clock; 0 when none) and
    #: the last one saved (path, step, seconds it took).
    saving_step: int = 0
    saving_since: float = 0.0
    checkpoint: str = ""
    checkpoint_step: int = 0
    checkpoint_seconds: float | None = None
    #: The first stop_requested and error events, and the end (finished or stopped of the lowest
    #: rank: the first rank of the machine whose run folder this is).
    stop: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    #: How many events were applied, and the highest vocabulary version among them.
    seen: int = 0
    version: int = 0

    @property
    def fraction(self) -> float:
        return min(1.0, self.step / self.max_steps) if self.max_steps > 0 else 0.0

    @property
    def eta(self) -> float | None:
        """Seconds left, from the average pace so far (None before the first step)."""
        done = self.step - self.start_step
        if done <= 0 or self.max_steps <= 0 or self.elapsed <= 0:
            return None
        return max(0.0, (self.max_steps - self.step) * self.elapsed / done)

    def update(self, record: Mapping[str, Any]) -> None:
        """Take a metrics record's step, max_steps, start_step and elapsed (the step never goes back)."""
        start, max_steps = _int(record.get("start_step")), _int(record.get("max_steps")) or 0
        self.start_step = self.start_step if start is None else start
        self.step = max(self.step, _int(record.get("step")) or 0)
        self.max_steps = max_steps if max_steps > 0 else self.max_steps
        if isinstance(record.get("elapsed"), (int, float)):
            self.elapsed = float(record["elapsed"])

    def apply(self, event: Mapping[str, Any]) -> dict[str, Any] | None:
        """Move on by one event; the metrics record it carried (None for any other event, or a
        metrics event without a step). An unknown type changes nothing but ``seen``."""
        self.seen += 1
        self.version = max(self.version, _int(event.get("v")) or 1)
        kind, step = event.get("type"), _int(event.get("step")) or 0
        if kind == EventType.METRICS:
            record = metric_record(event)
            if record is not None:
                self.update(record)
                loss = record.get("loss")
                self.loss = float(loss) if isinstance(loss, (int, float)) else self.loss
                self.records.append(record)
                self.began = True
            return record
        if kind == EventType.TRAINING_STARTED:
            self.update(event)
            self.step = max(self.step, self.start_step)
            self.phase, self.began = "training", True
            self.world_size = _int(event.get("world_size")) or self.world_size
        elif kind == EventType.PHASE:
            self.phase = str(event.get("phase") or self.phase)
        elif kind == EventType.CHECKPOINT_SAVING:
            self.saving_step, self.saving_since = step or self.step, time.time()
        elif kind == EventType.CHECKPOINT_SAVED:
            seconds = event.get("seconds")
            self.saving_step, self.saving_since, self.step = 0, 0.0, max(self.step, step)
            self.checkpoint, self.checkpoint_step = str(event.get("path") or ""), step
            self.checkpoint_seconds = float(seconds) if isinstance(seconds, (int, float)) else None
        elif kind == EventType.STOP_REQUESTED:
            self.stop = self.stop or dict(event)
        elif kind == EventType.ERROR:
            self.error = self.error or dict(event)
        elif kind in (EventType.FINISHED, EventType.STOPPED) and (self.end is None
                                                                  or _rank(event) <= _rank(self.end)):
            self.end = dict(event)
        return None

    def apply_all(self, events: Iterable[Mapping[str, Any]]) -> RunProgress:
        for event in events:
            self.apply(event)
        return self


def note(event: Mapping[str, Any], where: str = "") -> str:
    """The one human line an event says ("" for one that says nothing by itself): the Training tab's
    status line and the command line's notes. ``where``: " on HOST" and the like."""
    kind, step = event.get("type"), event.get("step")
    if kind == EventType.TRAINING_STARTED:
        return (f"training{where}: step {_int(event.get('start_step')) or 0} of {event.get('max_steps')} "
                f"on {event.get('world_size')} process(es)")
    if kind == EventType.PHASE:
        return str(event.get("message") or event.get("phase") or "")
    if kind == EventType.CHECKPOINT_SAVING:
        return f"saving checkpoint-{step}…"
    if kind == EventType.CHECKPOINT_SAVED:
        took = event.get("seconds")
        return f"checkpoint-{step} saved" + (f" in {took:.1f} s" if isinstance(took, (int, float)) else "")
    if kind == EventType.ERROR:
        return f"error ({event.get('kind')}): {event.get('message')}"
    if kind == EventType.STOP_REQUESTED:
        return f"stop requested ({event.get('signal')}): checkpoint at the end of this step"
    if kind == EventType.METRICS and step is not None and event.get("loss") is not None:
        return f"step {step}/{event.get('max_steps')} loss {event.get('loss')}"
    return ""


__all__ = ["RunProgress", "note"]

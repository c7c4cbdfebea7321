"""A run's events -> where it is: the one reducer of ``events.jsonl`` (``core.events.EventType``).

``RunProgress.apply(event)`` moves the state on by one event: step, max_steps, start_step and elapsed
(``metrics.Progress``: fraction, ETA), the last loss, the worker's phase, the checkpoint being saved
and the last one saved, a stop request, the first error and the end event. The Training tab's
``TrainingJob`` (a Qt adapter that turns its changes into signals), the supervisor (the step it writes
into status.json, its notes), the command line's followers (``note``) and the judgement of an ended
run (``core.outcome``) read the same state, so they cannot disagree. Qt-free and torch-free.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from gaudi_gui.core.events import EVENTS_VERSION, EventType
from gaudi_gui.core.metrics import Progress, metric_record


def _int(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def rank_of(event: Mapping[str, Any]) -> int:
    return _int(event.get("rank")) or 0


@dataclass
class RunProgress(Progress):
    """Where a run is, from its events (``apply``) over what its status said (the fields given)."""

    #: The worker's last phase ("loading", "resuming", "training", "evaluating", "finishing").
    phase: str = ""
    #: Training began (the Trainer started, or a step was logged).
    began: bool = False
    world_size: int = 0
    #: The last logged training loss (None before one).
    loss: float | None = None
    #: The metrics records, in order (the chart's points).
    records: list[dict[str, Any]] = field(default_factory=list)
    #: The step of the checkpoint being written (0: none) and since when (this machine's clock).
    saving_step: int = 0
    saving_since: float = 0.0
    #: The last checkpoint saved (its path), its step and how long it took ("" / 0 / None before one).
    checkpoint: str = ""
    checkpoint_step: int = 0
    checkpoint_seconds: float | None = None
    #: The first ``stop_requested`` event, the first ``error`` event, and the end event (``finished``
    #: or ``stopped`` of the lowest rank: the first rank of the machine whose run folder this is).
    stop: dict[str, Any] | None = None
    error: dict[str, Any] | None = None
    end: dict[str, Any] | None = None
    #: How many events were applied, and the highest vocabulary version among them.
    seen: int = 0
    version: int = 0

    def apply(self, event: Mapping[str, Any]) -> dict[str, Any] | None:
        """Move on by one event; the metrics record it carried (None for any other event, or a
        metrics event without a step). An unknown type changes nothing but ``seen``."""
        self.seen += 1
        self.version = max(self.version, _int(event.get("v")) or 1)
        kind = event.get("type")
        step = _int(event.get("step"))
        if kind == EventType.METRICS:
            record = metric_record(event)
            if record is None:
                return None
            before = self.step
            self.update(record)
            self.step = max(before, self.step)
            if isinstance(record.get("loss"), (int, float)):
                self.loss = float(record["loss"])
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
            self.saving_step = step or self.step
            self.saving_since = time.time()
        elif kind == EventType.CHECKPOINT_SAVED:
            self.saving_step, self.saving_since = 0, 0.0
            self.checkpoint = str(event.get("path") or "")
            self.checkpoint_step = step or 0
            seconds = event.get("seconds")
            self.checkpoint_seconds = float(seconds) if isinstance(seconds, (int, float)) else None
            self.step = max(self.step, step or 0)
        elif kind == EventType.STOP_REQUESTED:
            self.stop = self.stop or dict(event)
        elif kind == EventType.ERROR:
            self.error = self.error or dict(event)
        elif kind in (EventType.FINISHED, EventType.STOPPED) and (self.end is None
                                                                  or rank_of(event) <= rank_of(self.end)):
            self.end = dict(event)
        return None

    def apply_all(self, events: Iterable[Mapping[str, Any]]) -> RunProgress:
        for event in events:
            self.apply(event)
        return self

    @property
    def ended(self) -> bool:
        return self.end is not None


def note(event: Mapping[str, Any], where: str = "") -> str:
    """The one human line an event says ("" for one that says nothing by itself): the Training tab's
    status line and the command line's notes. ``where``: " on HOST" and the like."""
    kind = event.get("type")
    if kind == EventType.TRAINING_STARTED:
        return (f"training{where}: step {_int(event.get('start_step')) or 0} of {event.get('max_steps')} "
                f"on {event.get('world_size')} process(es)")
    if kind == EventType.PHASE:
        return str(event.get("message") or event.get("phase") or "")
    if kind == EventType.CHECKPOINT_SAVING:
        return f"saving checkpoint-{event.get('step')}…"
    if kind == EventType.CHECKPOINT_SAVED:
        seconds = event.get("seconds")
        took = f" in {seconds:.1f} s" if isinstance(seconds, (int, float)) else ""
        return f"checkpoint-{event.get('step')} saved{took}"
    if kind == EventType.ERROR:
        return f"error ({event.get('kind')}): {event.get('message')}"
    if kind == EventType.STOP_REQUESTED:
        return f"stop requested ({event.get('signal')}): checkpoint at the end of this step"
    if kind == EventType.METRICS and event.get("step") is not None and event.get("loss") is not None:
        return f"step {event.get('step')}/{event.get('max_steps')} loss {event.get('loss')}"
    return ""


__all__ = ["EVENTS_VERSION", "RunProgress", "note", "rank_of"]

"""The Training tab's meter strip: energy and power while a run on this machine trains, and the run
meter's warnings (compilations that keep rising after warm-up) live and when a run is reopened.

- ``power``: '⚡ 205 W now · 1.2 Wh so far · 0.0057 card-hours', from the run folder's meter.jsonl
  (written by the run's own supervisor, ``core.meter``), read as it grows every ``POLL_MS`` while
  the run runs (``core.meter_files.LiveReader``: only the new bytes). A run on a host keeps its meter
  there: no strip for it (``gaudi-gui runs show`` there says it).
- ``warning``: the meter's "warning" events (``core.compile_rise``), as they arrive through the
  job's events, or from an ended run's summary (``compile_warning``) and events.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

from gaudi_gui.core import compile_rise, meter_files
from gaudi_gui.core.events import EventType
from gaudi_gui.core.runstore import Run

#: How often the strip reads the run's meter.jsonl while it runs (the meter samples once a second).
POLL_MS = 2000


def _label(parent: QWidget, name: str) -> QLabel:
    label = QLabel("", parent)
    label.setObjectName(name)
    label.setWordWrap(True)
    label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    label.setVisible(False)
    return label


class MeterStrip(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.power = _label(self, "meter-power")
        self.power.setToolTip("the run's own cards, sampled by its supervisor (meter.jsonl); energy: their "
                              "power integrated, card-hours: cards x time so far")
        self.warning = _label(self, "meter-warning")
        self.warning.setStyleSheet("color: #9a5b00;")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.power)
        layout.addWidget(self.warning)
        self.reader: meter_files.LiveReader | None = None
        self._timer = QTimer(self)
        self._timer.setInterval(POLL_MS)
        self._timer.timeout.connect(self.poll)

    @property
    def following(self) -> bool:
        return self._timer.isActive()

    def follow(self, folder: str | Path) -> None:
        """Read ``folder``'s meter.jsonl as it grows (again only for another folder)."""
        path = Path(folder)
        if self.reader is not None and self.reader.path.parent == path and self._timer.isActive():
            return
        # The run's start: what the share of the run so far the readings cover counts from.
        self.reader = meter_files.LiveReader(path, started_t=Run(path).status().started_at or None)
        self.poll()
        self._timer.start()

    def poll(self) -> None:
        if self.reader is None:
            return
        # Each poll, new samples or not: an hl-smi that stopped answering leaves no new line, and
        # the last "W now" and "Wh so far" must not stand as if it still did.
        self.reader.read()
        self.power.setText(self.reader.text(now=time.time()))
        self.power.setVisible(bool(self.power.text()))

    def stop(self) -> None:
        """The run ended: stop reading; the meter line under the status says what it cost (a power
        "now" of an ended run would be stale)."""
        self._timer.stop()
        self.power.setVisible(False)

    def clear(self) -> None:
        self._timer.stop()
        self.reader = None
        for label in (self.power, self.warning):
            label.setText("")
            label.setVisible(False)

    def take_event(self, event: dict[str, Any]) -> None:
        """A run's event (the job's ``event_received``): a meter warning is shown at once."""
        if event.get("type") == EventType.WARNING:
            self.show_warning(event)

    def show_warning(self, finding: dict[str, Any] | None) -> None:
        """The finding in two lines at most (the chart keeps its room); what to do in full in the
        tooltip (and in ``runs show``)."""
        text = compile_rise.rise_text(finding)
        if text and finding:
            self.warning.setText(f"⚠ {finding['message']} — dynamic shapes? pad to fixed lengths or "
                                 "buckets; dataloader_drop_last (more in the tooltip)")
            self.warning.setToolTip(f"{text}\n\nfrom the Gaudi bridge's compile meter (PT_HPU_METRICS_FILE) "
                                    "and the run's logged steps")
            self.warning.setVisible(True)

    def show_ended(self, run: Run, events: list[dict[str, Any]] | None = None) -> None:
        """An ended or reopened run: its warning (summary, else its events); no live power."""
        self._timer.stop()
        summary = meter_files.read_summary(run.folder) or {}
        finding = summary.get("compile_warning")
        if not finding:
            found = [e for e in (events if events is not None else run.events())
                     if e.get("type") == EventType.WARNING]
            finding = found[-1] if found else None
        self.show_warning(finding)


__all__ = ["POLL_MS", "MeterStrip"]

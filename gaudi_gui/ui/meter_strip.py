"""The Training tab's meter strip: energy and power while a run trains, and the run meter's warnings
(compilations that keep rising after warm-up) live and when a run is reopened.

- ``power``: '⚡ 205 W now · 1.2 Wh so far · 0.0057 card-hours', the run's meter so far as the agent of
  its machine reads it (the ``meter`` event, ``services.run_meter.RunMeter``: the agent reads the
  run's meter.jsonl, written by its supervisor's ``core.meter``, and sends a reading each second, new
  samples or not, so a reading that grew old says so). The strip reads no file; a run on one host is
  shown the same way, through the host's agent.
- ``warning``: the meter's "warning" events (``core.compile_rise``), as they arrive through the
  job's events, or from an ended run's summary (``compile_warning``) and events.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QLabel, QSizePolicy, QVBoxLayout, QWidget

from gaudi_gui.core import compile_rise, meter_files
from gaudi_gui.core.events import EventType
from gaudi_gui.core.runstore import Run

if TYPE_CHECKING:
    from gaudi_gui.services.run_meter import RunMeter


def _label(parent: QWidget, name: str) -> QLabel:
    label = QLabel("", parent)
    label.setObjectName(name)
    label.setWordWrap(True)
    label.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
    label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
    label.setVisible(False)
    return label


class MeterStrip(QWidget):
    """``meter``: where the live readings come from (none: the strip shows warnings only)."""

    def __init__(self, parent: QWidget | None = None, meter: RunMeter | None = None) -> None:
        super().__init__(parent)
        self.power = _label(self, "meter-power")
        self.power.setToolTip("the run's own cards, sampled by its supervisor (meter.jsonl, read by the "
                              "agent of its machine); energy: their power integrated, card-hours: cards x "
                              "time so far")
        self.warning = _label(self, "meter-warning")
        self.warning.setStyleSheet("color: #9a5b00;")
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.power)
        layout.addWidget(self.warning)
        self.meter = meter
        #: The last reading shown (the ``meter`` event's), None before one came.
        self.reading: dict[str, Any] | None = None
        if meter is not None:
            meter.reading_received.connect(self.show_reading)

    @property
    def following(self) -> bool:
        return self.meter is not None and self.meter.following

    def follow(self, job_id: str, *, host: str = "", runs_dir: str = "") -> None:
        """Show the readings of the running job ``job_id`` (its run folder's name; on ``host``'s agent
        where one is named; ``runs_dir``: this machine's runs store it is in)."""
        if self.meter is not None:
            if self.meter.followed != (job_id, host):
                self.reading = None
            self.meter.follow(job_id, host=host, runs_dir=runs_dir)

    def show_reading(self, reading: dict[str, Any]) -> None:
        """A reading of the followed run: its line as the agent worded it (the agent's clock judges
        how old the last sample is, so a host's clock that differs from this one's does not)."""
        if not self.following:
            return
        self.reading = reading
        self.power.setText(str(reading.get("text") or ""))
        self.power.setVisible(bool(self.power.text()))

    def stop(self) -> None:
        """The run ended: no more readings; the meter line under the status says what it cost (a power
        "now" of an ended run would be stale)."""
        if self.meter is not None:
            self.meter.stop()
        self.power.setVisible(False)

    def clear(self) -> None:
        if self.meter is not None:
            self.meter.stop()
        self.reading = None
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
        if self.meter is not None:
            self.meter.stop()
        summary = meter_files.read_summary(run.folder) or {}
        finding = summary.get("compile_warning")
        if not finding:
            found = [e for e in (events if events is not None else run.events())
                     if e.get("type") == EventType.WARNING]
            finding = found[-1] if found else None
        self.show_warning(finding)


__all__ = ["MeterStrip"]

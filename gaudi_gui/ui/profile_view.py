"""A profiled run's page (issue 40): the top operators, host vs device time, graph compilations of the
profiled steps, what to do about them (``core.profile_rules``), and "Open trace".

The numbers come from ``core.profile.read`` (``<run>/profile/summary.json`` and the meter's view of
the same steps); "Open trace" hands the trace file to the desktop (QDesktopServices: whatever opens
.json there) and says where the file is in any case, with the viewers that read it (ui.perfetto.dev,
TensorBoard's profile plugin), since a desktop rarely has a program for a Chrome trace.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QUrl, Signal
from PySide6.QtGui import QDesktopServices
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core import profile as profile_mod
from gaudi_gui.core.profile_rules import sentences

#: The operator table's columns.
COLUMNS = ("operator", "calls", "self host ms", "self device ms", "host total ms")


def _ms(value: Any) -> str:
    return f"{value:,.1f}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "–"


class ProfileView(QWidget):
    """One run's profile. ``show_run(folder)`` reads it again; a run without one says how to make one."""

    #: "Open trace" handed the trace to the desktop: (the file's URL, whether a program took it).
    trace_opened = Signal(str, bool)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.folder: Path | None = None
        self.summary: dict[str, Any] | None = None
        self.heading = QLabel(self)
        self.heading.setWordWrap(True)
        self.times = QLabel(self)
        self.times.setWordWrap(True)
        self.advice = QLabel(self)
        self.advice.setWordWrap(True)
        self.advice.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.table = QTableWidget(0, len(COLUMNS), self)
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.open_button = QPushButton("Open trace", self)
        self.open_button.setToolTip("open the trace file with this desktop's program for it (Perfetto UI "
                                    "and TensorBoard's profile plugin read it too)")
        self.open_button.clicked.connect(lambda _checked=False: self.open_trace())
        self.where = QLabel(self)
        self.where.setWordWrap(True)
        # Selectable: the path is copied from here where no program opens the file.
        self.where.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        row = QHBoxLayout()
        row.addWidget(self.open_button)
        row.addWidget(self.where, 1)
        layout = QVBoxLayout(self)
        for w in (self.heading, self.times, self.advice):
            layout.addWidget(w)
        layout.addWidget(self.table, 1)
        layout.addLayout(row)

    def show_run(self, folder: str | Path, name: str = "") -> bool:
        """Show the run's profile; False (and a line saying how to make one) where it has none."""
        self.folder = Path(folder)
        self.summary = profile_mod.read(folder)
        name = name or self.folder.name
        self.setWindowTitle(f"Profile — {name}")
        summary = self.summary
        if summary is None:
            self.heading.setText(f"{name} was not profiled: set \"Profile N steps\" in the form, the job's "
                                 f"profile_steps, or `gaudi-gui train --profile-steps N`")
            for w in (self.times, self.advice, self.where):
                w.clear()
            self.table.setRowCount(0)
            self.open_button.setEnabled(False)
            return False
        steps = int(summary.get("steps") or 0)
        first = summary.get("first_step")
        where = f"steps {first}–{first + steps - 1}" if isinstance(first, int) and steps else f"{steps} steps"
        mean = summary.get("step_mean_s")
        activities = ", ".join(summary.get("activities") or []) or "?"
        mean_ms = _ms(mean * 1000 if isinstance(mean, float) else None)
        self.heading.setText(f"{name}: {steps} profiled step(s) ({where}, after "
                             f"{profile_mod.PROFILE_SKIP_STEPS} warm-up steps), mean step {mean_ms} ms; "
                             f"recorded: {activities} (rank {summary.get('rank', 0)})")
        device = summary.get("device_ms")
        parts = [f"host {_ms(summary.get('host_ms'))} ms",
                 f"device {_ms(device)} ms" if device is not None else "device: none recorded (a CPU run)",
                 f"data loader {_ms(summary.get('dataloader_ms'))} ms",
                 f"of {_ms(summary.get('step_total_ms'))} ms of steps"]
        compiled = summary.get("compilations")
        if isinstance(compiled, dict):
            seconds = compiled.get("seconds")
            parts.append(f"graph compilations: {compiled.get('count', 0)} "
                         f"({_ms(seconds * 1000 if isinstance(seconds, (int, float)) else None)} ms)")
        self.times.setText(" · ".join(parts))
        said = sentences(summary)
        self.advice.setText("\n".join(f"• {s}" for s in said) if said else
                            "Nothing to act on: no rule found compilations, a waiting card, a slow card or "
                            "costly all-reduce in these steps.")
        self._fill(summary.get("top_operators") or [], on_device=device is not None)
        trace = str(summary.get("trace") or "")
        self.open_button.setEnabled(bool(trace))
        self.where.setText(f"trace: {trace}" if trace else "the trace file is missing from the run folder")
        return True

    def _fill(self, rows: list[dict[str, Any]], *, on_device: bool) -> None:
        self.table.setRowCount(len(rows))
        for r, row in enumerate(rows):
            # No device recorded (a CPU run): "–", never a measured-looking 0.
            cells = (str(row.get("name", "")), str(row.get("calls", "")), _ms(row.get("self_host_ms")),
                     _ms(row.get("self_device_ms")) if on_device else "–", _ms(row.get("host_total_ms")))
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if c:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(r, c, item)
        self.table.resizeColumnsToContents()

    def open_trace(self) -> None:
        """Hand the trace to the desktop; say where it is whatever happens (no program may take it)."""
        trace = str((self.summary or {}).get("trace") or "")
        if not trace:
            return
        url = QUrl.fromLocalFile(trace)
        opened = bool(QDesktopServices.openUrl(url))
        how = "opened with this desktop's program for it" if opened else "no program here opens it"
        self.where.setText(f"trace: {trace} ({how}; ui.perfetto.dev or TensorBoard's profile plugin read "
                           f"it too)")
        self.trace_opened.emit(url.toString(), opened)

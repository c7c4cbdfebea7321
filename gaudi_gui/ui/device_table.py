"""The table of cards: one row per card, checkboxes for the job selection, health highlighted.

Each row leads with the card's one name ("module 3": ``core.devices.card_name``, the id the job
selection and ``HABANA_VISIBLE_MODULES`` take); the index is a secondary column. The Health column
says, in words and in its colour, the doctor's worst finding for the card (``set_health``, fed by
the Devices tab from the health service) after what the live samples show (0 C, hot, implausible
values), the processes holding it, or that it is healthy and free. Utilization has its own column:
it is not called "busy".

A card's check toggles on a click anywhere in its row and on Space (the row with the focus frame);
the table handles both itself, so the check cell is not Qt-user-checkable (Qt would toggle a click
on the box a second time)."""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor, QKeyEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QProgressBar,
    QTableWidget,
    QTableWidgetItem,
    QWidget,
)

from gaudi_gui.core.devices import DeviceSample, card_detail, card_warnings, sample_name
from gaudi_gui.ui.device_charts import COLORS

COLUMNS = ("Use", "Card", "Health", "Util %", "Memory", "Temp °C", "Power W", "Name", "Index", "Bus ID",
           "UUID / serial", "Driver")
_COL = {name: i for i, name in enumerate(COLUMNS)}
#: Row backgrounds per severity (the Health view's reds and ambers).
SEVERITY_COLOURS = {"error": QColor("#f8d0d0"), "warning": QColor("#fff0c8")}
_FREE = QColor("#e3f4e3")  # the Health cell of a healthy, free card
#: The Health column's width: most findings fit, the tooltip has all of them.
HEALTH_WIDTH = 300


@dataclass(frozen=True)
class CardHealth:
    """What the doctor says about one card, for its row: ``severity`` ("error", "warning", "ok"),
    ``text`` (the worst finding in words, or "healthy, free"), ``tip`` (every finding and its fix)."""

    severity: str
    text: str
    tip: str = ""


def selection_id(sample: DeviceSample) -> int:
    """The id a job selection uses: the module id on Gaudi (HABANA_VISIBLE_MODULES), else the index."""
    if sample.kind == "hpu" and sample.module_id is not None:
        return sample.module_id
    return sample.index


def _fmt(value: float | None, digits: int = 0) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


class DeviceTable(QTableWidget):
    """Rows are created when the set of cards changes and only updated in place on every sample."""

    #: The user (un)checked cards: carries the checked selection ids.
    selection_edited = Signal(list)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(0, len(COLUMNS), parent)
        self.setHorizontalHeaderLabels(list(COLUMNS))
        self.verticalHeader().setVisible(False)
        self.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.setSelectionMode(QAbstractItemView.SelectionMode.NoSelection)
        header = self.horizontalHeader()
        # Not ResizeToContents: it re-measures every cell on every setText (milliseconds per sample).
        # Columns are fitted when the rows are rebuilt and when a text outgrows its column.
        header.setSectionResizeMode(QHeaderView.ResizeMode.Interactive)
        self.setColumnWidth(_COL["Memory"], 190)
        self.setColumnWidth(_COL["Health"], HEALTH_WIDTH)
        header.setStretchLastSection(True)
        self.setTextElideMode(Qt.TextElideMode.ElideRight)
        # One line per card: a long health text is elided (its tooltip has all of it), so that every
        # row keeps the height the table was sized for.
        self.setWordWrap(False)
        self._keys: list[str] = []
        self._ids: list[int] = []
        self._bars: list[QProgressBar] = []
        self._checked: set[int] = set()
        self._checkable: list[bool] = []
        self._updating = False
        self._fit_pending = False
        self.hot_c = 85.0
        self.busy_util = 5.0
        self._health: dict[int, CardHealth] = {}
        self._samples: list[DeviceSample] = []
        self.itemChanged.connect(self._on_item_changed)
        self.cellClicked.connect(lambda row, _col: self.toggle_row(row))
        self.setFocusPolicy(Qt.FocusPolicy.StrongFocus)
        self.setMaximumHeight(self.horizontalHeader().sizeHint().height() + 60)

    def set_checked(self, ids: Sequence[int]) -> None:
        self._checked = set(ids)
        self._updating = True
        try:
            for row, card_id in enumerate(self._ids):
                item = self.item(row, 0)
                if item is not None and self._checkable[row]:
                    state = Qt.CheckState.Checked if card_id in self._checked else Qt.CheckState.Unchecked
                    if item.checkState() != state:
                        item.setCheckState(state)
        finally:
            self._updating = False

    def set_health(self, health: Mapping[int, CardHealth]) -> None:
        """The doctor's word per card, by selection id (module id); {} when there is no report."""
        if dict(health) == self._health:
            return
        self._health = dict(health)
        if self._samples:
            self.update_samples(self._samples)

    def update_samples(self, samples: Sequence[DeviceSample]) -> None:
        self._samples = list(samples)
        keys = [s.key for s in samples]
        self._updating = True
        try:
            if keys != self._keys:
                self._rebuild(samples)
            for row, sample in enumerate(samples):
                self._update_row(row, sample)
            if self._fit_pending:
                self._fit_pending = False
                for col in range(len(COLUMNS) - 1):
                    if col not in (_COL["Memory"], _COL["Health"]):
                        self.resizeColumnToContents(col)
                self.setColumnWidth(_COL["Memory"], 190)
                self.setColumnWidth(_COL["Health"], HEALTH_WIDTH)
        finally:
            self._updating = False

    def _rebuild(self, samples: Sequence[DeviceSample]) -> None:
        self.setRowCount(len(samples))
        self._keys = [s.key for s in samples]
        self._ids = [selection_id(s) for s in samples]
        self._bars = []
        # The host is shown, not selectable: jobs on the CPU need no device env.
        self._checkable = [s.kind != "host" for s in samples]
        for row, card_id in enumerate(self._ids):
            check = QTableWidgetItem()
            check.setFlags(Qt.ItemFlag.ItemIsEnabled)
            if self._checkable[row]:
                check.setToolTip("click the row or press Space to use this card for jobs")
                checked = card_id in self._checked
                check.setCheckState(Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked)
            self.setItem(row, 0, check)
            for col in range(1, len(COLUMNS)):
                if col != _COL["Memory"]:
                    self.setItem(row, col, QTableWidgetItem(""))
            index_item = self.item(row, _COL["Card"])
            if index_item is not None:
                # The same color as the card's curves in the history charts (they are the legend).
                index_item.setForeground(QBrush(QColor(COLORS[row % len(COLORS)])))
                font = index_item.font()
                font.setBold(True)
                index_item.setFont(font)
            bar = QProgressBar(self)
            bar.setRange(0, 1000)
            bar.setTextVisible(True)
            self.setCellWidget(row, _COL["Memory"], bar)
            self._bars.append(bar)
        self._fit_pending = True
        # Show every card without scrolling (up to 10 rows); the charts take the rest of the height.
        rows = min(len(samples), 10)
        height = self.horizontalHeader().height() + 2 * self.frameWidth() + 4
        height += sum(self.rowHeight(r) for r in range(rows))
        self.setMinimumHeight(height)
        self.setMaximumHeight(height + 24)  # room for a horizontal scroll bar; the charts get the rest

    def _set(self, row: int, col: str, text: str, tip: str | None = None) -> None:
        item = self.item(row, _COL[col])
        if item is not None and item.text() != text:
            grew = len(text) > len(item.text())
            item.setText(text)
            if tip is not None:
                item.setToolTip(tip)
            if grew and not self._fit_pending and col != "Health":
                width = self.fontMetrics().horizontalAdvance(text) + 16
                column = _COL[col]
                if width > self.columnWidth(column):
                    self.setColumnWidth(column, width)

    def _update_row(self, row: int, s: DeviceSample) -> None:
        # The card's one name leads (its colour is the charts' legend); the index is secondary.
        detail = card_detail(s.module_id, s.index, s.bus_id)
        self._set(row, "Card", "host" if s.kind == "host" else f"■ {sample_name(s)}",
                  tip=None if s.kind == "host" else f"{sample_name(s)}: {detail}")
        self._set(row, "Index", "—" if s.kind == "host" else str(s.index))
        gen = s.generation
        name = s.name or "—"
        self._set(row, "Name", f"{gen} ({name})" if gen else name, tip=f"raw name: {name}")
        self._set(row, "Bus ID", s.bus_id or "—")
        ident = s.uuid or s.serial or "—"
        self._set(row, "UUID / serial", ident, tip=f"uuid: {s.uuid or '—'}\nserial: {s.serial or '—'}")
        self._set(row, "Driver", s.driver_version or "—")
        self._set(row, "Util %", _fmt(s.utilization))
        self._set(row, "Temp °C", _fmt(s.temperature_c))
        power = _fmt(s.power_w) + ("" if s.power_max_w is None else f" / {s.power_max_w:.0f}")
        self._set(row, "Power W", power)
        bar = self._bars[row]
        fraction = s.memory_fraction
        value = 0 if fraction is None else round(fraction * 1000)
        if bar.value() != value:
            bar.setValue(value)
        used = _fmt(s.memory_used_mib)
        total = _fmt(s.memory_total_mib)
        text = f"{used} / {total} MiB"
        if bar.format() != text:
            bar.setFormat(text)
        text, tip, severity = self._health_text(s)
        item = self.item(row, _COL["Health"])
        if item is not None and (item.text() != text or item.toolTip() != tip
                                 or item.data(Qt.ItemDataRole.UserRole) != severity):
            item.setText(text)
            item.setToolTip(tip)
            item.setData(Qt.ItemDataRole.UserRole, severity)
            color = SEVERITY_COLOURS.get(severity)
            brush = QBrush(color) if color is not None else QBrush()
            for col in range(len(COLUMNS)):
                cell = self.item(row, col)
                if cell is not None:
                    cell.setBackground(brush)
            if severity == "ok":
                item.setBackground(QBrush(_FREE))

    def _health_text(self, s: DeviceSample) -> tuple[str, str, str]:
        """(the Health cell's text, its tooltip, its severity: "error"/"warning"/"ok"/"")."""
        # What the samples show now (0 C, hot, implausible values) first: it is the newest word.
        live = card_warnings(s, self.hot_c, self.busy_util, busy=False)
        doctor = self._health.get(selection_id(s)) if s.kind != "host" else None
        parts = list(live)
        severity = "error" if any("initialise" in w or w.startswith("implausible") for w in live) else (
            "warning" if live else "")
        holders = ", ".join(f"pid {p.pid}" + (f" ({p.name})" if p.name else "") for p in s.processes[:3])
        if doctor is not None and doctor.severity != "ok":
            # The doctor's word first; a live warning that says the same (0 C) is not said twice.
            said = doctor.text.lower()
            parts = [doctor.text, *[w for w in live if not ("0 c" in w.lower() and "0 c" in said)]]
            severity = "error" if "error" in (severity, doctor.severity) else "warning"
        elif s.processes:
            parts.append(f"in use by {holders}")
            severity = severity or "warning"
        elif doctor is not None and not parts:
            parts.append(doctor.text)
            severity = "ok"
        text = "; ".join(parts)
        tips = [*live, *((doctor.tip or doctor.text).splitlines() if doctor is not None else [])]
        if s.processes and holders not in " ".join(tips):
            tips.append(f"in use by {holders}")
        if doctor is None and s.kind != "host":
            tips.append("the doctor has not checked this card yet (Health view)")
        # hl-smi's words may look like markup: escaped, in a tooltip that is rich text on purpose.
        tip = "<p>" + "<br>".join(html.escape(t) for t in tips) + "</p>" if tips else ""
        return text, tip, severity

    def _on_item_changed(self, item: QTableWidgetItem) -> None:
        if self._updating or item.column() != 0:
            return
        row = item.row()
        if row >= len(self._ids):
            return
        card_id = self._ids[row]
        if item.checkState() == Qt.CheckState.Checked:
            self._checked.add(card_id)
        else:
            self._checked.discard(card_id)
        self.selection_edited.emit(sorted(self._checked))

    def check_row(self, row: int, checked: bool) -> None:
        """Check or uncheck a row (the same path a click or Space takes)."""
        item = self.item(row, 0)
        if item is not None and row < len(self._checkable) and self._checkable[row]:
            item.setCheckState(Qt.CheckState.Checked if checked else Qt.CheckState.Unchecked)

    def toggle_row(self, row: int) -> None:
        """Flip a card's check (a click on its row, Space on the current row)."""
        item = self.item(row, 0)
        if item is not None:
            self.check_row(row, item.checkState() != Qt.CheckState.Checked)

    def keyPressEvent(self, event: QKeyEvent) -> None:
        if event.key() in (Qt.Key.Key_Space, Qt.Key.Key_Select) and self.currentRow() >= 0:
            self.toggle_row(self.currentRow())
            event.accept()
            return
        super().keyPressEvent(event)

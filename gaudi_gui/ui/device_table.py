"""The table of cards: one row per card, checkboxes for the job selection, warnings highlighted.

A card's check toggles on a click anywhere in its row and on Space (the row with the focus frame);
the table handles both itself, so the check cell is not Qt-user-checkable (Qt would toggle a click
on the box a second time)."""

from __future__ import annotations

from collections.abc import Sequence

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

from gaudi_gui.core.devices import DeviceSample, card_warnings
from gaudi_gui.ui.device_charts import COLORS

COLUMNS = ("Use", "Index", "Module", "Name", "Bus ID", "UUID / serial", "Driver", "Util %", "Memory",
           "Temp °C", "Power W", "Warnings")
_COL = {name: i for i, name in enumerate(COLUMNS)}
_BAD = QColor("#f8d0d0")  # failed to initialise / hot
_BUSY = QColor("#fff1c2")


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
        header.setStretchLastSection(True)
        self._keys: list[str] = []
        self._ids: list[int] = []
        self._bars: list[QProgressBar] = []
        self._checked: set[int] = set()
        self._checkable: list[bool] = []
        self._updating = False
        self._fit_pending = False
        self.hot_c = 85.0
        self.busy_util = 5.0
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

    def update_samples(self, samples: Sequence[DeviceSample]) -> None:
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
                    if col != _COL["Memory"]:
                        self.resizeColumnToContents(col)
                self.setColumnWidth(_COL["Memory"], 190)
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
            index_item = self.item(row, _COL["Index"])
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
            if grew and not self._fit_pending:
                width = self.fontMetrics().horizontalAdvance(text) + 16
                column = _COL[col]
                if width > self.columnWidth(column):
                    self.setColumnWidth(column, width)

    def _update_row(self, row: int, s: DeviceSample) -> None:
        self._set(row, "Index", "host" if s.kind == "host" else f"■ {s.index}")
        self._set(row, "Module", "—" if s.module_id is None else str(s.module_id))
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
        warnings = card_warnings(s, self.hot_c, self.busy_util)
        text = "; ".join(warnings)
        item = self.item(row, _COL["Warnings"])
        if item is not None and item.text() != text:
            item.setText(text)
            item.setToolTip(text)
            color = None
            if any("initialise" in w or w.startswith(("hot", "implausible")) for w in warnings):
                color = _BAD
            elif warnings:
                color = _BUSY
            brush = QBrush(color) if color is not None else QBrush()
            for col in range(len(COLUMNS)):
                cell = self.item(row, col)
                if cell is not None:
                    cell.setBackground(brush)

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

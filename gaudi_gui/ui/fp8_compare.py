"""Compare of FP8 calibrations (Training → Runs: select two or more calibrate runs, Compare): a row per
manifest field, a column per run, the rows where they differ marked (with what the difference means in
their tooltip) and one sentence under the table: interchangeable or not, and why.

It paints what ``core.fp8_compare`` says about the runs' manifests; it starts nothing.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QHeaderView,
    QLabel,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core import fp8_compare as fc

#: The background of a row whose values differ.
DIFFERS = "#fff1c2"


class CalibrationCompare(QWidget):
    """``show_runs([(name, folder), …])`` reads the manifests and shows them."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Compare FP8 calibrations")
        self.table = QTableWidget(0, 0, self)
        self.table.setObjectName("fp8_compare_table")
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setWordWrap(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.verdict = QLabel("", self)
        self.verdict.setObjectName("fp8_compare_verdict")
        self.verdict.setWordWrap(True)
        self.verdict.setTextFormat(Qt.TextFormat.PlainText)
        self.verdict.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.notes = QLabel("", self)
        self.notes.setObjectName("fp8_compare_notes")
        self.notes.setWordWrap(True)
        self.notes.setTextFormat(Qt.TextFormat.PlainText)
        self.notes.setStyleSheet("color: #a33;")
        layout = QVBoxLayout(self)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.verdict)
        layout.addWidget(self.notes)
        #: What is shown (None before the first Compare).
        self.comparison: fc.Comparison | None = None

    def show_runs(self, runs: Sequence[tuple[str, Path]]) -> fc.Comparison:
        comparison = fc.compare(runs)
        self.comparison = comparison
        self.table.clear()
        self.table.setColumnCount(1 + len(comparison.names))
        self.table.setHorizontalHeaderLabels(["", *comparison.names])
        self.table.setRowCount(len(comparison.rows))
        for r, row in enumerate(comparison.rows):
            for c, text in enumerate((row.label, *row.values)):
                item = QTableWidgetItem(text)
                if row.differs:
                    item.setBackground(QColor(DIFFERS))
                    item.setToolTip(row.meaning)
                self.table.setItem(r, c, item)
        self.verdict.setText(comparison.verdict())
        self.notes.setText("\n".join(comparison.notes))
        self.notes.setVisible(bool(comparison.notes))
        return comparison

    def rows(self) -> dict[str, list[str]]:
        """The table as text, by its first column (what a test reads)."""
        def cell(r: int, c: int) -> str:
            item = self.table.item(r, c)
            return item.text() if item is not None else ""
        return {cell(r, 0): [cell(r, c) for c in range(1, self.table.columnCount())]
                for r in range(self.table.rowCount())}


__all__ = ["CalibrationCompare"]

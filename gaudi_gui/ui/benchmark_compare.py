"""Compare of benchmark runs (Training → Runs: select two or more benchmark runs, Compare): one table, a
row per figure (the matmul roofline also per card), a column per run with its median ± spread, and a
column per later run with its ratio to the first run and the benchmark's verdict on it, coloured as the
Benchmark view colours verdicts. The machine (card type and count) is the heading.

It paints what ``core.benchmark_compare`` says about the runs' result.json files; it starts nothing.
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

from gaudi_gui.core import benchmark_compare as bc
from gaudi_gui.ui.benchmark_view import COLOURS


class BenchmarkCompare(QWidget):
    """``show_runs([(name, folder), …])`` reads and shows them; the first run is the reference."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Compare benchmark runs")
        self.heading = QLabel("", self)
        self.heading.setObjectName("benchmark_compare_heading")
        self.heading.setWordWrap(True)
        self.heading.setTextFormat(Qt.TextFormat.PlainText)
        self.heading.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.table = QTableWidget(0, 0, self)
        self.table.setObjectName("benchmark_compare_table")
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setWordWrap(False)
        self.table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.notes = QLabel("", self)
        self.notes.setObjectName("benchmark_compare_notes")
        self.notes.setWordWrap(True)
        self.notes.setTextFormat(Qt.TextFormat.PlainText)
        self.notes.setStyleSheet("color: #a33;")
        layout = QVBoxLayout(self)
        layout.addWidget(self.heading)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.notes)
        #: What is shown (None before the first Compare).
        self.comparison: bc.Comparison | None = None

    def show_runs(self, runs: Sequence[tuple[str, Path]]) -> bc.Comparison:
        """Read the runs' results and show them; the comparison shown is returned."""
        comparison = bc.compare([bc.Compared.read(name, folder) for name, folder in runs])
        self.show_comparison(comparison)
        return comparison

    def show_comparison(self, comparison: bc.Comparison) -> None:
        self.comparison = comparison
        names = comparison.names
        first = names[0] if names else ""
        headers = ["Figure", "Unit", *names, *(f"{name} ÷ first" for name in names[1:])]
        self.table.clear()
        self.table.setColumnCount(len(headers))
        self.table.setHorizontalHeaderLabels(headers)
        for col, name in enumerate(names):
            item = self.table.horizontalHeaderItem(2 + col)
            if item is not None:
                item.setToolTip(f"{name}: the median of its interleaved repeats ± their spread "
                                "(highest − lowest over the median)")
        for col, name in enumerate(names[1:]):
            item = self.table.horizontalHeaderItem(2 + len(names) + col)
            if item is not None:
                item.setToolTip(f"{name}'s median over {first}'s, and the benchmark's verdict against it")
        self.table.setRowCount(len(comparison.rows))
        for r, row in enumerate(comparison.rows):
            label = f"   {row.label}" if row.card else row.label
            cells = [label, row.unit, *(c.text for c in row.cells)]
            for c, text in enumerate(cells):
                item = QTableWidgetItem(text)
                if c >= 2 and row.cells[c - 2].n:
                    item.setToolTip(f"{row.cells[c - 2].n} repeats")
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(r, c, item)
            for k, against in enumerate(row.against):
                item = QTableWidgetItem(against.text)
                item.setToolTip(against.words)
                if against.word in COLOURS:
                    item.setBackground(QColor(COLOURS[against.word]))
                self.table.setItem(r, len(cells) + k, item)
        machine = list(comparison.machine) or ["Machine: not known (no run has a result)"]
        self.heading.setText("\n".join([*machine, f"Each later run against the first, {first}: as expected "
                                        "within 10 %, slower or faster only beyond the spread of the "
                                        "repeats, else cannot say."]))
        self.notes.setText("\n".join(comparison.notes))
        self.notes.setVisible(bool(comparison.notes))

    def cell(self, row: int, col: int) -> str:
        item = self.table.item(row, col)
        return item.text() if item is not None else ""

    def rows(self) -> dict[str, list[str]]:
        """The table as text, by its first column (what a test reads)."""
        return {self.cell(r, 0): [self.cell(r, c) for c in range(1, self.table.columnCount())]
                for r in range(self.table.rowCount())}


__all__ = ["BenchmarkCompare"]

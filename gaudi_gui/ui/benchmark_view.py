"""The Benchmark view (under Devices): run ``gaudi-gui benchmark`` on this machine through its agent and
read the figures with their verdicts against a reference.

It shows what the result record says (core.benchmark): one row per figure (and per card where several
ran), its median and spread over the interleaved repeats, the reference's figure and the verdict,
coloured; a slow card among several is named with the doctor's findings for it. It starts nothing
itself: ``services.benchmark.BenchmarkJob`` asks the agent.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtGui import QColor
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core import benchmark as bm
from gaudi_gui.services.benchmark import BenchmarkJob

COLUMNS = ("Figure", "Unit", "Median", "Spread", "Reference", "Verdict")
#: Verdict cell colours (background), by the verdict's word.
COLOURS = {"as expected": "#e3f4e1", "faster": "#e3f4e1", "slower": "#fbe3e1", "cannot say": "#f1f1f1"}


def _num(value: Any) -> str:
    return f"{value:.4g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else "–"


class BenchmarkView(QWidget):
    def __init__(self, job: BenchmarkJob, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.job = job
        self.size_combo = QComboBox(self)
        self.size_combo.setObjectName("benchmark_size")
        for name in ("standard", "tiny"):
            self.size_combo.addItem(name, name)
        self.size_combo.setToolTip("the workloads' fixed sizes (figures of different sizes are never "
                                   "compared)")
        self.repeats = QSpinBox(self)
        self.repeats.setObjectName("benchmark_repeats")
        self.repeats.setRange(1, 100)
        self.repeats.setValue(3)
        self.repeats.setToolTip("interleaved repeats of every workload; a verdict needs 2 or more")
        self.cards = QLineEdit(self)
        self.cards.setObjectName("benchmark_cards")
        self.cards.setPlaceholderText("card 0 (e.g. 0,1,2,3: one worker per card and an all-reduce)")
        self.reference = QLineEdit(self)
        self.reference.setObjectName("benchmark_reference")
        self.reference.setPlaceholderText("none: a previous benchmark run (its folder or name) or a table")
        browse = QPushButton("Browse…", self)
        browse.clicked.connect(lambda: self._browse())  # noqa: PLW0108
        reference_row = QHBoxLayout()
        reference_row.addWidget(self.reference, 1)
        reference_row.addWidget(browse)
        self.run_button = QPushButton("&Run benchmark", self)
        self.run_button.setObjectName("benchmark_run")
        self.run_button.clicked.connect(lambda: self.start())  # noqa: PLW0108
        self.stop_button = QPushButton("Stop", self)
        self.stop_button.setObjectName("benchmark_stop")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(lambda: self.job.stop())  # noqa: PLW0108
        self.status = QLabel("Not run yet: the figures of this machine, judged against a reference.", self)
        self.status.setObjectName("benchmark_status")
        self.status.setWordWrap(True)
        self.status.setTextFormat(Qt.TextFormat.PlainText)
        self.machine = QLabel("", self)
        self.machine.setWordWrap(True)
        self.machine.setTextFormat(Qt.TextFormat.PlainText)
        self.machine.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.table = QTableWidget(0, len(COLUMNS), self)
        self.table.setObjectName("benchmark_table")
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        header.setStretchLastSection(True)
        self.slow = QLabel("", self)
        self.slow.setObjectName("benchmark_slow")
        self.slow.setWordWrap(True)
        self.slow.setTextFormat(Qt.TextFormat.PlainText)
        self.slow.setStyleSheet("color: #a33;")
        self.notes = QLabel("", self)
        self.notes.setWordWrap(True)
        self.notes.setTextFormat(Qt.TextFormat.PlainText)
        self.notes.setStyleSheet("color: #666;")

        title = QLabel("Benchmark of this machine: matmul roofline per card, host-device copy, all-reduce, "
                       "decode and a training step of the bench model", self)
        title.setWordWrap(True)
        title.setStyleSheet("font-weight: bold;")
        form = QFormLayout()
        form.addRow("Size", self.size_combo)
        form.addRow("Repeats", self.repeats)
        form.addRow("Cards", self.cards)
        form.addRow("Reference", reference_row)
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        layout = QVBoxLayout(self)
        layout.addWidget(title)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        layout.addWidget(self.machine)
        layout.addWidget(self.table, 1)
        layout.addWidget(self.slow)
        layout.addWidget(self.notes)

        job.started.connect(self._on_started)
        job.progress_changed.connect(self._on_progress)
        job.result_received.connect(self.show_result)
        job.finished.connect(self._on_finished)
        job.refused.connect(self._on_refused)

    def show_latest(self, runs_root: Path) -> bool:
        """The newest benchmark of the runs store, as it was judged (False: none yet)."""
        found = bm.latest_result(runs_root)
        if found is None:
            return False
        self.show_result(found[1])
        self.status.setText(f"Last benchmark: {found[0]}")
        return True

    def words(self) -> list[str]:
        """The command's words for what the fields say."""
        words = ["--size", str(self.size_combo.currentData()), "--repeats", str(self.repeats.value())]
        if self.cards.text().strip():
            words += ["--cards", self.cards.text().strip()]
        if self.reference.text().strip():
            words += ["--reference", self.reference.text().strip()]
        return words

    def start(self) -> None:
        self.run_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.status.setStyleSheet("")
        self.status.setText("Starting the benchmark…")
        self.job.start(self.words())

    def _browse(self) -> None:
        path, _filter = QFileDialog.getOpenFileName(self, "Reference: a benchmark result or a table", "",
                                                    "JSON (*.json);;All files (*)")
        if path:
            self.reference.setText(path)

    def _on_started(self, folder: str) -> None:
        self.status.setText(f"Running: {folder}")

    def _on_progress(self, done: int, total: int) -> None:
        self.status.setText(f"Running: {done} of {total} samples measured ({self.job.folder})")

    def _on_refused(self, words: str) -> None:
        self._idle()
        self.status.setStyleSheet("color: #a33;")
        self.status.setText(words)

    def _on_finished(self, state: str, summary: str) -> None:
        self._idle()
        if state != "finished":
            self.status.setStyleSheet("color: #a33;")
        self.status.setText(f"{summary} — {self.job.folder}")

    def _idle(self) -> None:
        self.run_button.setEnabled(True)
        self.stop_button.setEnabled(False)

    def show_result(self, record: dict[str, Any]) -> None:
        """Fill the table with ``record``'s figures and verdicts (core.benchmark's result)."""
        figures = record.get("figures") or {}
        ref = (record.get("reference") or {}).get("figures") or {}
        said = {(v.get("figure"), v.get("card", "")): v for v in record.get("verdicts") or []}
        rows: list[tuple[list[str], dict[str, Any]]] = []
        for key, fig in bm.ordered(figures):
            rows.append(([str(fig.get("text") or key), str(fig.get("unit") or ""), _num(fig.get("median")),
                          f"{(fig.get('spread') or 0) * 100:.0f} %",
                          _num((ref.get(key) or {}).get("median")) if ref.get(key) else "–"],
                         said.get((key, ""), {})))
            cards = fig.get("cards") or {}
            if len(cards) > 1:
                for card, values in cards.items():
                    f = bm.Figure(key, [float(v) for v in values])
                    noun = bm.card_noun(record.get("identity") or {})
                    rows.append(([f"   {noun} {card}", "", _num(f.median), f"{f.spread * 100:.0f} %", ""],
                                 said.get((key, card), {})))
        self.table.setRowCount(len(rows))
        for row, (cells, verdict) in enumerate(rows):
            for col, text in enumerate([*cells, str(verdict.get("words") or "no reference")]):
                item = QTableWidgetItem(text)
                if col == len(COLUMNS) - 1 and verdict.get("verdict") in COLOURS:
                    item.setBackground(QColor(COLOURS[str(verdict["verdict"])]))
                self.table.setItem(row, col, item)
        # As tall as its rows (a benchmark has at most a few dozen): the Devices tab scrolls, not the table.
        height = self.table.horizontalHeader().height() + 2 * self.table.frameWidth() + sum(
            self.table.rowHeight(r) for r in range(self.table.rowCount()))
        self.table.setMinimumHeight(min(height + 2, 900))
        reference = record.get("reference")
        self.machine.setText(f"Machine: {bm.identity_text(record.get('identity') or {})}; size "
                             f"{record.get('size')}, {record.get('repeats')} interleaved repeats"
                             + (f"\nReference: {reference.get('label')}" if reference else ""))
        slow = []
        for card in record.get("slow_cards") or []:
            slow.append(f"Slow card: {card.get('words')}")
            slow += [f"   doctor: {f}" for f in card.get("findings") or []] or ["   doctor: nothing found"]
        self.slow.setText("\n".join(slow))
        self.slow.setVisible(bool(slow))
        self.notes.setText("\n".join(f"Note: {n}" for n in record.get("notes") or []))

    def shutdown(self) -> None:
        self.job.shutdown()


__all__ = ["BenchmarkView"]

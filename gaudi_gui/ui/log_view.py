"""A live log: batched appends (thousands of lines/s without stalling), bounded memory, search, a
per-rank filter and, for a run on several hosts, a host filter (lines start ``host| ``). tqdm's ``\\r``
rewrites arrive separately and show in one status line."""

from __future__ import annotations

import re
from collections import deque

from PySide6.QtCore import QTimer
from PySide6.QtGui import QFont, QTextCursor, QTextDocument
from PySide6.QtWidgets import (
    QComboBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSizePolicy,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core import textclean

MAX_LINES = 20000
_RANK = re.compile(r"\[rank ?(\d+)")


def line_rank(line: str) -> int | None:
    match = _RANK.search(line)
    return int(match.group(1)) if match else None


class LogView(QWidget):
    def __init__(self, parent: QWidget | None = None, max_lines: int = MAX_LINES) -> None:
        super().__init__(parent)
        self._lines: deque[tuple[int | None, str | None, str]] = deque(maxlen=max_lines)
        self._pending: list[tuple[int | None, str | None, str]] = []
        self._rank_filter: int | None = None
        self._sources: list[str] = []
        self._source_filter: str | None = None
        self.text = QPlainTextEdit(self)
        self.text.setReadOnly(True)
        self.text.setMaximumBlockCount(max_lines)
        self.text.setLineWrapMode(QPlainTextEdit.LineWrapMode.NoWrap)
        self.text.setFont(QFont("monospace", 9))
        self.search = QLineEdit(self)
        self.search.setPlaceholderText("search the log (Enter: next)")
        self.search.returnPressed.connect(self.find_next)
        self.rank = QComboBox(self)
        self.rank.addItem("all ranks", None)
        self.rank.currentIndexChanged.connect(self._on_rank_changed)
        # Shown only for a run on several hosts (set_sources).
        self.source = QComboBox(self)
        self.source.setToolTip("show the lines of one host only")
        self.source.addItem("all hosts", None)
        self.source.setVisible(False)
        self.source.currentIndexChanged.connect(self._on_rank_changed)
        self.progress = QLabel(self)
        self.progress.setObjectName("progressLine")
        # A long tqdm line must not widen the whole window.
        self.progress.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        clear = QPushButton("Clear", self)
        clear.clicked.connect(self.clear)
        bar = QHBoxLayout()
        bar.addWidget(self.search, 1)
        bar.addWidget(self.source)
        bar.addWidget(self.rank)
        bar.addWidget(clear)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(bar)
        layout.addWidget(self.text, 1)
        layout.addWidget(self.progress)
        # Appending line by line at 5,000 lines/s would repaint 5,000 times; flush every 50 ms instead.
        self._flush = QTimer(self)
        self._flush.setInterval(50)
        self._flush.timeout.connect(self.flush)
        self._flush.start()
        self._ranks: set[int] = set()

    def set_sources(self, names: list[str]) -> None:
        """The hosts whose lines come prefixed ``name| `` (none: no host filter shown)."""
        if names == self._sources:
            return
        self._sources = list(names)
        self.source.blockSignals(True)
        self.source.clear()
        self.source.addItem("all hosts", None)
        for name in names:
            self.source.addItem(name, name)
        self.source.blockSignals(False)
        self.source.setVisible(bool(names))
        self._on_rank_changed()

    def _source_of(self, line: str) -> str | None:
        head = line.split("| ", 1)[0] if "| " in line else ""
        return head if head and head in self._sources else None

    def append_line(self, line: str) -> None:
        line = textclean.clean(line)  # tqdm's cursor-up, colours: shown as boxes and "[A" otherwise
        rank = line_rank(line)
        self._pending.append((rank, self._source_of(line), line))
        if rank is not None and rank not in self._ranks:
            self._ranks.add(rank)
            self.rank.addItem(f"rank {rank}", rank)

    def append_lines(self, lines: list[str]) -> None:
        for line in lines:
            self.append_line(line)

    def set_progress(self, text: str) -> None:
        self.progress.setText(textclean.clean(text).strip()[:300])

    def flush(self) -> None:
        if not self._pending:
            return
        batch, self._pending = self._pending, []
        self._lines.extend(batch)
        shown = [line for rank, source, line in batch if self._keep(rank, source)]
        if shown:
            bar = self.text.verticalScrollBar()
            at_end = bar.value() >= bar.maximum() - 2
            self.text.appendPlainText("\n".join(shown))
            if at_end:
                bar.setValue(bar.maximum())

    def _keep(self, rank: int | None, source: str | None = None) -> bool:
        # A line of no host (the app's own) is shown under every host's filter.
        if self._source_filter is not None and source is not None and source != self._source_filter:
            return False
        return self._rank_filter is None or rank is None or rank == self._rank_filter

    def _on_rank_changed(self) -> None:
        self._rank_filter = self.rank.currentData()
        self._source_filter = self.source.currentData()
        self.flush()
        self.text.setPlainText("\n".join(line for rank, source, line in self._lines
                                         if self._keep(rank, source)))
        self.text.verticalScrollBar().setValue(self.text.verticalScrollBar().maximum())

    def find_next(self) -> bool:
        needle = self.search.text()
        if not needle:
            return False
        if self.text.find(needle):
            return True
        self.text.moveCursor(QTextCursor.MoveOperation.Start)
        return self.text.find(needle, QTextDocument.FindFlag(0))

    def line_count(self) -> int:
        return len(self._lines) + len(self._pending)

    def plain_text(self) -> str:
        self.flush()
        return self.text.toPlainText()

    def clear(self) -> None:
        self._lines.clear()
        self._pending.clear()
        self.text.clear()
        self.progress.clear()

    def shutdown(self) -> None:
        self._flush.stop()

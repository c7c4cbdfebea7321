"""Plots that stay readable in a small window (1024x700 included).

Two parts, used by the Training tab's curves and the Devices tab's history:

* ``ReadableAxis``: a pyqtgraph axis whose tick labels never overlap. pyqtgraph always draws the
  labels of the major tick level, however short the axis, so a 15 px tall chart printed "60" over "40".
  Here only the major level carries text, and its spacing is widened (1, 2, 5, 10 ...) until every
  label has room: its height on a vertical axis, its width on a horizontal one, plus a gap.
* ``PlotArea``: lays out its plots in a grid when every one fits at a readable size (``min_cell``:
  a view box of at least ``MIN_VIEW_PX`` plus title and axes), and otherwise puts the ones that do not
  fit on the tabs of the last cell, never shrinking a plot to a strip. The choice is made again on
  every resize; the widget's own size hints are constant so that re-arranging never changes the size
  it is given (no resize loop).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QSize
from PySide6.QtGui import QFont, QFontMetricsF, QResizeEvent
from PySide6.QtWidgets import QGridLayout, QTabWidget, QWidget

#: The smallest view box height (px) a plot is shown with outside the tabs.
MIN_VIEW_PX = 80
#: Free pixels between two neighbouring tick labels.
LABEL_GAP_PX = 8
#: The height of a pyqtgraph plot's title row.
TITLE_ROW_PX = 30


def _next_nice(spacing: float) -> float:
    """The next spacing of the 1, 2, 5, 10 ... series above ``spacing``."""
    exponent = math.floor(math.log10(spacing))
    unit = 10.0 ** exponent
    mantissa = spacing / unit
    for step in (2.0, 5.0, 10.0):
        if mantissa < step * 0.999:
            return step * unit
    return 20.0 * unit


class ReadableAxis(pg.AxisItem):
    """An axis whose major tick labels never overlap (see the module's docstring)."""

    def __init__(self, orientation: str, **kwargs: Any) -> None:
        super().__init__(orientation, **kwargs)
        # Text on the major level only: pyqtgraph's fill limits for the lower levels let labels touch.
        self.setStyle(maxTextLevel=0)

    def _label_room(self, low: float, high: float, spacing: float) -> float:
        """Pixels one major tick needs so that its label does not reach the next one."""
        font = self.style["tickFont"] or QFont()
        metrics = QFontMetricsF(font)
        if self.orientation in ("left", "right"):
            return metrics.height() + LABEL_GAP_PX / 2
        first = math.ceil(low / spacing) * spacing
        count = min(int((high - first) / spacing) + 1, 50)
        values = list(np.arange(max(count, 1)) * spacing + first)
        scale = self.scale or 1.0
        strings = self.tickStrings([v / scale for v in values], self.autoSIPrefixScale * scale,
                                   spacing / scale)
        widest = max((metrics.horizontalAdvance(s) for s in strings if s), default=0.0)
        return widest + LABEL_GAP_PX

    def tickSpacing(self, minVal: float, maxVal: float, size: float) -> list[tuple[float, float]]:
        levels: list[tuple[float, float]] = super().tickSpacing(minVal, maxVal, size)
        span = abs(maxVal - minVal)
        if not levels or size <= 0 or span == 0 or not math.isfinite(span):
            return levels
        low, high = sorted((minVal, maxVal))
        major = float(levels[0][0])
        widened = False
        for _ in range(40):  # 40 steps of 1-2-5 are 13 decades: far more than any axis needs
            if major * size / span >= self._label_room(low, high, major):
                break
            major = _next_nice(major)
            widened = True
        # A wider major spacing keeps no minor level: its ticks would no longer divide the major ones.
        return [(major, 0.0)] if widened else levels


def readable_plot(parent: QWidget, title: str) -> pg.PlotWidget:
    """A white PlotWidget with readable axes (left, bottom, right) and a small title."""
    axes = {name: ReadableAxis(name) for name in ("left", "bottom", "right")}
    plot = pg.PlotWidget(parent, background="w", axisItems=axes)
    plot.hideAxis("right")  # given axes are shown: the right one is for a second scale only
    plot.setTitle(title, color="k", size="9pt")
    plot.showGrid(x=True, y=True, alpha=0.3)
    return plot


def _hide_title(plot: pg.PlotWidget) -> None:
    """No title row. pyqtgraph's ``setTitle(None)`` hides the row but keeps its text, whose width stays
    the plot's least width: a hidden "reward accuracy (chosen > rejected)" drew a 160 px plot 230 px
    wide, its right part cut off."""
    plot.setTitle(None)
    plot.getPlotItem().titleLabel.setText("")


class PlotArea(QWidget):
    """Plots in a grid of readable cells; those that do not fit share the tabs of the last cell.

    ``columns`` are the column counts tried (a time series wants a wide cell; the Training tab's
    step-linked curves stay in one column). Among the grids that show the most plots outside tabs, the
    one whose cells are the most above ``min_cell`` (the worse of width and height) is chosen."""

    def __init__(self, min_cell: QSize, columns: Sequence[int] = (1,), parent: QWidget | None = None,
                 title_on_axis: bool = False) -> None:
        super().__init__(parent)
        self.min_cell = QSize(min_cell)
        self.columns = tuple(columns)
        # The name as the left axis label instead of a title row: pyqtgraph's title row is 30 px high,
        # which a column of three curves cannot spare.
        self.title_on_axis = title_on_axis
        self._plots: list[tuple[pg.PlotWidget, str]] = []
        self._shown: set[int] = set()
        self._grid = QGridLayout(self)
        self._grid.setContentsMargins(0, 0, 0, 0)
        self._grid.setSpacing(4)
        self.tabs = QTabWidget(self)
        self.tabs.setDocumentMode(True)
        self.tabs.hide()
        # The tab a person picked stays picked across re-arrangements; otherwise the first one shows.
        self._picked: pg.PlotWidget | None = None
        self.tabs.tabBarClicked.connect(self._on_tab_clicked)
        self._arrangement: tuple[tuple[int, ...], int, int] | None = None
        # Room for one readable plot under the tab bar: the smallest this area is ever made.
        self.setMinimumSize(self.min_cell.width(), self._tab_cell_height())

    def _tab_bar_height(self) -> int:
        return max(self.tabs.tabBar().sizeHint().height(), 24) + 2

    def _title_height(self) -> int:
        """The title row a plot drops on a tab (pyqtgraph's is 30 px)."""
        return 0 if self.title_on_axis else TITLE_ROW_PX

    def _tab_cell_height(self) -> int:
        """The least height of the cell holding the tabs: the bar and one plot without its title."""
        return self.min_cell.height() - self._title_height() + self._tab_bar_height()

    def sizeHint(self) -> QSize:
        # Constant: a hint that followed the arrangement would make the parent resize us, and loop.
        return QSize(self.min_cell.width() * 2, self.min_cell.height() * 4)

    def minimumSizeHint(self) -> QSize:
        return self.minimumSize()

    def add_plot(self, plot: pg.PlotWidget, title: str, axis_label: str | None = None) -> None:
        """Add ``plot`` named ``title`` (its title row or tab); ``axis_label`` is a shorter name for
        the left axis when ``title_on_axis`` (a vertical label longer than the view box is cut)."""
        self._plots.append((plot, title))
        if self.title_on_axis:
            _hide_title(plot)
            plot.setLabel("left", axis_label or title)
        self._shown.add(len(self._plots) - 1)
        self._arrangement = None
        self.arrange()

    def set_shown(self, plot: pg.PlotWidget, shown: bool) -> None:
        index = next(i for i, (p, _t) in enumerate(self._plots) if p is plot)
        if (index in self._shown) == shown:
            return
        if shown:
            self._shown.add(index)
        else:
            self._shown.discard(index)
        self.arrange()

    def shown_plots(self) -> list[pg.PlotWidget]:
        """The plots that are shown, in a cell or on a tab (in the order they were added)."""
        return [p for i, (p, _t) in enumerate(self._plots) if i in self._shown]

    def is_shown(self, plot: pg.PlotWidget) -> bool:
        return plot in self.shown_plots()

    def _on_tab_clicked(self, index: int) -> None:
        widget = self.tabs.widget(index)
        if isinstance(widget, pg.PlotWidget):
            self._picked = widget

    def _choose(self, count: int, width: int, height: int) -> tuple[int, int]:
        """(columns, cells) of the best grid for ``count`` plots in ``width`` x ``height``."""
        best: tuple[int, float, int, int] = (1, 0.0, 1, 1)  # (cells, readability, columns, cells)
        cell_w, cell_h = max(self.min_cell.width(), 1), max(self.min_cell.height(), 1)
        gap = self._grid.spacing()
        tab_h = self._tab_cell_height() - cell_h  # what the cell of the tabs needs more than the others

        def fits(rows: int, tabs: bool) -> bool:
            # Each plot is at least cell_h high (its minimum); the row of the tabs also holds the bar.
            return rows * cell_h + (rows - 1) * gap + (tab_h if tabs else 0) <= height

        for columns in self.columns:
            if columns > count or columns * cell_w + (columns - 1) * gap > width:
                continue
            rows = math.ceil(count / columns)
            while rows > 0 and not fits(rows, rows * columns < count):
                rows -= 1
            if rows < 1:
                continue
            cells = min(count, rows * columns)
            free_h = height - (tab_h if cells < count else 0)
            readability = min(width / columns / cell_w, free_h / rows / cell_h)
            if (cells, readability) > best[:2]:
                best = (cells, readability, columns, cells)
        return best[2], best[3]

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self.arrange()

    def arrange(self) -> None:
        shown = [i for i in range(len(self._plots)) if i in self._shown]
        columns, cells = self._choose(len(shown), self.width(), self.height())
        arrangement = (tuple(shown), columns, cells)
        if arrangement == self._arrangement:
            return
        self._arrangement = arrangement
        while self.tabs.count():
            self.tabs.removeTab(0)
        for plot, _title in self._plots:
            self._grid.removeWidget(plot)
        self._grid.removeWidget(self.tabs)
        for r in range(self._grid.rowCount()):
            self._grid.setRowStretch(r, 0)
        for c in range(self._grid.columnCount()):
            self._grid.setColumnStretch(c, 0)
        singles, tabbed = shown[:cells - 1], shown[cells - 1:]
        if len(tabbed) == 1:
            singles, tabbed = shown, []
        places = [*singles, -1] if tabbed else singles
        for n, index in enumerate(places):
            row, col = divmod(n, columns)
            self._grid.setRowStretch(row, 1)
            self._grid.setColumnStretch(col, 1)
            widget = self.tabs if index < 0 else self._plots[index][0]
            self._grid.addWidget(widget, row, col)
        for index, (plot, title) in enumerate(self._plots):
            if index in tabbed:
                self.tabs.addTab(plot, title)  # the tab widget shows the current one only
                if not self.title_on_axis:
                    _hide_title(plot)  # the tab says it
                continue
            if not self.title_on_axis:
                plot.setTitle(title, color="k", size="9pt")
            # A plot taken off a tab was hidden by the tab widget: show it again where it belongs.
            plot.setVisible(index in self._shown)
        for index, (plot, _title) in enumerate(self._plots):
            # The grid gives each cell at least this; the row of the tabs gets the bar on top.
            plot.setMinimumHeight(self.min_cell.height() - (self._title_height() if index in tabbed else 0))
        self.tabs.setVisible(bool(tabbed))
        if self._picked is not None and self.tabs.indexOf(self._picked) >= 0:
            self.tabs.setCurrentWidget(self._picked)
        elif self.tabs.count():
            self.tabs.setCurrentIndex(0)

"""History charts of the cards (utilization, memory, power, temperature) over a selectable window.

Curves are created once per card and updated with ``setData``: no new plot items per tick, so an hour
at 8 cards x 1 Hz stays smooth. The x axis is seconds relative to now; it spans the data there is
(at least ``MIN_SPAN_S``) and grows with it until the chosen window is full, so the first seconds of a
session fill the chart instead of sitting at the right edge of five empty minutes.

The four charts sit in a 2 x 2 grid, a row of four, or (a small window) share tabs: never a strip
(see ``plot_area``).

Y ranges are fixed where a scale is known (utilization 0..100 %, memory 0..the largest card's total)
so a flat line stays flat instead of being autoscaled into noise; without a known total the memory
axis keeps a minimum span. Charts of metrics no shown device reports (the host has no power or
temperature reading) are hidden with ``set_metrics``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

import numpy as np
import pyqtgraph as pg
from PySide6.QtCore import QSize
from PySide6.QtWidgets import QGraphicsItem, QVBoxLayout, QWidget

from gaudi_gui.core.devices import History
from gaudi_gui.ui.plot_area import MIN_VIEW_PX, PlotArea, readable_plot

#: (metric, title, unit)
CHARTS = (("utilization", "utilization", "%"), ("memory_used_mib", "memory used", "MiB"),
          ("power_w", "power", "W"), ("temperature_c", "temperature", "°C"))
#: The smallest memory span (MiB) shown when no card total is known.
MIN_MEMORY_SPAN_MIB = 1024.0
#: The shortest time span (s) shown, while the history is younger than that.
MIN_SPAN_S = 5.0
#: How far before the window the history is read (s), to tell a full window from young data.
LOOK_BEHIND_S = 10.0
#: A chart keeps its time span while the data's age is within this share of it: a span moved by each
#: new sample (the oldest one leaving a full history at 10 Hz) made every curve be cut and thinned
#: again and the axis be drawn again on each redraw, for a change of less than a pixel.
SPAN_SLACK = 0.02
#: A chart's cell: a readable view box plus the title row (30 px), the tick labels and the axis label.
MIN_CELL = QSize(200, MIN_VIEW_PX + 80)
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
          "#7f7f7f", "#bcbd22")


class DeviceCharts(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        # Wide cells first (time series): 2 x 2, a row of four, else a column; the rest on tabs.
        self.area = PlotArea(MIN_CELL, (2, 4, 1), self)
        layout.addWidget(self.area)
        self.plots: dict[str, pg.PlotWidget] = {}
        for metric, title, unit in CHARTS:
            plot = readable_plot(self, f"{title} ({unit})")
            # Major grid lines only: the minor ones cost ~8 ms of painting per plot, the curves ~1 ms.
            for axis in ("left", "bottom"):
                item = plot.getPlotItem().getAxis(axis)
                item.setStyle(maxTickLevel=0)
                # The axes and their grid change only with the range or the size, not with the data: kept
                # as a pixmap, a redraw of new curves blits them instead of replaying their tick labels
                # and lines (~2 of a chart's ~8 ms; the same pixels, compared).
                item.setCacheMode(QGraphicsItem.CacheMode.DeviceCoordinateCache)
            plot.setLabel("bottom", "seconds ago")
            plot.setMouseEnabled(x=False, y=False)
            plot.hideButtons()
            # An hour of 1 Hz points per card is far more than the plot's pixels: draw peaks per pixel
            # and only what is in view, which keeps a redraw of 32 curves to a few milliseconds.
            plot.setDownsampling(auto=True, mode="peak")
            plot.setClipToView(True)
            if metric == "utilization":
                plot.setYRange(0, 100, padding=0.02)
            elif metric == "memory_used_mib":
                plot.setYRange(0, MIN_MEMORY_SPAN_MIB, padding=0.02)
            # No legend over the curves: the card table's Index column shows each card's color.
            self.plots[metric] = plot
            self.area.add_plot(plot, f"{title} ({unit})")
        self._curves: dict[tuple[str, str], pg.PlotDataItem] = {}
        self._keys: list[str] = []
        #: When each chart was last redrawn (``time.monotonic``), for ``due``.
        self._drawn: dict[str, float] = {}
        self.window_s = 300.0
        self.span_s = MIN_SPAN_S  # the x range shown: the data's age, up to window_s
        #: Each chart's x span as last set (``SPAN_SLACK``).
        self._spans: dict[str, float] = {}
        self.memory_total_mib: float | None = None

    def set_metrics(self, metrics: Sequence[str]) -> None:
        """Show only the charts of ``metrics`` (the others have nothing to draw)."""
        for metric, plot in self.plots.items():
            self.area.set_shown(plot, metric in metrics)

    def visible_metrics(self) -> list[str]:
        """The metrics whose chart is shown (in a cell or on a tab)."""
        return [m for m, plot in self.plots.items() if self.area.is_shown(plot)]

    def set_memory_total(self, total_mib: float | None) -> None:
        """The memory axis spans 0..``total_mib`` (the largest card's memory), when known."""
        if total_mib is not None and total_mib > 0:
            if total_mib != self.memory_total_mib:
                self.memory_total_mib = float(total_mib)
                self.plots["memory_used_mib"].setYRange(0, self.memory_total_mib, padding=0.02)
        else:
            self.memory_total_mib = None

    def set_window(self, seconds: float) -> None:
        self.window_s = float(seconds)
        for metric, plot in self.plots.items():
            self._spans[metric] = min(self.span_s, self.window_s)
            plot.setXRange(-self._spans[metric], 0, padding=0)

    @staticmethod
    def color(position: int) -> str:
        """The curve color of the card at ``position`` in the key order (the table's row)."""
        return COLORS[position % len(COLORS)]

    def due(self, metric: str, shortest_s: float) -> bool:
        """Whether ``metric``'s chart has anything new to show: its curves move one pixel every
        ``span_s / width`` seconds (an hour across 650 px: 5.5 s), and a redraw sooner than that (and
        than ``shortest_s``) repaints the same pixels. Painting 8 curves of an hour is the largest work
        of the window's thread here (10-40 ms on a loaded 2-core machine); at 2 Hz per chart it was
        a stall every half second, now one every few seconds for long windows. The 5-minute default
        (0.46 s per pixel) is still redrawn every ``shortest_s``."""
        last = self._drawn.get(metric)
        if last is None:
            return True
        width = self.plots[metric].getPlotItem().getViewBox().width()
        per_pixel = self.span_s / width if width > 0 else 0.0
        return time.monotonic() - last >= max(shortest_s, per_pixel)

    def refresh(self, history: History, keys: Sequence[str], now: float | None = None,
                metrics: Sequence[str] | None = None) -> None:
        """Redraw the curves of ``metrics`` (default: all) from ``history`` (only the window shown).

        The tab refreshes one chart per timer tick so that no single event-loop turn has to repaint
        all four plots."""
        now = time.time() if now is None else now
        since = now - self.window_s
        if list(keys) != self._keys:
            self._set_keys(history, keys)
        for metric in metrics or [c[0] for c in CHARTS]:
            self._drawn[metric] = time.monotonic()
            low, high = np.inf, -np.inf
            first = now
            for key in self._keys:
                # A little before the window too: a point older than the window means it is full.
                t, v = history.series(key, metric, since - LOOK_BEHIND_S)
                curve = self._curves[(metric, key)]
                if len(t) == 0:
                    curve.setData([], [])
                    continue
                first = min(first, float(t[0]))
                curve.setData(t - now, v, connect="finite")
                finite = v[np.isfinite(v)]
                if len(finite):
                    low, high = min(low, float(finite.min())), max(high, float(finite.max()))
            # The data's age, not the whole window: 10 s of samples fill the chart, not its last 3 %.
            self.span_s = min(self.window_s, max(now - first, MIN_SPAN_S))
            shown = self._spans.get(metric, 0.0)
            if self.span_s == self.window_s or abs(self.span_s - shown) > SPAN_SLACK * shown:
                self._spans[metric] = self.span_s
                self.plots[metric].setXRange(-self.span_s, 0, padding=0)
            if metric == "memory_used_mib" and self.memory_total_mib is None and np.isfinite(low):
                self._min_span(metric, low, high, MIN_MEMORY_SPAN_MIB)

    def _min_span(self, metric: str, low: float, high: float, span: float) -> None:
        # Autoscaling a nearly flat line would magnify jitter of a few MiB to the full height.
        if high - low >= span:
            self.plots[metric].enableAutoRange(axis="y")
            return
        middle = (low + high) / 2
        bottom = max(0.0, middle - span / 2)
        self.plots[metric].setYRange(bottom, bottom + span, padding=0.02)

    def _set_keys(self, history: History, keys: Sequence[str]) -> None:
        # Only when the set of cards changes (start-up, fallback): drop and recreate the curves.
        for (metric, _key), curve in self._curves.items():
            self.plots[metric].removeItem(curve)
        self._curves.clear()
        self._keys = list(keys)
        for i, key in enumerate(self._keys):
            pen = pg.mkPen(COLORS[i % len(COLORS)], width=1)  # width 1: Qt's fast path
            for metric, _title, _unit in CHARTS:
                # Not antialiased whatever pyqtgraph's global option (the loss chart turns it on for
                # the whole process): a 1 px line of an hour's peaks costs several times more so.
                # No dynamic range limit (pyqtgraph clips values far outside the view for Qt's sake;
                # a card's readings never are): with one, each change of an autoranged y axis threw
                # away the downsampled curves and made them again.
                curve = self.plots[metric].plot(np.empty(0), np.empty(0), pen=pen, antialias=False,
                                                dynamicRangeLimit=None)
                self._curves[(metric, key)] = curve

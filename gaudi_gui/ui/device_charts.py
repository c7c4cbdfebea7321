"""History charts of the cards (utilization, memory, power, temperature) over a selectable window.

Curves are created once per card and updated with ``setData``: no new plot items per tick, so an hour
at 8 cards x 1 Hz stays smooth. The x axis is seconds relative to now.

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
from PySide6.QtWidgets import QGridLayout, QWidget

from gaudi_gui.core.devices import History

#: (metric, title, unit)
CHARTS = (("utilization", "utilization", "%"), ("memory_used_mib", "memory used", "MiB"),
          ("power_w", "power", "W"), ("temperature_c", "temperature", "°C"))
#: The smallest memory span (MiB) shown when no card total is known.
MIN_MEMORY_SPAN_MIB = 1024.0
COLORS = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
          "#7f7f7f", "#bcbd22")


class DeviceCharts(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        layout = QGridLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.plots: dict[str, pg.PlotWidget] = {}
        for i, (metric, title, unit) in enumerate(CHARTS):
            plot = pg.PlotWidget(self, background="w")
            plot.setTitle(f"{title} ({unit})", color="k", size="9pt")
            plot.showGrid(x=True, y=True, alpha=0.3)
            # Major grid lines only: the minor ones cost ~8 ms of painting per plot, the curves ~1 ms.
            for axis in ("left", "bottom"):
                plot.getPlotItem().getAxis(axis).setStyle(maxTickLevel=0)
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
            layout.addWidget(plot, i // 2, i % 2)
        self._curves: dict[tuple[str, str], pg.PlotDataItem] = {}
        self._keys: list[str] = []
        self.window_s = 300.0
        self.memory_total_mib: float | None = None

    def set_metrics(self, metrics: Sequence[str]) -> None:
        """Show only the charts of ``metrics`` (the others have nothing to draw)."""
        for metric, plot in self.plots.items():
            plot.setVisible(metric in metrics)

    def visible_metrics(self) -> list[str]:
        return [m for m, plot in self.plots.items() if not plot.isHidden()]

    def set_memory_total(self, total_mib: float | None) -> None:
        """The memory axis spans 0..``total_mib`` (the largest card's memory), when known."""
        if total_mib is not None and total_mib > 0:
            if total_mib != self.memory_total_mib:
                self.memory_total_mib = float(total_mib)
                self.plots["memory_used_mib"].setYRange(0, self.memory_total_mib, padding=0.02)
        else:
            self.memory_total_mib = None

    def y_range(self, metric: str) -> tuple[float, float]:
        """The y range shown now (tests)."""
        low, high = self.plots[metric].getPlotItem().viewRange()[1]
        return float(low), float(high)

    def set_window(self, seconds: float) -> None:
        self.window_s = float(seconds)
        for plot in self.plots.values():
            plot.setXRange(-self.window_s, 0, padding=0)

    @staticmethod
    def color(position: int) -> str:
        """The curve color of the card at ``position`` in the key order (the table's row)."""
        return COLORS[position % len(COLORS)]

    def curve_count(self) -> int:
        return len(self._curves)

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
            low, high = np.inf, -np.inf
            for key in self._keys:
                t, v = history.series(key, metric, since)
                curve = self._curves[(metric, key)]
                if len(t) == 0:
                    curve.setData([], [])
                    continue
                curve.setData(t - now, v, connect="finite")
                finite = v[np.isfinite(v)]
                if len(finite):
                    low, high = min(low, float(finite.min())), max(high, float(finite.max()))
            self.plots[metric].setXRange(-self.window_s, 0, padding=0)
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
                curve = self.plots[metric].plot(np.empty(0), np.empty(0), pen=pen)
                self._curves[(metric, key)] = curve

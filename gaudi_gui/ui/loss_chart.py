"""Loss and learning-rate curves of a run (pyqtgraph), with other runs overlaid for comparison.

The eval split's loss is drawn on the train loss chart (same axis, so over-fitting shows as the two
curves parting) and its perplexity on a right-hand axis of the same chart. A preference run (DPO, ORPO,
KTO) gets its rewards beside those curves (``RewardCharts``): chosen vs rejected, the margin and the
accuracy, on the same steps; an SFT run logs none and shows none."""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeGuard

import pyqtgraph as pg
from PySide6.QtCore import QSize, Qt
from PySide6.QtWidgets import QHBoxLayout, QLabel, QVBoxLayout, QWidget

from gaudi_gui.core.metrics import (
    REWARD_ACCURACIES,
    REWARD_CHOSEN,
    REWARD_MARGINS,
    REWARD_REJECTED,
    REWARD_SERIES,
    has_rewards,
)
from gaudi_gui.ui.flow_layout import FlowLayout
from gaudi_gui.ui.plot_area import MIN_VIEW_PX, PlotArea, readable_plot

#: A curve's cell: a readable view box plus the tick labels (the name is the left axis label).
MIN_CELL = QSize(240, MIN_VIEW_PX + 24)
#: The least cell width of each of two columns side by side (the loss and the rewards): beside
#: Compare's scores, a 1024-pixel window leaves about 400 px for both.
PAIR_CELL = QSize(160, MIN_CELL.height())
_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"]
#: Compared runs' colours (the live run's blue and the eval curves' red and purple left out).
_COMPARE_COLORS = ["#1f77b4", "#ff7f0e", "#2ca02c", "#8c564b", "#e377c2", "#17becf", "#bcbd22", "#7f7f7f"]
#: The longest name a legend entry shows (the middle elided); the whole name is its tooltip.
LEGEND_CHARS = 28


def distinct_names(names: Sequence[str]) -> list[str]:
    """Short names that still tell the runs apart: the "-"-separated parts all the names share at the
    start and at the end are left out ("20261206-031502-builtin-demo" and "20261206-034417-builtin-demo"
    are "031502" and "034417"), and what is still longer than ``LEGEND_CHARS`` loses its middle. A
    legend that cut every name at its width showed "202612" for both."""
    if len(names) < 2 or len(set(names)) < len(names):
        return [_elide_middle(n) for n in names]
    parts = [n.split("-") for n in names]
    shortest = min(len(p) for p in parts)
    head = 0
    while head < shortest - 1 and len({p[head] for p in parts}) == 1:
        head += 1
    tail = 0
    while tail < shortest - head - 1 and len({p[len(p) - 1 - tail] for p in parts}) == 1:
        tail += 1
    short = ["-".join(p[head:len(p) - tail]) for p in parts]
    if len(set(short)) < len(short) or not all(short):
        short = list(names)
    return [_elide_middle(n) for n in short]


def _elide_middle(name: str, limit: int = LEGEND_CHARS) -> str:
    if len(name) <= limit:
        return name
    keep = limit - 1
    return f"{name[:(keep + 1) // 2]}…{name[len(name) - keep // 2:]}"


def meter_utilization(folder: str | Path) -> tuple[list[float], list[float]]:
    """A run's cards' mean utilization (%) per meter sample (its meter.jsonl): (wall times, values);
    a sample with no card's figure is left out (not 0)."""
    from gaudi_gui.core.export import meter_samples

    times: list[float] = []
    values: list[float] = []
    for sample in meter_samples(folder):
        found = sample.get("cards")
        cards: list[Any] = found if isinstance(found, list) else []
        read = [float(c["utilization"]) for c in cards if isinstance(c, dict)
                and isinstance(c.get("utilization"), (int, float)) and not isinstance(c["utilization"], bool)]
        if read:
            times.append(float(sample["t"]))
            values.append(sum(read) / len(read))
    return times, values


@dataclass
class ComparedRun:
    """One run as Compare draws it."""

    name: str
    #: Its metrics records (step, loss, learning_rate, time …).
    records: Sequence[Mapping[str, Any]]
    #: Its cards' mean utilization (%) over wall time, from its meter (meter.jsonl): (times, values).
    utilization: tuple[Sequence[float], Sequence[float]] = field(default_factory=lambda: ([], []))


#: The reward charts' live colours: chosen green, rejected red (the margin and accuracy one each).
_CHOSEN_COLOR, _REJECTED_COLOR, _MARGIN_COLOR, _ACCURACY_COLOR = "#2ca02c", "#d62728", "#9467bd", "#1f77b4"
_DASH = Qt.PenStyle.DashLine
#: A reward series as Compare names it when a run has none of it.
_REWARD_WORDS = {REWARD_CHOSEN: "chosen reward", REWARD_REJECTED: "rejected reward", REWARD_MARGINS: "margin",
                 REWARD_ACCURACIES: "accuracy"}


class RewardCharts(QWidget):
    """What tells whether preference tuning worked, beside the loss: the rewards of the chosen and of
    the rejected answers (TRL's ``rewards/chosen`` and ``rewards/rejected``: beta times how much more
    likely the policy makes each answer than the reference does), their margin and the accuracy (the
    share of pairs whose chosen answer has the higher reward). Hidden until a record carries one, so
    an SFT run looks as before; the accuracy chart only where some run logs it (KTO does not).

    Compare draws each preference run in its colour (chosen solid, rejected dashed) and says in words
    which runs are absent (no rewards logged) or lack a series (KTO: no accuracy)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.area = PlotArea(PAIR_CELL, (1,), self, title_on_axis=True)
        self.rewards_plot = readable_plot(self, "rewards (chosen vs rejected)")
        self.margins_plot = readable_plot(self, "reward margin (chosen - rejected)")
        self.accuracy_plot = readable_plot(self, "reward accuracy (chosen > rejected)")
        for plot in self.plots():
            plot.getPlotItem().getViewBox().setLimits(xMin=0)
        # A margin above 0 is the chosen answer preferred; an accuracy is a share of pairs, 0 to 1.
        for plot in (self.rewards_plot, self.margins_plot):
            plot.addItem(pg.InfiniteLine(pos=0, angle=0, pen=pg.mkPen("#999999", width=1, style=_DASH)))
        self.accuracy_plot.setYRange(0, 1, padding=0.05)
        self.accuracy_plot.getPlotItem().getAxis("left").enableAutoSIPrefix(False)
        for plot, title, label in ((self.rewards_plot, "rewards (chosen vs rejected)", "reward"),
                                   (self.margins_plot, "reward margin", "margin"),
                                   (self.accuracy_plot, "reward accuracy", "accuracy")):
            self.area.add_plot(plot, title, label)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.area)
        self._points: dict[str, tuple[list[float], list[float]]] = {k: ([], []) for k in REWARD_SERIES}
        self.chosen_curve = self.rewards_plot.plot([], [], pen=pg.mkPen(_CHOSEN_COLOR, width=2), symbol="o",
                                                   symbolSize=4, symbolBrush=_CHOSEN_COLOR)
        self.rejected_curve = self.rewards_plot.plot([], [], pen=pg.mkPen(_REJECTED_COLOR, width=2),
                                                     symbol="o", symbolSize=4, symbolBrush=_REJECTED_COLOR)
        self.margins_curve = self.margins_plot.plot([], [], pen=pg.mkPen(_MARGIN_COLOR, width=2), symbol="o",
                                                    symbolSize=4, symbolBrush=_MARGIN_COLOR)
        self.accuracy_curve = self.accuracy_plot.plot([], [], pen=pg.mkPen(_ACCURACY_COLOR, width=2),
                                                      symbol="o", symbolSize=4, symbolBrush=_ACCURACY_COLOR)
        self._curves = {REWARD_CHOSEN: self.chosen_curve, REWARD_REJECTED: self.rejected_curve,
                        REWARD_MARGINS: self.margins_curve, REWARD_ACCURACIES: self.accuracy_curve}
        self._overlays: list[tuple[pg.PlotWidget, Any]] = []
        #: Which line is which (placed by the owner, shown with these charts).
        self.key = QLabel(self)
        self.key.setTextFormat(Qt.TextFormat.RichText)
        self.key.setAlignment(Qt.AlignmentFlag.AlignRight)
        self.key.setContentsMargins(4, 0, 4, 0)
        self._legend(compared=False)
        self.hide()
        self.key.hide()

    def plots(self) -> tuple[pg.PlotWidget, pg.PlotWidget, pg.PlotWidget]:
        return self.rewards_plot, self.margins_plot, self.accuracy_plot

    def _legend(self, compared: bool) -> None:
        """Which line of the rewards chart is which, in ``key`` (a line the chart's owner puts above
        the charts): a legend box inside the chart covered the newest points (chosen climbs, rejected
        falls, and a short chart has no empty corner), and a title row took the height of its view."""
        if compared:  # the colour is the run's (the row above the charts): the style tells them apart
            key = "rewards: <span style='color:#555555'>━━ chosen &nbsp; ╍╍ rejected</span>"
        else:
            key = (f"rewards: <span style='color:{_CHOSEN_COLOR}'>━━ chosen</span> &nbsp; "
                   f"<span style='color:{_REJECTED_COLOR}'>━━ rejected</span>")
        self.key.setText(key)

    def clear(self) -> None:
        for key, curve in self._curves.items():
            self._points[key] = ([], [])
            curve.setData([], [])
        self._refresh()

    def add_record(self, record: Mapping[str, Any]) -> bool:
        """Draw the record's rewards; True when it carried any."""
        step = record.get("step")
        if not _number(step):
            return False
        added = False
        for key, curve in self._curves.items():
            value = record.get(key)
            if _number(value):
                steps, values = self._points[key]
                steps.append(float(step))
                values.append(float(value))
                curve.setData(steps, values)
                added = True
        if added:
            self._refresh()
        return added

    def _plot_of(self, key: str) -> pg.PlotWidget:
        return {REWARD_CHOSEN: self.rewards_plot, REWARD_REJECTED: self.rewards_plot,
                REWARD_MARGINS: self.margins_plot, REWARD_ACCURACIES: self.accuracy_plot}[key]

    def _refresh(self) -> None:
        """Shown with what there is: the panel once any reward is drawn, each chart once it has a curve
        (the margins chart of a KTO run too, which TRL derives from chosen minus rejected)."""
        drawn = {plot for plot, _ in self._overlays}
        drawn |= {self._plot_of(k) for k in REWARD_SERIES if self._points[k][0]}
        for plot in self.plots():
            self.area.set_shown(plot, plot in drawn)
        self.setVisible(bool(drawn))
        self.key.setVisible(bool(drawn))

    def compare(self, runs: Sequence[tuple[Sequence[Mapping[str, Any]], str, str]]) -> str:
        """Each run given as (records, short name, colour): the rewards of those that logged any, in
        their colour. Returns the words for the runs left out ("" when none is, or when no run has
        rewards: then these charts stay hidden and Compare looks as it did for SFT runs)."""
        self.clear_overlays()
        absent: list[str] = []
        partly: list[str] = []  # a run missing from some charts: KTO logs no accuracy, and a margin
        for records, short, color in runs:  # only for steps whose batch held both kinds of answer
            if not has_rewards(records):
                absent.append(short)
                continue
            missing = []
            for key in REWARD_SERIES:
                plot, dashed = self._plot_of(key), key == REWARD_REJECTED
                steps, values = _finite(records, key)
                if not steps:
                    missing.append(_REWARD_WORDS[key])
                    continue
                pen = pg.mkPen(color, width=2, style=_DASH if dashed else Qt.PenStyle.SolidLine)
                self._overlays.append((plot, plot.plot(steps, values, pen=pen)))
            if missing:
                partly.append(f"{short} logged no {' or '.join(missing)}")
        words = []
        if absent and self._overlays:
            words.append(f"not in the reward charts: {', '.join(absent)} (no rewards logged)")
        words += partly
        self._legend(compared=True)
        self._refresh()
        return "; ".join(words)

    def clear_overlays(self) -> None:
        for plot, item in self._overlays:
            plot.removeItem(item)
        self._overlays = []
        self._legend(compared=False)
        self._refresh()


class LossChart(QWidget):
    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        pg.setConfigOptions(antialias=True)
        # One column (the curves share the step axis); what does not fit goes on tabs, never a strip.
        # Alone it is at least MIN_CELL wide (the chart's least width), beside the rewards PAIR_CELL.
        self.area = PlotArea(PAIR_CELL, (1,), self, title_on_axis=True)
        self.loss_plot = readable_plot(self, "loss")
        # One row of entries at the top (a column of three would cover the newest points).
        self.loss_plot.addLegend(offset=(-10, 5), colCount=4)
        self.lr_plot = readable_plot(self, "learning rate")
        self.lr_plot.setXLink(self.loss_plot)
        # Card usage from the Devices tab, mapped onto the same step axis (wall time -> step through
        # the metrics records' elapsed time), so a loss spike can be read against the cards' load.
        self.device_plot = readable_plot(self, "card utilization (%)")
        self.device_plot.setXLink(self.loss_plot)
        self.device_plot.setYRange(0, 100, padding=0.02)
        self.device_plot.addLegend(offset=(-10, 5), labelTextSize="7pt", colCount=4)
        self._device_curves: dict[str, Any] = {}
        #: Whether the card chart was shown before Compare chose for its runs (None: not comparing).
        self._card_shown_before: bool | None = None
        self._device_legend_shown(False)
        self._times: list[float] = []  # wall time of each record, for the time -> step mapping
        self._time_steps: list[float] = []
        for plot in (self.loss_plot, self.lr_plot, self.device_plot):
            # Steps start at 0: the padding that makes room for the legend must not show step -10.
            plot.getPlotItem().getViewBox().setLimits(xMin=0)
        for plot in (self.loss_plot, self.device_plot):
            # Room above the curves for the legend, which gets an opaque box so it never hides one.
            plot.getPlotItem().getViewBox().setDefaultPadding(0.2 if plot is self.loss_plot else 0.12)
            legend = plot.getPlotItem().legend
            if legend is not None:
                legend.setBrush(pg.mkBrush(255, 255, 255, 230))
                legend.setPen(pg.mkPen(200, 200, 200))
        # Plain numbers on the learning-rate axis: an SI factor goes into the axis label, which then
        # no longer fits beside a short chart ("learning rate (x0.0001)").
        self.lr_plot.getPlotItem().getAxis("left").enableAutoSIPrefix(False)
        for plot, title, label in ((self.loss_plot, "loss", "loss"),
                                   (self.lr_plot, "learning rate", "learning rate"),
                                   (self.device_plot, "card utilization (%)", "utilization %")):
            self.area.add_plot(plot, title, label)
        # Compare's legend: a row above the charts (never over a curve), one entry per run in its
        # colour, a name that tells the runs apart, the whole name in its tooltip.
        self.legend_row = QWidget(self)
        # Entries flow onto a second line rather than widen the chart past a 1024-pixel window.
        self._legend_layout = FlowLayout(self.legend_row, spacing=12)
        self._legend_layout.setContentsMargins(4, 0, 4, 0)
        self.legend_row.hide()
        self.legend_labels: list[QLabel] = []
        #: Compare's words on the runs absent from the reward charts, under the row that names the
        #: runs and above every chart (over the reward charts alone, it set them lower than the loss
        #: beside them); wrapped, never widening the chart past the window.
        self.reward_note = QLabel(self)
        self.reward_note.setTextFormat(Qt.TextFormat.PlainText)
        self.reward_note.setWordWrap(True)
        self.reward_note.setContentsMargins(4, 0, 4, 0)
        self.reward_note.setStyleSheet("color: #555555")
        self.reward_note.setToolTip("Only preference runs (DPO, ORPO, KTO) log rewards. KTO logs no "
                                    "accuracy, and a margin only for a step whose batch held both a "
                                    "desirable and an undesirable answer.")
        self.reward_note.hide()
        # A preference run's rewards beside the loss, on the same steps (hidden until one is logged).
        self.rewards = RewardCharts(self)
        for plot in self.rewards.plots():
            plot.setXLink(self.loss_plot)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(2)
        layout.addWidget(self.legend_row)
        layout.addWidget(self.reward_note)
        layout.addWidget(self.rewards.key)
        row = QHBoxLayout()
        row.setSpacing(6)
        row.addWidget(self.area, 1)
        row.addWidget(self.rewards, 1)
        layout.addLayout(row, 1)
        self._sync_width()
        self._steps: list[float] = []
        self._loss: list[float] = []
        self._lr_steps: list[float] = []
        self._lr: list[float] = []
        self._loss_curve = self.loss_plot.plot([], [], pen=pg.mkPen(_COLORS[0], width=2), name="this run",
                                               symbol="o", symbolSize=4, symbolBrush=_COLORS[0])
        self._lr_curve = self.lr_plot.plot([], [], pen=pg.mkPen(_COLORS[1], width=2))
        #: Compare's curves: one loss curve per run, and its learning rate and card utilization.
        self._overlays: list[Any] = []
        self._lr_overlays: list[Any] = []
        self._device_overlays: list[Any] = []
        self._eval_steps: list[float] = []
        self._eval_loss: list[float] = []
        self._ppl: list[float] = []
        # The eval curves, their legend entries and the perplexity axis appear with the first eval point:
        # a run without an eval split shows none of them.
        self._eval_curve = self.loss_plot.plot([], [], pen=pg.mkPen(_COLORS[3], width=2),
                                               symbol="s", symbolSize=6, symbolBrush=_COLORS[3])
        # Perplexity on a right-hand axis of the loss chart: its own view box, x linked.
        item = self.loss_plot.getPlotItem()
        self._ppl_view = pg.ViewBox()
        item.scene().addItem(self._ppl_view)
        item.getAxis("right").linkToView(self._ppl_view)
        item.getAxis("right").setLabel("eval perplexity", color=_COLORS[4])
        self._ppl_view.setXLink(item)
        # The legend's row sits at the top of the chart: keep the highest points below it.
        self._ppl_view.setDefaultPadding(0.22)
        self._ppl_curve = pg.PlotDataItem([], [], pen=pg.mkPen(_COLORS[4], width=1.5,
                                                               style=pg.QtCore.Qt.PenStyle.DotLine),
                                          symbol="t", symbolSize=6, symbolBrush=_COLORS[4])
        self._ppl_view.addItem(self._ppl_curve)
        item.hideAxis("right")
        self._eval_shown = False
        item.getViewBox().sigResized.connect(self._sync_ppl_view)
        self._sync_ppl_view()

    def clear(self) -> None:
        self._steps, self._loss, self._lr_steps, self._lr = [], [], [], []
        self._times, self._time_steps = [], []
        for curve in self._device_curves.values():
            self.device_plot.removeItem(curve)
        self._device_curves = {}
        self._device_legend_shown(False)
        self._loss_curve.setData([], [])
        self._lr_curve.setData([], [])
        self._eval_steps, self._eval_loss, self._ppl = [], [], []
        self._eval_curve.setData([], [])
        self._ppl_curve.setData([], [])
        self._show_eval(False)
        self.rewards.clear()
        self.clear_overlays()  # and the least width

    def _sync_width(self) -> None:
        """The least width: one column's (MIN_CELL), or two narrower ones (PAIR_CELL) while the
        rewards are beside the loss. Two columns of MIN_CELL and Compare's scores beside them pushed
        the scores past the edge of a 1024-pixel window."""
        pair = 2 * PAIR_CELL.width() + 6
        self.setMinimumWidth(pair if self.rewards.isVisibleTo(self) else MIN_CELL.width())

    def _device_legend_shown(self, shown: bool) -> None:
        # An empty legend is still drawn as an empty box.
        legend = self.device_plot.getPlotItem().legend
        if legend is not None:
            legend.setVisible(shown)

    def set_card_chart_shown(self, shown: bool) -> None:
        """Show the card utilization chart (this machine's cards) or hide it (a run on a host)."""
        self.area.set_shown(self.device_plot, shown)

    def _show_eval(self, shown: bool) -> None:
        if shown == self._eval_shown:
            return
        self._eval_shown = shown
        item = self.loss_plot.getPlotItem()
        legend = item.legend
        if shown:
            item.showAxis("right")
            if legend is not None:
                legend.addItem(self._eval_curve, "eval loss")
                legend.addItem(self._ppl_curve, "eval perplexity (right axis)")
        else:
            item.hideAxis("right")
            if legend is not None:
                legend.removeItem(self._eval_curve)
                legend.removeItem(self._ppl_curve)

    def add_record(self, record: Mapping[str, Any]) -> None:
        step = record.get("step")
        if not isinstance(step, (int, float)):
            return
        if isinstance(record.get("time"), (int, float)):
            self._times.append(float(record["time"]))
            self._time_steps.append(float(step))
        if isinstance(record.get("loss"), (int, float)):
            self._steps.append(float(step))
            self._loss.append(float(record["loss"]))
            self._loss_curve.setData(self._steps, self._loss)
        if isinstance(record.get("eval_loss"), (int, float)):
            self._show_eval(True)
            self._eval_steps.append(float(step))
            self._eval_loss.append(float(record["eval_loss"]))
            self._eval_curve.setData(self._eval_steps, self._eval_loss)
            ppl = record.get("eval_perplexity")
            self._ppl.append(float(ppl) if isinstance(ppl, (int, float)) else float("nan"))
            self._ppl_curve.setData(self._eval_steps, self._ppl, connect="finite")
        if isinstance(record.get("learning_rate"), (int, float)):
            self._lr_steps.append(float(step))
            self._lr.append(float(record["learning_rate"]))
            self._lr_curve.setData(self._lr_steps, self._lr)
        if self.rewards.add_record(record):
            self._sync_width()

    def set_records(self, records: Sequence[Mapping[str, Any]]) -> None:
        self.clear()
        for rec in records:
            self.add_record(rec)

    def point_count(self) -> int:
        return len(self._loss)

    def _sync_ppl_view(self) -> None:
        view = self.loss_plot.getPlotItem().getViewBox()
        self._ppl_view.setGeometry(view.sceneBoundingRect())
        self._ppl_view.linkedViewChanged(view, self._ppl_view.XAxis)

    def compare(self, runs: Sequence[ComparedRun]) -> None:
        """Draw each run's loss, learning rate and card utilization (its meter's, on its own steps)
        in one colour per run, named in the legend row above the charts; the preference runs' rewards
        beside them, in the same colours."""
        import numpy as np

        self.clear_overlays()
        # The live run's entry ("this run") has no curve while comparing: the legend row says it all.
        legend = self.loss_plot.getPlotItem().legend
        if legend is not None:
            legend.setVisible(False)
        self._device_legend_shown(False)
        utilized = False
        shorts = distinct_names([r.name for r in runs])
        colors = [_COMPARE_COLORS[n % len(_COMPARE_COLORS)] for n in range(len(runs))]
        # Their rewards beside the loss: the preference runs' only, the others named as absent.
        absent = self.rewards.compare(list(zip((run.records for run in runs), shorts, colors, strict=True)))
        for run, short, color in zip(runs, shorts, colors, strict=True):
            pen = pg.mkPen(color, width=2)
            steps, loss = _series(run.records, "loss")
            self._overlays.append(self.loss_plot.plot(steps, loss, pen=pen))
            steps, rate = _series(run.records, "learning_rate")
            self._lr_overlays.append(self.lr_plot.plot(steps, rate, pen=pen))
            times, at = _series(run.records, "step", x="time")
            t = np.asarray(run.utilization[0], dtype=float)
            if len(times) >= 2 and t.size:
                keep = (t >= times[0]) & (t <= times[-1])
                x = np.interp(t[keep], times, at)
                y = np.asarray(run.utilization[1], dtype=float)[keep]
                utilized = utilized or bool(x.size)
                self._device_overlays.append(self.device_plot.plot(x, y, pen=pen, connect="finite"))
            self._add_legend_entry(short, run.name, color)
        self.reward_note.setText(absent)
        self.reward_note.setVisible(bool(absent))
        self._sync_width()
        self.legend_row.setVisible(bool(runs))
        # A compared run's own cards, from its meter (the Devices tab's cards are not its cards).
        if self._card_shown_before is None:
            self._card_shown_before = self.area.is_shown(self.device_plot)
        self.set_card_chart_shown(utilized)

    def _add_legend_entry(self, short: str, name: str, color: str) -> None:
        label = QLabel(f'<span style="color:{color}">&#9644;</span> {html.escape(short)}', self.legend_row)
        label.setTextFormat(Qt.TextFormat.RichText)
        label.setToolTip(name)
        self._legend_layout.addWidget(label)
        self.legend_labels.append(label)

    def add_overlay(self, name: str, steps: list[float], losses: list[float]) -> None:
        """One more run's loss curve (dashed) over the live run's, named in the legend row."""
        color = _COMPARE_COLORS[(len(self._overlays) + 1) % len(_COMPARE_COLORS)]
        self._overlays.append(self.loss_plot.plot(steps, losses, pen=pg.mkPen(
            color, width=2, style=pg.QtCore.Qt.PenStyle.DashLine)))
        self._add_legend_entry(_elide_middle(name), name, color)
        self.legend_row.show()

    def clear_overlays(self) -> None:
        for plot, items in ((self.loss_plot, self._overlays), (self.lr_plot, self._lr_overlays),
                            (self.device_plot, self._device_overlays)):
            for item in items:
                plot.removeItem(item)
        self._overlays, self._lr_overlays, self._device_overlays = [], [], []
        self.rewards.clear_overlays()
        for label in self.legend_labels:
            self._legend_layout.removeWidget(label)
            label.deleteLater()
        self.legend_labels = []
        self.reward_note.clear()
        self.reward_note.hide()
        self._sync_width()
        if self._card_shown_before is not None:
            # As it was before Compare (a run reopened after comparing runs without a meter had none).
            self.set_card_chart_shown(self._card_shown_before)
            self._card_shown_before = None
        self.legend_row.hide()
        legend = self.loss_plot.getPlotItem().legend
        if legend is not None:
            legend.setVisible(True)
        self._device_legend_shown(bool(self._device_curves))

    def time_range(self) -> tuple[float, float] | None:
        """(first, last) wall time of the live records, or None before two of them arrived."""
        if len(self._times) < 2:
            return None
        return self._times[0], self._times[-1]

    def set_device_series(self, series: Sequence[tuple[str, Any, Any]]) -> None:
        """Card utilization as (label, wall times, values), drawn against the run's steps."""
        import numpy as np

        if len(self._times) < 2:
            return
        times = np.asarray(self._times)
        steps = np.asarray(self._time_steps)
        for n, (label, t, v) in enumerate(series):
            t = np.asarray(t, dtype=float)
            keep = (t >= times[0]) & (t <= times[-1])
            x = np.interp(t[keep], times, steps)
            curve = self._device_curves.get(label)
            if curve is None:
                curve = self.device_plot.plot([], [], pen=pg.mkPen(pg.intColor(n, hues=9), width=1.5),
                                              name=label)
                self._device_curves[label] = curve
                self._device_legend_shown(True)
            curve.setData(x, np.asarray(v, dtype=float)[keep], connect="finite")

    def device_point_count(self) -> int:
        return sum(len(c.xData) if c.xData is not None else 0 for c in self._device_curves.values())


def _number(value: Any) -> TypeGuard[float]:
    """A number to draw: not a bool, not NaN or infinite (a gap, not a point)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _finite(records: Sequence[Mapping[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of ``key`` where both are finite numbers."""
    steps, values = _series(records, key)
    pairs = [(a, b) for a, b in zip(steps, values, strict=True) if math.isfinite(a) and math.isfinite(b)]
    return [a for a, _ in pairs], [b for _, b in pairs]


def _series(records: Sequence[Mapping[str, Any]], key: str,
            x: str = "step") -> tuple[list[float], list[float]]:
    """(x, value) of ``key`` over the records that carry both as numbers."""
    xs: list[float] = []
    ys: list[float] = []
    for rec in records:
        a, b = rec.get(x), rec.get(key)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) \
                and not isinstance(a, bool) and not isinstance(b, bool):
            xs.append(float(a))
            ys.append(float(b))
    return xs, ys

"""Compare, clicked on two runs of the same job (issue 37, item 18): both runs are named in the legend,
by the part of their names that differs (the whole name in the tooltip), in a row above the charts
rather than over the curves; the learning-rate and utilization charts draw both runs (their metrics
and their meters), not nothing. In a 1024x700 window."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from gaudi_gui.core import meter_files
from gaudi_gui.core.events import EventWriter
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, RunStore
from gaudi_gui.ui.loss_chart import distinct_names
from tests import helpers

NAMES = ("20261206-031502-builtin-demo", "20261206-034417-builtin-demo")


def _run(store: RunStore, name: str, *, lr: float, busy: float) -> Run:
    """A finished 30-step run named ``name`` whose events log loss, learning rate and wall time, and
    whose meter logged its card's utilization, as a training run leaves them."""
    made = store.create(JobConfig(training_args={"output_dir": str(store.root / "out" / name)}))
    run = Run(made.folder.with_name(name))
    made.folder.rename(run.folder)
    t0 = time.time() - 100
    with EventWriter(run.events_path) as events:
        for step in range(1, 31):
            events.write("metrics", step=step, max_steps=30, loss=2 * math.exp(-step / 10) + 0.3,
                         learning_rate=lr * (1 - step / 31), elapsed=step, time=t0 + step)
    with open(run.folder / meter_files.METER_NAME, "w", encoding="utf-8") as fh:
        for k in range(32):
            cards = [{"name": f"module {c}", "utilization": busy + 10 * c} for c in (0, 1)]
            fh.write(json.dumps({"t": t0 + k, "source": "hl-smi", "cards": cards}) + "\n")
    run.update_status(state="finished", step=30, max_steps=30, started_at=t0, ended_at=t0 + 31,
                      final_loss=0.4, summary="Finished 30 steps")
    return run


def _drawn(plot: object) -> list[tuple[list[float], list[float]]]:
    """The (x, y) of every curve of a PlotWidget that holds points."""
    out = []
    for item in plot.getPlotItem().listDataItems():  # type: ignore[attr-defined]
        x, y = item.getData()
        if x is not None and len(x):
            out.append((list(map(float, x)), list(map(float, y))))
    return out


def test_compare_names_both_runs_above_the_charts_and_draws_their_rate_and_utilization(
        qtbot: QtBot, tmp_path: Path) -> None:
    services, tab = helpers.training_tab(qtbot, tmp_path)
    try:
        assert services.training is not None
        store = services.training.store
        _run(store, NAMES[0], lr=1e-3, busy=40)
        _run(store, NAMES[1], lr=3e-3, busy=70)
        tab.resize(1024, 700)
        bar = tab.views.tabBar()
        helpers.click(qtbot, bar, bar.tabRect(tab.views.indexOf(tab.runs)).center())
        qtbot.waitUntil(lambda: tab.runs.table.rowCount() == 2, timeout=10_000)
        table = tab.runs.table
        first = table.visualRect(table.model().index(0, 0)).center()
        second = table.visualRect(table.model().index(1, 0)).center()
        qtbot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, pos=first)
        ctrl = Qt.KeyboardModifier.ControlModifier
        qtbot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, ctrl, second)
        assert len(tab.runs.selected_runs()) == 2
        helpers.click(qtbot, tab.runs.buttons["Compare"])
        chart = tab.chart
        qtbot.waitUntil(lambda: tab.views.currentWidget() is tab.live, timeout=5000)

        # Both runs named, by what tells them apart, each whole name in its tooltip.
        qtbot.waitUntil(chart.legend_row.isVisible, timeout=5000)
        labels = chart.legend_labels
        assert sorted(label.toolTip() for label in labels) == sorted(NAMES)
        shown = [label.text() for label in labels]
        assert any("031502" in text for text in shown) and any("034417" in text for text in shown), shown
        for label in labels:  # each entry whole inside the row, none cut at its edge
            assert label.isVisible()
            assert label.geometry().right() <= chart.legend_row.width(), label.geometry()
        # The legend is a row above the charts, not a box on a curve; the live run's empty entry is gone.
        row = chart.legend_row.geometry()
        assert row.bottom() < chart.area.geometry().top()
        legend = chart.loss_plot.getPlotItem().legend
        assert legend is None or not legend.isVisible()

        # Every chart draws both runs.
        losses = _drawn(chart.loss_plot)
        rates = _drawn(chart.lr_plot)
        assert len(losses) == 2 and len(rates) == 2
        highest = sorted(round(max(y), 6) for _x, y in rates)
        assert highest == [round(1e-3 * 30 / 31, 6), round(3e-3 * 30 / 31, 6)]
        assert chart.area.is_shown(chart.device_plot)
        busy = _drawn(chart.device_plot)
        assert len(busy) == 2
        # The mean of each run's two cards, on its own steps.
        assert sorted(round(sum(y) / len(y)) for _x, y in busy) == [45, 75]
        assert all(min(x) >= 1 and max(x) <= 30 for x, _y in busy)
    finally:
        helpers.end_training_tab(qtbot, services, tab)


def test_distinct_names_keep_what_differs_and_elide_the_middle() -> None:
    assert distinct_names(list(NAMES)) == ["031502", "034417"]
    assert distinct_names(["20261206-031502-lora-a", "20261206-031502-lora-b"]) == ["a", "b"]
    assert distinct_names(["same", "same"]) == ["same", "same"]
    long = distinct_names(["x-" + "a" * 40 + "-y", "x-" + "b" * 40 + "-y"])
    assert all(len(n) <= 28 and "…" in n for n in long)
    assert distinct_names(["only-one-run"]) == ["only-one-run"]

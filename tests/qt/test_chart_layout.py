"""Every plot of the Training and Devices tabs is readable at 1280x800 and 1024x700 (issue 17).

The real main window at the size of a common laptop and of a small screen: each plot shown in a cell,
and each one on a tab once its tab is clicked, has a view box of at least ``MIN_VIEW_PX``; no two tick
labels of an axis overlap (the text rectangles pyqtgraph draws, from ``generateDrawSpecs``); the window
is not forced taller than the screen. And the Devices history spans the data it has: after 10 s of
samples the x range is about 10 s, not the 5-minute window."""

# mypy: disable-error-code="union-attr,attr-defined"
from __future__ import annotations

import math
import time
from collections.abc import Iterator

import pyqtgraph as pg
import pytest
from PySide6.QtCore import QRectF, Qt
from PySide6.QtGui import QImage, QPainter

from gaudi_gui.app import create_services
from gaudi_gui.core.devices import DeviceSample
from gaudi_gui.ui.device_charts import DeviceCharts
from gaudi_gui.ui.main_window import MainWindow
from gaudi_gui.ui.plot_area import MIN_VIEW_PX, PlotArea
from tests.helpers import close_window, form_ready, tabbed_plots, x_range

SIZES = [(1280, 800), (1024, 700)]
TABS = {"devices": 0, "training": 2}


def cards(t: float, k: int, n: int = 8) -> list[DeviceSample]:
    """Eight Gaudi 2 cards as hl-smi reports them, two of them busy."""
    return [DeviceSample(kind="hpu", index=i, module_id=i, name="HL-225", bus_id=f"0000:{i:02x}:00.0",
                         uuid=f"UUID-{i}", driver_version="1.18.0",
                         utilization=70 + 20 * math.sin(k / 5 + i) if i < 2 else 2.0,
                         memory_used_mib=61440.0 if i < 2 else 768.0, memory_total_mib=98304,
                         temperature_c=48 + 5 * math.sin(k / 7) if i < 2 else 31.0, power_w=380 + i,
                         power_max_w=600, timestamp=t)
            for i in range(n)]


@pytest.fixture
def window(qtbot) -> Iterator[MainWindow]:
    win = MainWindow(create_services())
    qtbot.addWidget(win, before_close_func=lambda w: close_window(qtbot, w))
    # pytest-qt closes it after the test as a person does (close_window: Stop and quit when jobs run).
    yield win


def open_at(qtbot, win: MainWindow, size: tuple[int, int], tab: str) -> None:
    win.resize(*size)
    win.show()
    qtbot.waitExposed(win)
    win.ensure_tabs()
    bar = win.tabs.tabBar()
    qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(TABS[tab]).center())
    qtbot.waitUntil(lambda: win.tabs.currentIndex() == TABS[tab])


def label_rects(axis: pg.AxisItem) -> list[tuple[QRectF, str]]:
    """The tick labels' text rectangles as the axis would draw them now."""
    image = QImage(8, 8, QImage.Format.Format_ARGB32)
    painter = QPainter(image)
    try:
        specs = axis.generateDrawSpecs(painter)
    finally:
        painter.end()
    return [] if specs is None else [(rect, text) for rect, _flags, text in specs[2]]


def problems(plot: pg.PlotWidget, where: str) -> list[str]:
    """What makes ``plot`` hard to read now: a short view box, overlapping or missing tick labels."""
    found = []
    item = plot.getPlotItem()
    height = item.getViewBox().height()
    if height < MIN_VIEW_PX:
        found.append(f"{where}: the view box is {height:.0f} px high")
    for name in ("left", "bottom", "right"):
        axis = item.getAxis(name)
        if not axis.isVisible():
            continue
        labels = label_rects(axis)
        if name != "right" and len(labels) < 2:
            found.append(f"{where}: the {name} axis has the labels {[t for _r, t in labels]}")
        for i, (a, text_a) in enumerate(labels):
            for b, text_b in labels[i + 1:]:
                if a.intersects(b):
                    found.append(f"{where}: {name} tick labels {text_a!r} and {text_b!r} overlap")
    return found


def assert_readable(qtbot, plot: pg.PlotWidget, where: str) -> None:
    # The axes widen for their labels on the next paint: wait for the plot as a person sees it.
    try:
        qtbot.waitUntil(lambda: not problems(plot, where), timeout=3000)
    except AssertionError:
        pytest.fail("; ".join(problems(plot, where)))


def assert_area_readable(qtbot, area: PlotArea, where: str) -> int:
    """Every plot of ``area`` readable in its cell, the tabbed ones after a click on their tab."""
    checked = 0
    tabbed = tabbed_plots(area)
    for plot in area.shown_plots():
        if plot not in tabbed:
            assert plot.isVisible()
            assert_readable(qtbot, plot, where)
            checked += 1
    bar = area.tabs.tabBar()
    for index, plot in enumerate(tabbed):
        qtbot.mouseClick(bar, Qt.MouseButton.LeftButton, pos=bar.tabRect(index).center())
        qtbot.waitUntil(lambda p=plot: p.isVisible() and p.getPlotItem().getViewBox().height() > 0)
        assert_readable(qtbot, plot, f"{where}, tab {area.tabs.tabText(index)!r}")
        checked += 1
    return checked


@pytest.mark.parametrize("size", SIZES)
def test_devices_charts_are_readable(qtbot, window: MainWindow, size: tuple[int, int]) -> None:
    open_at(qtbot, window, size, "devices")
    tab = window.devices_tab
    now = time.time()
    for k in range(10):  # ten seconds of samples, one per second
        window.services.poller.feed_samples(cards(now - 9 + k, k))
    qtbot.waitUntil(lambda: tab.table.rowCount() == 8)
    tab.refresh_now()
    assert window.size().toTuple() == size, "the window cannot be made this small"
    area = tab.charts.area
    assert assert_area_readable(qtbot, area, f"Devices at {size}") == 4
    # The history spans the ten seconds there are, not the 5-minute window with the data at its edge.
    assert tab.window_combo.currentText() == "5 min"
    low, high = x_range(tab.charts.plots["utilization"])
    assert high == pytest.approx(0, abs=0.5) and low == pytest.approx(-10, abs=2), (low, high)


@pytest.mark.parametrize("size", SIZES)
def test_training_charts_are_readable(qtbot, window: MainWindow, size: tuple[int, int]) -> None:
    open_at(qtbot, window, size, "training")
    tab = window.training_tab
    qtbot.waitUntil(lambda: form_ready(tab), timeout=60000)
    start = time.time() - 200
    # A run's records as the job reports them: loss, learning rate, an eval every 50 steps.
    for step in range(1, 201):
        record = {"step": step, "loss": 2.5 * math.exp(-step / 40) + 0.3, "time": start + step,
                  "learning_rate": 2e-4 * (1 - step / 200)}
        if step % 50 == 0:
            record.update(eval_loss=record["loss"] + 0.1, eval_perplexity=math.exp(record["loss"] + 0.1))
        tab.chart.add_record(record)
    tab.chart.set_device_series([(f"card {i}", [start + s for s in range(200)],
                                  [50 + 40 * math.sin(s / 9 + i) for s in range(200)]) for i in range(2)])
    assert window.size().toTuple() == size, "the window cannot be made this small"
    assert tab.chart.loss_plot.getPlotItem().getAxis("right").isVisible()  # the perplexity axis
    assert assert_area_readable(qtbot, tab.chart.area, f"Training at {size}") == 3
    assert not tab.chart.rewards.isVisible()  # an SFT run: no reward charts
    # A DPO run's records also carry its rewards: they take half the width, beside the loss.
    tab.chart.clear()
    for step in range(1, 201):
        tab.chart.add_record({"step": step, "loss": 0.69 * math.exp(-step / 80), "time": start + step,
                              "learning_rate": 5e-7, "rewards/chosen": 0.02 * step,
                              "rewards/rejected": -0.03 * step, "rewards/margins": 0.05 * step,
                              "rewards/accuracies": min(1.0, 0.5 + step / 100)})
    qtbot.waitUntil(tab.chart.rewards.isVisible)
    assert window.size().toTuple() == size, "the window cannot be made this small"
    assert assert_area_readable(qtbot, tab.chart.area, f"Training (DPO) at {size}") >= 2
    assert assert_area_readable(qtbot, tab.chart.rewards.area, f"Rewards at {size}") == 3


def test_history_grows_until_the_window_fills(qtbot) -> None:
    from gaudi_gui.core.devices import History
    from gaudi_gui.ui.device_charts import MIN_SPAN_S

    charts = DeviceCharts()
    qtbot.addWidget(charts)
    charts.set_window(60)
    history = History()
    now = 1000.0
    keys = [s.key for s in cards(now, 0)]
    history.add(cards(now, 0))
    charts.refresh(history, keys, now=now)
    assert x_range(charts.plots["utilization"]) == pytest.approx((-MIN_SPAN_S, 0))
    for k in range(1, 31):
        history.add(cards(now + k, k))
    charts.refresh(history, keys, now=now + 30)
    assert x_range(charts.plots["utilization"]) == pytest.approx((-30, 0))
    for k in range(31, 200):
        history.add(cards(now + k, k))
    charts.refresh(history, keys, now=now + 199)
    assert x_range(charts.plots["utilization"]) == pytest.approx((-60, 0))  # full: the chosen window


def _count_axis_paints(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The orientation of each axis painted from here on (a cached axis is not painted again)."""
    painted: list[str] = []
    real_paint = pg.AxisItem.paint

    def counting(item: pg.AxisItem, *args: object) -> None:
        painted.append(item.orientation)
        real_paint(item, *args)

    monkeypatch.setattr(pg.AxisItem, "paint", counting)
    return painted


def _shown_charts(qtbot) -> DeviceCharts:
    """The Devices charts on screen at 1200 x 800, showing an hour."""
    charts = DeviceCharts()
    qtbot.addWidget(charts)
    charts.resize(1200, 800)
    charts.show()
    qtbot.waitExposed(charts)
    charts.set_window(3600)
    return charts


def test_a_redraw_of_new_readings_repaints_the_curves_not_the_axes(qtbot, monkeypatch) -> None:
    """An hour of eight cards: a redraw with a new reading paints the curves again, while the axes and
    their grid (unchanged: the same range, the same size) come from their cached pixmap; their tick labels
    and lines are painted again only when the range changes."""
    from gaudi_gui.core.devices import History

    painted = _count_axis_paints(monkeypatch)
    charts = _shown_charts(qtbot)
    history = History()
    now = 1.8e9
    for k in range(3600):
        history.add(cards(now - 3600 + k, k))
    keys = [s.key for s in cards(now, 0)]
    charts.refresh(history, keys, now=now, metrics=["utilization"])
    plot = charts.plots["utilization"]
    first = plot.grab().toImage()
    assert "left" in painted and "bottom" in painted  # the first draw paints them
    painted.clear()
    for k in range(1, 31):  # half a minute more: the busy cards' curves move
        history.add(cards(now + k, 3600 + k))
    charts.refresh(history, keys, now=now + 30, metrics=["utilization"])
    moved = plot.grab().toImage()
    assert moved != first, "the new readings were not drawn"
    assert painted == [], f"the axes were painted again for new readings: {painted}"
    charts.set_window(600)  # a new range: its tick labels are painted again
    charts.refresh(history, keys, now=now + 30, metrics=["utilization"])
    plot.grab()
    assert "bottom" in painted


def test_a_full_history_at_10_hz_keeps_its_span_as_its_oldest_samples_leave(qtbot, monkeypatch) -> None:
    """hl-smi at 10 Hz fills the history's ring in minutes; from then on each new sample pushes the
    oldest out, so the data's age moves by 0.1 s at every redraw. The chart keeps its span for that
    (less than a pixel): its axes are not drawn again for each new reading, and the span follows the
    data once it moved by more than ``SPAN_SLACK``."""
    from gaudi_gui.core.devices import History
    from gaudi_gui.ui.device_charts import SPAN_SLACK

    painted = _count_axis_paints(monkeypatch)
    charts = _shown_charts(qtbot)
    history = History(capacity=600)  # a minute at 10 Hz
    now = 1.8e9
    for k in range(600):
        history.add(cards(now - 60 + k / 10, k))
    keys = [s.key for s in cards(now, 0)]
    charts.refresh(history, keys, now=now, metrics=["utilization"])
    plot = charts.plots["utilization"]
    plot.grab()
    first = x_range(plot)
    painted.clear()
    for k in range(1, 6):  # half a second more: the oldest samples leave as the new ones come
        history.add(cards(now + k / 10, 600 + k))
        # Redrawn on the window's timer, not on the sample's arrival: the data's age jitters.
        charts.refresh(history, keys, now=now + k / 10 + (0.07 if k % 2 else 0.02), metrics=["utilization"])
        plot.grab()
    assert x_range(plot) == first and painted == [], f"the span moved with each sample: {painted}"
    later = now + 60 * SPAN_SLACK * 3  # data much older than the span shown: followed
    history.add(cards(later, 700))
    charts.refresh(history, keys, now=later, metrics=["utilization"])
    assert x_range(plot)[0] < first[0] - 60 * SPAN_SLACK

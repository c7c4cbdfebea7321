"""The Devices tab with pytest-qt: cards, warnings, selection and its env, the state panel, charts."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QProgressBar

from gaudi_gui.app import create_services
from gaudi_gui.core.devices import DeviceSample, ProcessInfo
from gaudi_gui.services import device_poller as dp
from gaudi_gui.ui.device_table import COLUMNS
from gaudi_gui.ui.devices_tab import DevicesTab


def cards(n: int = 8, t: float | None = None, util: float = 0.0, **over: object) -> list[DeviceSample]:
    now = time.time() if t is None else t
    out = []
    for i in range(n):
        s = DeviceSample(kind="hpu", index=i, module_id=(i + 2) % n, name="HL-225",
                         bus_id=f"0000:{i:02x}:00.0",
                         uuid=f"UUID-{i}", driver_version="1.18.0", utilization=util, memory_used_mib=768,
                         memory_total_mib=98304, temperature_c=30, power_w=90, power_max_w=600, timestamp=now)
        for key, value in over.items():
            setattr(s, key, value)
        out.append(s)
    return out


@pytest.fixture
def tab(qtbot):
    services = create_services()
    services.settings.set("devices/interval_s", 0.2)
    widget = DevicesTab(services)
    qtbot.addWidget(widget)
    widget.resize(1200, 900)
    widget.show()
    yield widget
    services.poller.stop()


def text(tab: DevicesTab, row: int, col: str) -> str:
    item = tab.table.item(row, COLUMNS.index(col))
    return item.text() if item else ""


def test_cards_shown_with_generation_and_memory(tab: DevicesTab) -> None:
    tab.poller.feed_samples(cards())
    assert tab.table.rowCount() == 8
    assert text(tab, 0, "Name") == "Gaudi 2 (HL-225)"
    assert text(tab, 3, "Module") == "5" and text(tab, 3, "Bus ID") == "0000:03:00.0"
    assert text(tab, 0, "Power W") == "90 / 600"
    bar = tab.table.cellWidget(0, COLUMNS.index("Memory"))
    assert isinstance(bar, QProgressBar) and "768 / 98304 MiB" in bar.format()
    assert tab.services.selection.kind == "hpu"
    assert tab.services.selection.available == list(range(8))


def test_unknown_values_show_a_dash(tab: DevicesTab) -> None:
    tab.poller.feed_samples(cards(2, temperature_c=None, power_w=None))
    assert text(tab, 1, "Temp °C") == "—" and text(tab, 1, "Power W").startswith("—")


def test_warnings_highlighted(tab: DevicesTab) -> None:
    samples = cards()
    samples[2].temperature_c = 0
    samples[5].temperature_c = 95
    samples[6].utilization = 80
    tab.poller.feed_samples(samples)
    assert "failed to initialise" in text(tab, 2, "Warnings")
    assert text(tab, 5, "Warnings").startswith("hot")
    assert text(tab, 6, "Warnings") == "busy"
    assert text(tab, 0, "Warnings") == ""
    bad = tab.table.item(2, 1).background().color().name()  # type: ignore[union-attr]
    assert bad != tab.table.item(0, 1).background().color().name()  # type: ignore[union-attr]


def test_selection_env_warnings_and_persistence(tab: DevicesTab, qtbot) -> None:
    tab.poller.feed_samples(cards())
    ids = tab.table.row_ids()  # module ids per row
    row_of = {m: r for r, m in enumerate(ids)}
    tab.table.check_row(row_of[0], True)
    assert tab.services.selection.selected == [0]
    assert "HABANA_VISIBLE_MODULES=0" in tab.env_label.text()
    assert "2 or 4 cards" in tab.selection_warning.text()
    tab.table.check_row(row_of[1], True)
    assert tab.services.selection.selected == [0, 1]
    assert tab.selection_warning.text() == ""
    tab.table.check_row(row_of[1], False)
    tab.table.check_row(row_of[2], True)
    assert "not a supported group" in tab.selection_warning.text()
    tab.table.check_row(row_of[2], False)
    tab.table.check_row(row_of[1], True)
    tab.services.selection.claim("training run-1", [1, 2])
    assert "in use by training run-1" in tab.selection_warning.text()
    assert tab.services.settings.get("devices/selected_modules") == [0, 1]
    assert tab.services.selection.env()["HABANA_VISIBLE_MODULES"] == "0,1"


def test_selection_restored_from_settings(qtbot) -> None:
    services = create_services()
    services.settings.set("devices/selected_modules", [4, 5])
    widget = DevicesTab(services)
    qtbot.addWidget(widget)
    services.poller.feed_samples(cards())
    checked = [m for r, m in enumerate(widget.table.row_ids())
               if widget.table.item(r, 0).checkState() == Qt.CheckState.Checked]  # type: ignore[union-attr]
    assert checked == [4, 5]
    assert "HABANA_VISIBLE_MODULES=4,5" in widget.env_label.text()


def test_processes_table(tab: DevicesTab) -> None:
    tab.poller.processes_received.emit([ProcessInfo(index=0, pid=123, name="python", memory_mib=1024,
                                                    user="alice", cmdline="python train.py")])
    assert tab.process_table.rowCount() == 1
    assert tab.process_table.item(0, 5).text() == "python train.py"  # type: ignore[union-attr]


def test_charts_update_in_place(tab: DevicesTab) -> None:
    now = time.time()
    for k in range(60):
        tab.poller.feed_samples(cards(t=now - 60 + k, util=float(k)))
    tab.refresh_now()
    curves = tab.charts.curve_count()
    assert curves == 8 * 4
    items = len(tab.charts.plots["utilization"].getPlotItem().items)
    for k in range(5):
        tab.poller.feed_samples(cards(t=now + k, util=50.0))
        tab.refresh_now()
    assert tab.charts.curve_count() == curves
    assert len(tab.charts.plots["utilization"].getPlotItem().items) == items
    curve = tab.charts._curves[("utilization", "hpu:m2")]
    x, y = curve.getData()
    assert len(x) >= 60 and y[-1] == 50.0
    tab.window_combo.setCurrentIndex(0)  # 1 min
    assert tab.services.settings.get("devices/history_window_s") == 60


def test_state_panel_when_hl_smi_absent(tab: DevicesTab, qtbot, monkeypatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    tab.poller.start()
    qtbot.waitUntil(lambda: tab.state_panel.isVisible() and "host: CPU" in tab.host_label.text(),
                    timeout=15000)
    assert tab.poller.state == dp.STATE_ABSENT
    assert "not found" in tab.state_title.text()
    assert "hl-smi" in tab.state_text.text() and "install" in tab.state_text.text()
    assert "host" in tab.state_text.text()
    assert "CPU" in tab.env_label.text()
    assert tab.table.rowCount() == 1 and text(tab, 0, "Index") == "host"  # the host is still shown


def test_live_with_fake_hl_smi(tab: DevicesTab, fake_hl_smi: Path, qtbot, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "zero_temp")
    tab.poller.start()
    qtbot.waitUntil(lambda: tab.table.rowCount() == 8 and tab.process_table.rowCount() == 2, timeout=15000)
    assert not tab.state_panel.isVisible()
    assert "failed to initialise" in text(tab, 2, "Warnings")
    assert "hl-smi" in tab.source_label.text()


def test_hot_threshold_follows_settings(tab: DevicesTab) -> None:
    tab.services.settings.set("devices/hot_temperature_c", 25.0)
    tab.poller.feed_samples(cards(2))
    assert text(tab, 0, "Warnings").startswith("hot")


def test_stale_values_are_labelled_when_hl_smi_stops(tab: DevicesTab) -> None:
    tab.poller.feed_samples(cards())
    tab.poller.state_changed.emit(dp.STATE_FAILED, "hl-smi -Q ...\nexited with code 1")
    assert tab.state_panel.isVisible() and "exited with code 1" in tab.state_text.text()
    assert "not answering" in tab.source_label.text()

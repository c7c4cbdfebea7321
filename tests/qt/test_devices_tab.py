"""The Devices tab with pytest-qt: cards, warnings, selection and its env, the state panel, charts.

Click, don't call: every control of the tab (card rows, Space, the Retry button, the history combo)
is driven with real mouse and key events, and the tests wait for what a person sees."""

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
from tests.helpers import card_rows, curve_count, is_checked, set_fake_hl_smi, y_range


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


def click_row(qtbot, tab: DevicesTab, row: int, col: str = "Name") -> None:
    """A left click in the middle of a card's cell, as a person does it."""
    item = tab.table.item(row, COLUMNS.index(col))
    assert item is not None
    rect = tab.table.visualItemRect(item)
    qtbot.mouseClick(tab.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def row_of_module(tab: DevicesTab) -> dict[int, int]:
    return card_rows(tab.table)


PROBE_NO_HABANA = {"habana_frameworks": False, "is_torch_hpu_available": False, "cuda_count": 0,
                   "device": "cpu", "executable": "/usr/bin/python3", "packages": {"habana_frameworks": None},
                   "errors": {}}


def test_cards_shown_with_generation_and_memory(tab: DevicesTab) -> None:
    tab.poller.feed_samples(cards())
    assert tab.table.rowCount() == 8
    assert text(tab, 0, "Name") == "Gaudi 2 (HL-225)"
    assert text(tab, 3, "Card") == "■ module 5" and text(tab, 3, "Index") == "3"
    assert text(tab, 3, "Bus ID") == "0000:03:00.0"
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
    assert "failed to initialise" in text(tab, 2, "Health")
    assert text(tab, 5, "Health").startswith("hot")
    # Utilization has its own column: a working card is not "busy" (issue 25 item 7).
    assert text(tab, 6, "Health") == "" and text(tab, 6, "Util %") == "80"
    assert text(tab, 0, "Health") == ""
    bad = tab.table.item(2, 1).background().color().name()  # type: ignore[union-attr]
    assert bad != tab.table.item(0, 1).background().color().name()  # type: ignore[union-attr]


def test_selection_env_warnings_and_persistence(tab: DevicesTab, qtbot) -> None:
    tab.poller.feed_samples(cards())
    row_of = row_of_module(tab)  # module id -> row
    click_row(qtbot, tab, row_of[0])
    qtbot.waitUntil(lambda: "HABANA_VISIBLE_MODULES=0" in tab.env_label.text())
    assert tab.services.selection.selected == [0]
    assert tab.selection_warning.isHidden()  # one card: a single-card job, no partial-server group
    click_row(qtbot, tab, row_of[1])
    qtbot.waitUntil(lambda: tab.services.selection.selected == [0, 1])
    assert tab.selection_warning.text() == ""
    click_row(qtbot, tab, row_of[2], col="Use")
    qtbot.waitUntil(lambda: "2 or 4 cards" in tab.selection_warning.text())
    assert tab.selection_warning.isVisible()
    click_row(qtbot, tab, row_of[1], col="Util %")
    qtbot.waitUntil(lambda: "not a supported group" in tab.selection_warning.text())
    click_row(qtbot, tab, row_of[2])
    click_row(qtbot, tab, row_of[1])
    qtbot.waitUntil(lambda: tab.services.selection.selected == [0, 1])
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
    checked = [m for m, r in card_rows(widget.table).items() if is_checked(widget.table, r)]
    assert checked == [4, 5]
    assert "HABANA_VISIBLE_MODULES=4,5" in widget.env_label.text()


def test_processes_table(tab: DevicesTab) -> None:
    tab.poller.processes_received.emit([ProcessInfo(index=0, pid=123, name="python", memory_mib=1024,
                                                    user="alice", cmdline="python train.py")])
    assert tab.process_table.rowCount() == 1
    assert tab.process_table.item(0, 5).text() == "python train.py"  # type: ignore[union-attr]


def test_charts_update_in_place(tab: DevicesTab, qtbot) -> None:
    now = time.time()
    for k in range(60):
        tab.poller.feed_samples(cards(t=now - 60 + k, util=float(k)))
    tab.refresh_now()
    curves = curve_count(tab.charts.plots)
    assert curves == 8 * 4
    items = len(tab.charts.plots["utilization"].getPlotItem().items)
    for k in range(5):
        tab.poller.feed_samples(cards(t=now + k, util=50.0))
        tab.refresh_now()
    assert curve_count(tab.charts.plots) == curves
    assert len(tab.charts.plots["utilization"].getPlotItem().items) == items
    curve = tab.charts._curves[("utilization", "hpu:m2")]
    x, y = curve.getData()
    assert len(x) >= 60 and y[-1] == 50.0
    tab.window_combo.setFocus()
    qtbot.keyClick(tab.window_combo, Qt.Key.Key_Home)  # the first choice: 1 min
    qtbot.waitUntil(lambda: tab.window_combo.currentText() == "1 min")
    assert tab.services.settings.get("devices/history_window_s") == 60
    assert tab.charts.plots["utilization"].getPlotItem().viewRange()[0][0] == pytest.approx(-60)


def test_state_panel_when_hl_smi_absent(tab: DevicesTab, qtbot, monkeypatch, tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    tab.poller.start()
    qtbot.waitUntil(lambda: tab.state_panel.isVisible() and "host: CPU" in tab.host_label.text(),
                    timeout=15000)
    assert tab.poller.state == dp.STATE_ABSENT
    # The normal case of a CPU machine (issue 25, item 17): said calmly, no error colour, no command
    # line, nothing to retry.
    assert tab.state_title.text() == "No Gaudi software on this machine"
    assert "hl-smi" in tab.state_text.text() and "driver package" in tab.state_text.text()
    assert "host" in tab.state_text.text()
    assert "#fdecea" not in tab.state_panel.styleSheet() and not tab.retry_button.isVisible()
    assert " -Q " not in tab.state_text.text() and "-f csv" not in tab.state_text.text()
    assert "CPU" in tab.env_label.text()
    assert tab.table.rowCount() == 1 and text(tab, 0, "Card") == "host"  # the host is still shown
    # each fact once: not repeated between the title, the text and the source line
    seen = "\n".join([tab.state_title.text(), tab.state_text.text(), tab.source_label.text()])
    assert seen.count("Showing the host") == 1
    lines = tab.state_text.text().splitlines()
    assert len(lines) == len(set(lines))
    # a host-only machine: no empty power and temperature charts
    qtbot.waitUntil(lambda: tab.charts.visible_metrics() == ["utilization", "memory_used_mib"])
    assert tab.charts.plots["power_w"].isHidden() and tab.charts.plots["temperature_c"].isHidden()
    assert tab.charts.memory_total_mib and tab.charts.memory_total_mib > 0  # RAM: 0..total


def test_live_with_fake_hl_smi(tab: DevicesTab, fake_hl_smi: Path, qtbot, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "zero_temp")
    tab.poller.start()
    qtbot.waitUntil(lambda: tab.table.rowCount() == 8 and tab.process_table.rowCount() == 2, timeout=15000)
    assert not tab.state_panel.isVisible()
    assert "failed to initialise" in text(tab, 2, "Health")
    assert "hl-smi" in tab.source_label.text()
    assert tab.charts.visible_metrics() == ["utilization", "memory_used_mib", "power_w", "temperature_c"]


def test_select_cards_by_clicking_with_fake_hl_smi(tab: DevicesTab, fake_hl_smi: Path, qtbot) -> None:
    """The main flow: hl-smi streams the cards, the user clicks two rows, jobs get those modules."""
    tab.poller.start()
    qtbot.waitUntil(lambda: tab.table.rowCount() == 8, timeout=15000)
    row_of = row_of_module(tab)
    click_row(qtbot, tab, row_of[4])
    click_row(qtbot, tab, row_of[5], col="Bus ID")
    qtbot.waitUntil(lambda: "HABANA_VISIBLE_MODULES=4,5" in tab.env_label.text())
    assert is_checked(tab.table, row_of[4]) and is_checked(tab.table, row_of[5])
    assert tab.selection_warning.isHidden()
    assert tab.services.selection.env()["HABANA_VISIBLE_MODULES"] == "4,5"
    assert tab.services.selection.card_count() == 2
    assert tab.services.settings.get("devices/selected_modules") == [4, 5]
    # new snapshots keep the checks (rows are updated in place)
    count = len(tab.poller.history("hpu:m4", "utilization")[0])
    qtbot.waitUntil(lambda: len(tab.poller.history("hpu:m4", "utilization")[0]) > count + 1, timeout=10000)
    assert is_checked(tab.table, row_of[4]) and tab.services.selection.selected == [4, 5]
    click_row(qtbot, tab, row_of[4])
    qtbot.waitUntil(lambda: "HABANA_VISIBLE_MODULES=5" in tab.env_label.text())


def test_click_on_the_check_box_toggles_once(tab: DevicesTab, qtbot) -> None:
    tab.poller.feed_samples(cards(4))
    item = tab.table.item(1, 0)
    assert item is not None
    rect = tab.table.visualItemRect(item)
    qtbot.mouseClick(tab.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    qtbot.waitUntil(lambda: is_checked(tab.table, 1))
    qtbot.mouseClick(tab.table.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())
    qtbot.waitUntil(lambda: not is_checked(tab.table, 1))
    assert tab.services.selection.selected == []


def test_space_toggles_the_current_card(tab: DevicesTab, qtbot) -> None:
    tab.poller.feed_samples(cards(4))
    click_row(qtbot, tab, 2)  # focus + current row, and a check
    qtbot.waitUntil(lambda: is_checked(tab.table, 2))
    qtbot.keyClick(tab.table, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: not is_checked(tab.table, 2))
    qtbot.keyClick(tab.table, Qt.Key.Key_Down)
    qtbot.keyClick(tab.table, Qt.Key.Key_Space)
    qtbot.waitUntil(lambda: is_checked(tab.table, 3))
    third = next(m for m, r in card_rows(tab.table).items() if r == 3)
    assert tab.services.selection.selected == [third]
    assert f"HABANA_VISIBLE_MODULES={third}" in tab.env_label.text()


def test_host_row_is_not_checkable(tab: DevicesTab, qtbot) -> None:
    tab.on_host(DeviceSample(kind="host", index=0, utilization=5, memory_used_mib=1000,
                             memory_total_mib=8000))
    click_row(qtbot, tab, 0, col="Card")
    qtbot.keyClick(tab.table, Qt.Key.Key_Space)
    assert not is_checked(tab.table, 0) and tab.services.selection.selected == []


def test_retry_button_restarts_hl_smi(tab: DevicesTab, fake_hl_smi: Path, qtbot, monkeypatch) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "fail")
    tab.poller.backoff_initial_s = 30.0  # no automatic retry during the test: only the click
    tab.poller.start()
    qtbot.waitUntil(tab.retry_button.isVisible, timeout=15000)
    assert "no Habana devices" in tab.state_text.text()
    set_fake_hl_smi(fake_hl_smi, monkeypatch, FAKE_HLSMI_MODE="normal")  # for the agent's next hl-smi
    qtbot.mouseClick(tab.retry_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: tab.table.rowCount() == 8 and not tab.state_panel.isVisible(), timeout=15000)
    assert "8 card(s) from hl-smi" in tab.source_label.text()


def test_cards_but_no_habana_frameworks_banner(tab: DevicesTab, qtbot) -> None:
    tab.poller.feed_samples(cards())
    click_row(qtbot, tab, row_of_module(tab)[0])
    qtbot.waitUntil(lambda: "HABANA_VISIBLE_MODULES=0" in tab.env_label.text())
    assert tab.runtime_panel.isHidden()
    tab.services.environment.probe_finished.emit(PROBE_NO_HABANA)
    qtbot.waitUntil(tab.runtime_panel.isVisible)
    banner = tab.runtime_panel.text()
    assert "jobs will run on the CPU" in banner and "habana-torch-plugin" in banner
    assert "installer" in banner and "container" in banner
    assert "CPU" in tab.env_label.text() and "HABANA_VISIBLE_MODULES" not in tab.env_label.text()
    selection = tab.services.selection
    assert selection.env() == {} and selection.card_count() == 0 and selection.jobs_kind == "cpu"
    selection.claim("runner")
    assert selection.claims() == {"runner": []}  # a CPU run holds no card
    selection.release("runner")
    tab.services.environment.probe_finished.emit(dict(PROBE_NO_HABANA, habana_frameworks=True,
                                                      is_torch_hpu_available=True, device="hpu"))
    qtbot.waitUntil(tab.runtime_panel.isHidden)
    assert selection.env()["HABANA_VISIBLE_MODULES"] == "0" and selection.card_count() == 1


def test_banner_from_an_earlier_probe(qtbot) -> None:
    services = create_services()
    services.environment._result = PROBE_NO_HABANA  # probed before the tab was built
    widget = DevicesTab(services)
    qtbot.addWidget(widget)
    widget.show()
    services.poller.feed_samples(cards(2))
    qtbot.waitUntil(widget.runtime_panel.isVisible)


def test_memory_chart_is_not_autoscaled_into_noise(tab: DevicesTab, qtbot) -> None:
    now = time.time()
    for k in range(30):
        tab.poller.feed_samples(cards(t=now - 30 + k, memory_used_mib=768 + (k % 2)))  # a flat line
    tab.refresh_now()
    low, high = y_range(tab.charts.plots["memory_used_mib"])
    assert low <= 0 and high >= 98304  # 0..the card's total memory
    assert high < 98304 * 1.1


def test_memory_chart_minimum_span_without_a_total(qtbot) -> None:
    from gaudi_gui.core.devices import History
    from gaudi_gui.ui.device_charts import MIN_MEMORY_SPAN_MIB, DeviceCharts

    charts = DeviceCharts()
    qtbot.addWidget(charts)
    history = History(capacity=100)
    now = time.time()
    for k in range(20):
        history.add([DeviceSample(kind="cuda", index=0, memory_used_mib=5000 + (k % 2), timestamp=now - k)])
    charts.refresh(history, ["cuda:0"], now=now)
    low, high = y_range(charts.plots["memory_used_mib"])
    assert high - low >= MIN_MEMORY_SPAN_MIB and low <= 5000 <= high


def test_unparsable_rows_are_counted_in_the_tab(tab: DevicesTab, fake_hl_smi: Path, qtbot,
                                                monkeypatch) -> None:
    monkeypatch.setenv("FAKE_HLSMI_MODE", "garbage_rows")
    tab.poller.start()
    qtbot.waitUntil(lambda: tab.rejected_label.isVisible() and tab.table.rowCount() == 8, timeout=15000)
    assert "could not be parsed" in tab.rejected_label.text()
    assert "\x1b" not in tab.rejected_label.text()


def test_implausible_values_are_flagged_in_the_table(tab: DevicesTab) -> None:
    samples = cards(3)
    samples[1].utilization = 250
    tab.poller.feed_samples(samples)
    assert text(tab, 1, "Health").startswith("implausible utilization 250")
    bad = tab.table.item(1, 1).background().color().name()  # type: ignore[union-attr]
    assert bad != tab.table.item(0, 1).background().color().name()  # type: ignore[union-attr]


def test_hot_threshold_follows_settings(tab: DevicesTab) -> None:
    tab.services.settings.set("devices/hot_temperature_c", 25.0)
    tab.poller.feed_samples(cards(2))
    assert text(tab, 0, "Health").startswith("hot")


def test_stale_values_are_labelled_when_hl_smi_stops(tab: DevicesTab) -> None:
    tab.poller.feed_samples(cards())
    tab.poller.state_changed.emit(dp.STATE_FAILED, "hl-smi -Q ...\nexited with code 1")
    assert tab.state_panel.isVisible() and "exited with code 1" in tab.state_text.text()
    assert "not answering" in tab.source_label.text()

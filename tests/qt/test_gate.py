"""The start gate, clicked as a person does: cards picked in the Devices tab (the fake hl-smi's sick
8-card server: card 1 ports down, 2 double-bit ECC, 3 at 0 C, 5 power slowdown, 6 held by pid 4242
through a fixture /proc), then Start in the Training tab or Load in the Model runner. The doctor runs
as real children (``python -m gaudi_gui doctor --json``); a host is the real SSH test server."""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from gaudi_gui.app import create_services
from gaudi_gui.core import remote
from gaudi_gui.services import generation_client as gc
from gaudi_gui.services.context import AppServices
from gaudi_gui.ui.device_table import COLUMNS
from gaudi_gui.ui.devices_tab import DevicesTab
from gaudi_gui.ui.runner_tab import RunnerTab
from gaudi_gui.ui.training_tab import TrainingTab
from tests.helpers import (
    card_rows,
    click,
    close_training_tab,
    end_training_tab,
    is_checked,
    set_arg,
    sick_server_env,
    training_tab,
)
from tests.remote.conftest import SshHost, ssh_host  # noqa: F401 (the host that stops answering)

CHECK_MS = 90_000  # the doctor child on 2 loaded cores (about 1 s when idle)
RUN_MS = 240_000


@pytest.fixture
def sick_server(fake_hl_smi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    # A driver in the compatibility table: the stack is checked against its row (this CPU venv gives
    # stack warnings, shown but never asked about); the cards' own warnings are asked about.
    for key, value in {**sick_server_env(tmp_path), "FAKE_HLSMI_DRIVER": "1.23.0"}.items():
        monkeypatch.setenv(key, value)
    return fake_hl_smi


def devices_tab(qtbot: QtBot, services: AppServices) -> DevicesTab:
    """The Devices tab streaming the fake hl-smi's 8 cards (where a person picks the cards)."""
    services.settings.set("devices/interval_s", 0.2)
    tab = DevicesTab(services)
    qtbot.addWidget(tab)
    tab.resize(1200, 700)
    tab.show()
    services.poller.start()
    qtbot.waitUntil(lambda: tab.table.rowCount() == 8, timeout=30000)
    return tab


def pick(qtbot: QtBot, tab: DevicesTab, *modules: int) -> None:
    """Click the cards' rows so that exactly ``modules`` are checked."""
    for module, row in card_rows(tab.table).items():
        if is_checked(tab.table, row) != (module in modules):
            item = tab.table.item(row, COLUMNS.index("Name"))
            assert item is not None
            qtbot.mouseClick(tab.table.viewport(), Qt.MouseButton.LeftButton,
                             pos=tab.table.visualItemRect(item).center())
    qtbot.waitUntil(lambda: tab.services.selection.selected == sorted(modules), timeout=10000)


def start_and_wait_for_the_check(qtbot: QtBot, tab: TrainingTab) -> None:
    click(qtbot, tab.btn["Start"])
    # While the check runs the button says so and cannot be pressed again.
    assert tab.btn["Start"].text() == "Checking cards…" and not tab.btn["Start"].isEnabled()
    qtbot.waitUntil(lambda: tab.btn["Start"].text() == "Start", timeout=CHECK_MS)


def wait_run_end(qtbot: QtBot, tab: TrainingTab) -> None:
    job = tab.job
    qtbot.waitUntil(lambda: job.run is not None, timeout=CHECK_MS)
    qtbot.waitUntil(lambda: not job.is_running(), timeout=RUN_MS)
    assert job.state == "finished", tab.status.text()


@pytest.fixture
def gate_tabs(qtbot: QtBot, tmp_path: Path, sick_server: Path) -> Iterator[tuple[AppServices, TrainingTab,
                                                                                   DevicesTab]]:
    services, tab = training_tab(qtbot, tmp_path)
    devices = devices_tab(qtbot, services)
    yield services, tab, devices
    end_training_tab(qtbot, services, tab)


@pytest.mark.usefixtures("demo_model")
def test_start_refused_on_a_held_card_then_runs_on_free_ones(qtbot: QtBot, gate_tabs: tuple[
        AppServices, TrainingTab, DevicesTab], tmp_path: Path) -> None:
    services, tab, devices = gate_tabs
    assert services.training is not None
    # No output_dir: each of the two runs gets a folder of its own (a second run into the first
    # one's folder is refused at the field).
    set_arg(tab, "max_steps", "1")
    set_arg(tab, "save_steps", "100")

    # Card 6 is held by another process: refused, the reason and the fix under the Host field.
    pick(qtbot, devices, 6, 7)
    start_and_wait_for_the_check(qtbot, tab)
    shown = tab.gate_label.text()
    assert tab.gate_box.isVisible() and not tab.gate_anyway.isVisible()
    assert "Cannot start" in shown and "module 6: held by pid 4242" in shown, shown
    assert "modules 4 and 5 are healthy and free: use them" in shown, shown
    assert "held by pid 4242" in tab.placement.host_combo.toolTip() and tab.placement.host_combo.styleSheet()
    assert tab.status.text().startswith("cannot start: the card check refused the start")
    assert not services.training.jobs and tab.job.run is None  # nothing started
    assert tab.btn["Start"].isEnabled()

    # A card that failed to initialise (0 C): refused too.
    pick(qtbot, devices, 3)
    start_and_wait_for_the_check(qtbot, tab)
    assert "module 3: temperature reads 0 C" in tab.gate_label.text() and not services.training.jobs

    # Card 5 is throttling: a warning, shown, and the user may go on with "Start anyway".
    pick(qtbot, devices, 5)
    start_and_wait_for_the_check(qtbot, tab)
    assert tab.gate_anyway.isVisible() and "power slowdown active" in tab.gate_label.text()
    assert not services.training.jobs
    click(qtbot, tab.gate_anyway)
    assert not tab.gate_box.isVisible()
    wait_run_end(qtbot, tab)

    # Free, healthy cards: Start goes straight through once the check passed; this CPU venv's stack
    # warnings on a 1.23.0 server (no habana-torch-plugin, another torch) are shown, never asked.
    pick(qtbot, devices, 4, 7)
    start_and_wait_for_the_check(qtbot, tab)
    assert not tab.gate_anyway.isVisible()
    assert not tab.gate_box.isVisible() or "passed, with warnings" in tab.gate_label.text()
    assert not re.search(r"card \d", tab.gate_label.text())  # no warning about a chosen card
    assert len(services.training.jobs) == 2
    wait_run_end(qtbot, tab)


@pytest.mark.usefixtures("demo_model")
def test_runner_load_refused_on_a_dead_card(qtbot: QtBot, tmp_path: Path, sick_server: Path) -> None:
    services = create_services()
    devices = devices_tab(qtbot, services)
    runner = RunnerTab(services)
    qtbot.addWidget(runner)
    runner.show()
    try:
        pick(qtbot, devices, 2)  # double-bit ECC with a row replacement pending
        click(qtbot, runner.load_button)
        assert runner.load_button.text() == "Checking cards…" and not runner.load_button.isEnabled()
        qtbot.waitUntil(lambda: "refused" in runner.model_status.text(), timeout=CHECK_MS)
        status = runner.model_status.text()
        assert "module 2: double-bit ECC" in status and "healthy and free: use" in status, status
        assert runner.client.state == gc.STOPPED and not runner.client.is_running()  # no worker
        assert runner.load_button.isEnabled() and runner.host_combo.styleSheet()
    finally:
        runner.shutdown()
        services.poller.stop()


def choose_host(qtbot: QtBot, tab: TrainingTab, name: str) -> None:
    """Open the Host list with a click, walk to ``name`` with the arrow keys, press Return."""
    combo = tab.placement.host_combo
    qtbot.mouseClick(combo, Qt.MouseButton.LeftButton)
    view = combo.view()
    qtbot.waitUntil(view.isVisible, timeout=5000)
    target = combo.findData(name)
    for _ in range(combo.count() + 1):
        row = view.currentIndex().row()
        if row == target:
            break
        qtbot.keyClick(view, Qt.Key.Key_Down if row < target else Qt.Key.Key_Up)
    qtbot.keyClick(view, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not view.isVisible() and combo.currentData() == name, timeout=5000)


def test_a_host_that_does_not_answer_is_named(qtbot: QtBot, ssh_host: SshHost,  # noqa: F811
                                              tmp_path: Path) -> None:
    remote.save_hosts([remote.Host.parse(ssh_host.dest)])
    services, tab = training_tab(qtbot, tmp_path)
    try:
        choose_host(qtbot, tab, ssh_host.dest)
        ssh_host.server.terminate()  # the host goes away
        ssh_host.server.wait(timeout=30)
        start_and_wait_for_the_check(qtbot, tab)
        shown = tab.gate_label.text()
        assert f"{ssh_host.dest} did not answer" in shown, shown
        assert "Cannot start" in shown and services.training is not None and not services.training.jobs
    finally:
        close_training_tab(services, tab)

"""Health at a glance, the Health view and notifications, clicked as a person does.

The doctor runs as a real child (``python -m gaudi_gui doctor --json``) against the fake hl-smi's sick
8-card server (module 1 ports down, module 2 double-bit ECC and a pending row replacement, module 3 at
0 C, module 5 in power slowdown, module 6 held through a fixture /proc); its poller's rows are the same
server's (index 1 is module 6, index 2 module 3...)."""

from __future__ import annotations

import os
import tarfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import QTreeWidgetItem

from gaudi_gui.app import create_services
from gaudi_gui.core.devices import DeviceSample
from gaudi_gui.services.context import AppServices
from gaudi_gui.services.notifier import Notifier
from gaudi_gui.ui.device_table import COLUMNS
from gaudi_gui.ui.health_view import CARD, CHECK, FIX, SEEN, SEVERITY, HealthView
from gaudi_gui.ui.hosts_tab import HEALTH, NAME, STATE
from gaudi_gui.ui.main_window import MainWindow
from tests.helpers import card_rows, choose, click, sick_server_env

DOCTOR_S = 90_000  # ms: the doctor child on 2 loaded cores (about 2 s when idle)



@pytest.fixture
def sick_server(fake_hl_smi: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The sick 8-card server of tests/integration/test_doctor_cli.py, for every child of the test."""
    for key, value in sick_server_env(tmp_path).items():
        monkeypatch.setenv(key, value)
    return fake_hl_smi


@pytest.fixture
def app(qtbot) -> Iterator[MainWindow]:
    """The window as ``gaudi-gui`` opens it: poller and health checks started after it is shown."""
    services = create_services()
    window = MainWindow(services)
    qtbot.addWidget(window)
    window.show()
    services.poller.start()
    assert services.health is not None
    services.health.start()
    yield window
    if not window._shut_down:
        window._shutdown_tabs()


def rows_of(view: HealthView) -> dict[tuple[str, str], tuple[str, ...]]:
    """(card, check) -> the row's text."""
    return {(r[CARD], r[CHECK]): r for r in view.rows()}


def test_sick_server_badge_turns_red_and_opens_the_health_view(qtbot, sick_server: Path,
                                                               app: MainWindow) -> None:
    health = app.services.health
    assert health is not None
    badge = app.devices_tab.health_badge
    assert badge.isVisible()
    qtbot.waitUntil(lambda: badge.property("severity") == "error", timeout=DOCTOR_S)
    assert "error" in badge.text() and "#b3261e" in badge.styleSheet()

    qtbot.mouseClick(badge, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: app.health_view is not None and app.health_view.isVisible(), timeout=5000)
    view = app.health_view
    assert isinstance(view, HealthView) and view.host() == "local"
    rows = rows_of(view)
    ports = rows[("module 1", "net.ports")]
    assert ports[SEVERITY] == "error" and "2,5 DOWN" in ports[SEEN] and ports[FIX]
    ecc = rows[("module 2", "card.ecc")]
    assert ecc[SEVERITY] == "error" and "double-bit ECC 2" in ecc[SEEN] and "reset the card" in ecc[FIX]
    dead = rows[("module 3", "card.init")]
    assert "0 C" in dead[SEEN] and "reset the card" in dead[FIX]
    assert rows[("module 5", "card.throttle")][SEVERITY] == "warning"
    held = rows[("module 6", "busy.held")]
    assert "pid 4242" in held[SEEN] and "choose free cards" in held[FIX]
    assert view.rows()[0][SEVERITY] == "error"  # errors first
    assert all(r[SEVERITY] != "ok" for r in view.rows())  # passed checks hidden until asked for
    assert view.usable_label.text().startswith("Healthy and free: modules 0, 4, 5 and 7")
    # The ECC rise raised an alert, said in the view.
    assert "ECC errors rising" in view.alerts_label.text()

    qtbot.mouseClick(view.show_ok, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: any(r[SEVERITY] == "ok" for r in view.rows()), timeout=2000)

    before = health.checked_at("local")
    qtbot.mouseClick(view.refresh_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not view.refresh_button.isEnabled(), timeout=5000)  # checking…
    qtbot.waitUntil(lambda: view.refresh_button.isEnabled() and health.checked_at("local") != before,
                    timeout=DOCTOR_S)
    assert ("module 1", "net.ports") in rows_of(view)

    qtbot.mouseClick(view.copy_button, Qt.MouseButton.LeftButton)
    copied = QGuiApplication.clipboard().text()
    assert "ERROR" in copied and "module 1" in copied and "-> " in copied


def test_hosts_overview_shows_health_and_opens_the_view(qtbot, sick_server: Path, app: MainWindow) -> None:
    health = app.services.health
    assert health is not None
    tab = app.hosts_tab
    app.tabs.setCurrentWidget(tab)
    item = tab._items["local"]
    qtbot.waitUntil(lambda: "error" in item.text(HEALTH), timeout=DOCTOR_S)
    assert item.data(HEALTH, Qt.ItemDataRole.UserRole) == "error"
    rect = tab.tree.visualItemRect(item)
    x = tab.tree.header().sectionViewportPosition(HEALTH) + 5
    qtbot.mouseClick(tab.tree.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(x, rect.center().y()))
    qtbot.waitUntil(lambda: app.health_view is not None and app.health_view.isVisible(), timeout=5000)
    assert app.health_view is not None and ("module 3", "card.init") in rows_of(app.health_view)


def test_save_report_writes_the_tarball(qtbot, sick_server: Path, app: MainWindow, tmp_path: Path,
                                        monkeypatch: pytest.MonkeyPatch) -> None:
    view = app.show_health("local")
    assert isinstance(view, HealthView)
    target = tmp_path / "report"
    monkeypatch.setattr(view, "choose_report_path", lambda: str(target))
    with qtbot.waitSignal(view.report_saved, timeout=DOCTOR_S) as saved:
        qtbot.mouseClick(view.report_button, Qt.MouseButton.LeftButton)
    assert saved.args == [True, f"{target}.tar.gz"]
    with tarfile.open(f"{target}.tar.gz") as tar:
        names = tar.getnames()
    assert "gaudi-doctor/findings.json" in names and "gaudi-doctor/hl-smi-q.txt" in names
    assert "report written to" in view.status_label.text()


@pytest.fixture
def bare(qtbot) -> Iterator[AppServices]:
    """Services of the window without the window (nothing started)."""
    services = create_services()
    yield services
    assert services.health is not None
    services.health.shutdown()


def _fake_python(tmp_path: Path, body: str) -> str:
    """An executable the agent runs as the doctor's interpreter (its ``python`` argument)."""
    script = tmp_path / "fake-python"
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


def test_a_doctor_that_prints_garbage_is_a_host_that_did_not_answer(qtbot, bare: AppServices,
                                                                    tmp_path: Path) -> None:
    health = bare.health
    assert health is not None
    health.python = _fake_python(tmp_path, "echo 'Segmentation fault? ### not json'; exit 3")
    view = HealthView(health)
    qtbot.addWidget(view)
    view.show()
    qtbot.mouseClick(view.refresh_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: health.health("local") is not None, timeout=30000)
    found = health.health("local")
    assert found is not None and not found.reachable
    assert "exited with code 3" in found.error and "not json" in found.error
    assert health.worst("local") == "error"
    (row,) = view.rows()
    assert row[CHECK] == "host.reachable" and row[SEVERITY] == "error"
    assert "did not answer" in view.status_label.text()


def test_a_doctor_that_hangs_is_killed_after_the_timeout(qtbot, bare: AppServices, tmp_path: Path) -> None:
    health = bare.health
    assert health is not None
    bare.settings.set("health/timeout_s", 5.0)
    health.python = _fake_python(tmp_path, "exec sleep 600")
    health.refresh()
    assert health.is_checking("local")
    qtbot.waitUntil(lambda: health.health("local") is not None, timeout=30000)
    found = health.health("local")
    assert found is not None and not found.reachable and "within 5 s" in found.error
    assert not health.is_checking("local")


def hot(temp: float, n: int = 1) -> list[DeviceSample]:
    return [DeviceSample(kind="hpu", index=i, module_id=i, temperature_c=temp, utilization=50.0,
                         timestamp=time.time()) for i in range(n)]


def test_a_threshold_crossing_notifies(qtbot, bare: AppServices) -> None:
    notifier = bare.notifier
    assert notifier is not None
    with qtbot.waitSignal(notifier.notified, timeout=5000) as shown:
        bare.poller.feed_samples(hot(97))
    title, text = shown.args
    assert title == "Critical" and "module 0 is critical: 97 C" in text
    # Still hot: no second notification; cooled below the margin: cleared, nothing shown.
    with qtbot.assertNotEmitted(notifier.notified):
        bare.poller.feed_samples(hot(96))
        bare.poller.feed_samples(hot(50))
    assert bare.health is not None and bare.health.alerts("local") == []


def test_notifications_turned_off_stop(qtbot, bare: AppServices) -> None:
    notifier = bare.notifier
    assert notifier is not None and bare.health is not None
    view = HealthView(bare.health)
    qtbot.addWidget(view)
    view.show()
    assert view.notify_box.isChecked()
    qtbot.mouseClick(view.notify_box, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: bare.settings.get("notifications/enabled") is False, timeout=2000)
    with qtbot.assertNotEmitted(notifier.notified), qtbot.waitSignal(notifier.suppressed) as held:
        bare.poller.feed_samples(hot(97))
    assert held.args[1] == "notifications are turned off"
    assert notifier.history == []


def test_rate_limit_holds_back_and_says_so_later(qtbot, bare: AppServices) -> None:
    now = [1000.0]
    notifier = Notifier(bare.settings, clock=lambda: now[0])
    bare.settings.set("notifications/max_per_window", 2)
    bare.settings.set("notifications/window_s", 60.0)
    shown: list[tuple[str, str]] = []
    notifier.notified.connect(lambda title, text: shown.append((title, text)))
    assert bare.health is not None
    notifier.watch_health(bare.health)
    bare.poller.feed_samples(hot(97, n=3))  # three cards at once: three alerts
    assert len(shown) == 2
    now[0] += 61
    assert notifier.notify("Run demo-1 finished", "Finished at step 10")
    assert shown[-1][1].endswith("(+1 more not shown: see the Health view)")


def test_an_ended_run_notifies_its_outcome(qtbot, bare: AppServices) -> None:
    bare.ensure_training()
    assert bare.training is not None and bare.notifier is not None

    class Ended:
        state = "failed"
        summary = "Failed at step 3: CUDA out of memory\n(more)"
        name = "demo-7"

    with qtbot.waitSignal(bare.notifier.notified, timeout=2000) as shown:
        bare.training.job_finished.emit(Ended())
    assert shown.args == ["Run demo-7 failed", "Failed at step 3: CUDA out of memory"]


def test_copy_report_puts_the_redacted_report_on_the_clipboard(qtbot, sick_server: Path,
                                                              app: MainWindow) -> None:
    import psutil

    from gaudi_gui.core.jobconfig import JobConfig
    from gaudi_gui.core.runstore import RunStore
    run = RunStore().create(JobConfig())  # a running run of this test's GAUDI_GUI_HOME
    # Its launcher is this test process (alive), so the app's run reconciling leaves it running.
    run.update_status(state="running", pid=os.getpid(), pid_create_time=psutil.Process().create_time())
    token = "hf_" + "Zy9Xw8Vu7T" * 3
    run.log_path.write_text(f"step 1\nHF_TOKEN={token}\nstep 7 loss 0.25\n")
    view = app.show_health("local")
    assert isinstance(view, HealthView)
    QGuiApplication.clipboard().setText("")
    qtbot.mouseClick(view.copy_report_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "report copied to the clipboard" in view.status_label.text(), timeout=DOCTOR_S)
    copied = QGuiApplication.clipboard().text()
    for part in ("findings.txt", "versions.json", "hl-smi-q.txt", "kernel.txt", "runs.txt"):
        assert f"==== gaudi-doctor/{part} ====" in copied, part
    assert "Double Bit ECC          : 2" in copied  # hl-smi -q in full
    assert "ERROR   module 6" in copied and "held by pid 4242" in copied
    assert "step 7 loss 0.25" in copied and token not in copied  # the run's last lines, redacted
    assert view.copy_report_button.isEnabled()


# -- issue 25 items 5-8: the doctor's word in every view, one name per card, which cards to use ------


@pytest.fixture
def old_firmware(monkeypatch: pytest.MonkeyPatch) -> None:
    """Module 7 of the sick server runs firmware 1.16.0 under the 1.18.0 driver (before the doctor
    starts: list it before ``app``)."""
    monkeypatch.setenv("FAKE_HLSMI_DRIVER", "1.18.0")
    monkeypatch.setenv("FAKE_HLSMI_FIRMWARE", "7=1.16.0")


def devices_health(app: MainWindow, module: int) -> tuple[str, str, str]:
    """(text, severity, tooltip) of the Health cell of a module's row in the Devices table."""
    table = app.devices_tab.table
    item = table.item(card_rows(table)[module], COLUMNS.index("Health"))
    assert item is not None
    return item.text(), str(item.data(Qt.ItemDataRole.UserRole) or ""), item.toolTip()


def card_item(app: MainWindow, module: int) -> QTreeWidgetItem:
    """The Hosts tab's row of a module of the local host."""
    host = app.hosts_tab._items["local"]
    children = [c for c in (host.child(i) for i in range(host.childCount())) if c is not None]
    (child,) = [c for c in children if c.text(NAME) == f"module {module}"]
    return child


def test_each_devices_row_says_the_doctors_worst_finding_in_words_and_colour(
        qtbot, sick_server: Path, old_firmware: None, app: MainWindow) -> None:
    """Item 5: the rows said "busy" for ECC, slowdown, ports down and odd firmware alike."""
    table = app.devices_tab.table
    qtbot.waitUntil(lambda: len(card_rows(table)) == 8 and devices_health(app, 2)[0] != "", timeout=DOCTOR_S)
    assert devices_health(app, 2)[:2] == ("double-bit ECC 2, row replacement pending: Yes", "error")
    assert devices_health(app, 1)[:2] == ("ports 2,5 DOWN", "error")
    dead = devices_health(app, 3)
    assert "0 C" in dead[0] and "failed to initialise" in dead[0] and dead[1] == "error"
    assert devices_health(app, 5)[:2] == ("power slowdown active", "warning")
    assert devices_health(app, 6)[:2] == ("held by pid 4242 (python3 train.py)", "error")
    assert devices_health(app, 7)[:2] == ("firmware 1.16.0, the driver is 1.18.0", "error")
    assert devices_health(app, 0)[:2] == ("healthy, free", "ok")
    # The fix is in the tooltip; no row calls a card "busy"; the colour follows the severity.
    assert "reset the card (hl-smi -r)" in devices_health(app, 2)[2]
    assert not any("busy" in devices_health(app, m)[0] for m in range(8))
    colour = {m: table.item(card_rows(table)[m], COLUMNS.index("Name")).background().color().name()  # type: ignore[union-attr]
              for m in (0, 2, 5)}
    assert colour[2] == "#f8d0d0" and colour[5] == "#fff0c8" and colour[0] not in (colour[2], colour[5])


def test_a_card_has_one_name_in_every_view_alert_and_notification(qtbot, sick_server: Path,
                                                                 app: MainWindow) -> None:
    """Item 6: alerts said "card 2" (module), the Devices table led with the index, findings said
    "card 2 (index 0)", the Hosts tab "hpu 0 (module 2)". Module 2 (index 0) has double-bit ECC."""
    assert app.services.notifier is not None
    table = app.devices_tab.table
    qtbot.waitUntil(lambda: len(card_rows(table)) == 8 and devices_health(app, 2)[1] == "error",
                    timeout=DOCTOR_S)
    row = card_rows(table)[2]
    assert table.item(row, COLUMNS.index("Card")).text() == "■ module 2"  # type: ignore[union-attr]
    assert table.item(row, COLUMNS.index("Index")).text() == "0"  # type: ignore[union-attr]
    # The alert and its notification.
    notifier = app.services.notifier
    qtbot.waitUntil(lambda: any("ECC" in text for _t, text in notifier.history), timeout=5000)
    (note,) = [text for _t, text in notifier.history if "ECC" in text]
    assert note.startswith("module 2: ECC errors rising to 2")
    # The Health view's findings and alert lines.
    click(qtbot, app.devices_tab.health_badge)
    qtbot.waitUntil(lambda: app.health_view is not None and app.health_view.isVisible(), timeout=5000)
    view = app.health_view
    assert view is not None and ("module 2", "card.ecc") in rows_of(view)
    assert "⚠ module 2: ECC errors rising to 2" in view.alerts_label.text()
    # The Hosts tab's card row; the processes table names the held card as the rows do.
    app.tabs.setCurrentWidget(app.hosts_tab)
    qtbot.waitUntil(lambda: app.hosts_tab._items["local"].childCount() == 8, timeout=10000)
    qtbot.waitUntil(lambda: card_item(app, 2).text(STATE).startswith("double-bit ECC 2"), timeout=10000)
    assert card_item(app, 2).toolTip(NAME).startswith("index 0")
    procs = app.devices_tab.process_table
    qtbot.waitUntil(lambda: procs.rowCount() >= 1, timeout=10000)
    assert [procs.item(r, 0).text() for r in range(procs.rowCount())  # type: ignore[union-attr]
            if procs.item(r, 1).text() == "4242"] == ["module 6"]  # type: ignore[union-attr]


def test_every_view_says_which_cards_are_healthy_and_free_and_the_picker_checks_them(
        qtbot, sick_server: Path, app: MainWindow) -> None:
    """Item 7: Devices said all 8 "busy", Health "free cards ...; free healthy groups: none", Hosts
    "idle" for the held and the dead card and "ok" for the host beside 6 errors."""
    tab = app.devices_tab
    usable = ("healthy and free: modules 0, 4, 5 and 7 (module 5: power slowdown active); "
              "for 2 cards: modules 4 and 5; for 4 cards: none of 0,1,2,3 / 4,5,6,7")
    qtbot.waitUntil(lambda: tab.usable_label.text().startswith("H" + usable[1:]), timeout=DOCTOR_S)
    # Shown once the cards are known (the agent's loop's first snapshot may follow the doctor's report).
    qtbot.waitUntil(tab.usable_label.isVisible, timeout=30000)
    # The Health view and the Hosts tab say the same.
    click(qtbot, tab.health_badge)
    qtbot.waitUntil(lambda: app.health_view is not None and app.health_view.isVisible(), timeout=5000)
    assert app.health_view is not None and app.health_view.usable_label.text() == "H" + usable[1:]
    app.tabs.setCurrentWidget(app.hosts_tab)
    host = app.hosts_tab._items["local"]
    qtbot.waitUntil(lambda: host.text(STATE) == f"connected · {usable}", timeout=10000)
    qtbot.waitUntil(lambda: host.childCount() == 8, timeout=10000)
    assert card_item(app, 6).text(STATE) == "held by pid 4242 (python3 train.py)"
    assert "failed to initialise" in card_item(app, 3).text(STATE)
    assert card_item(app, 0).text(STATE) == "healthy, free"
    assert "4 healthy and free" in host.text(NAME)
    # The card picker: all healthy and free cards, then the pair for a 2-card job; none for 4.
    app.tabs.setCurrentWidget(tab)
    selection = app.services.selection
    click(qtbot, tab.pick_button)
    qtbot.waitUntil(lambda: selection.selected == [0, 4, 5, 7], timeout=5000)
    choose(qtbot, tab.pick_size, 2)
    click(qtbot, tab.pick_button)
    qtbot.waitUntil(lambda: selection.selected == [4, 5], timeout=5000)
    assert "HABANA_VISIBLE_MODULES=4,5" in tab.env_label.text()
    assert app.services.settings.get("devices/selected_modules") == [4, 5]
    choose(qtbot, tab.pick_size, 4)
    assert not tab.pick_button.isEnabled() and "no healthy and free cards fit" in tab.pick_button.toolTip()


@pytest.fixture
def q_without_cards(sick_server: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The server's hl-smi answers -q with its header alone (set before the window starts its doctor)."""
    monkeypatch.setenv("FAKE_HLSMI_MODE", "q_no_cards")


def test_an_hl_smi_q_without_cards_is_said_and_never_contradicts_devices(
        qtbot, q_without_cards: None, app: MainWindow) -> None:
    """Item 7: hl-smi answers ``-q`` (exit 0) with no per-card section while its device query gives
    Devices 8 cards. Health said "hl-smi -q failed (exit 0): no cards in its output … no Gaudi cards";
    it now says what happened, names the 8 cards Devices shows, and calls none of them free."""
    table = app.devices_tab.table
    badge = app.devices_tab.health_badge
    qtbot.waitUntil(lambda: len(card_rows(table)) == 8 and badge.property("severity") == "error",
                    timeout=DOCTOR_S)
    qtbot.mouseClick(badge, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: app.health_view is not None and app.health_view.isVisible(), timeout=5000)
    view = app.health_view
    assert isinstance(view, HealthView)
    said = rows_of(view)[("", "stack.hl-smi")]
    assert said[SEVERITY] == "error" and "failed" not in said[SEEN]
    assert "answered (exit 0) with no per-card section" in said[SEEN]
    assert "its device query lists 8 cards (modules 0, 1, 2, 3, 4, 5, 6 and 7)" in said[SEEN]
    assert "no Gaudi cards" not in view.status_label.text()
    assert view.usable_label.text() == "Healthy and free: none"

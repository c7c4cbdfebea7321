"""Health of hosts over the real SSH test server, seen in the Hosts overview and the Health view.

Two hosts (two aliases of the test server; the second one's remote command makes the fake hl-smi
report another driver) each get their own doctor child, in parallel. (A host that does not answer is
tested with a doctor child that fails in tests/qt/test_health_view.py: here every alias of the test
server shares the first one's multiplexed ssh connection, so even a refused key gets through.)"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from PySide6.QtCore import QPoint, Qt

from gaudi_gui.app import create_services
from gaudi_gui.core.remote import Host, save_hosts
from gaudi_gui.ui.health_view import CHECK, SEVERITY, HealthView
from gaudi_gui.ui.hosts_tab import HEALTH, HostsTab
from gaudi_gui.ui.main_window import MainWindow
from tests.remote.conftest import SshHost

HOST_B = "gg-remote-b"
DOCTOR_MS = 120_000


@pytest.fixture
def window(qtbot) -> Iterator[MainWindow]:
    services = create_services()
    win = MainWindow(services)
    qtbot.addWidget(win)
    win.show()
    assert services.health is not None
    services.health.start()
    yield win
    if not win._shut_down:
        win._shutdown_tabs()


def click_health(qtbot, tab: HostsTab, name: str) -> None:
    item = tab._items[name]
    rect = tab.tree.visualItemRect(item)
    x = tab.tree.header().sectionViewportPosition(HEALTH) + 5
    qtbot.mouseClick(tab.tree.viewport(), Qt.MouseButton.LeftButton, pos=QPoint(x, rect.center().y()))


def test_hosts_health_in_parallel_and_opened_from_the_overview(qtbot, ssh_host: SshHost,
                                                                window: MainWindow) -> None:
    # The second alias is another machine: its own state folder, so its own agent (one per machine,
    # user and state folder), whose doctor sees its own driver.
    other = ssh_host.home.parent / "remote-home-b"
    other.mkdir()
    save_hosts([Host.parse(HOST_B, remote_command=f"env GAUDI_GUI_HOME={other} FAKE_HLSMI_DRIVER=1.18.0 "
                                                  "python3 -m gaudi_gui")])
    health = window.services.health
    assert health is not None
    tab = window.hosts_tab
    window.tabs.setCurrentWidget(tab)
    qtbot.keyClicks(tab.dest_edit, ssh_host.dest)
    qtbot.mouseClick(tab.add_button, Qt.MouseButton.LeftButton)
    assert {ssh_host.dest, HOST_B} <= set(health.hosts())
    # Checked side by side: every host's child is running at once.
    qtbot.waitUntil(lambda: all(health.is_checking(h) or health.health(h) is not None
                                for h in (ssh_host.dest, HOST_B)), timeout=5000)

    qtbot.waitUntil(lambda: all(health.health(h) is not None for h in (ssh_host.dest, HOST_B)),
                    timeout=DOCTOR_MS)
    a, b = (health.health(h) for h in (ssh_host.dest, HOST_B))
    assert a is not None and a.reachable and a.versions["driver"].startswith("1.12.1")
    assert b is not None and b.reachable and b.versions["driver"].startswith("1.18.0")
    assert all(f.host == HOST_B for f in b.findings)
    # The test server has no /dev/accel nodes for the fake's 8 cards: an error the overview shows.
    assert "error" in tab._items[ssh_host.dest].text(HEALTH)

    click_health(qtbot, tab, HOST_B)
    qtbot.waitUntil(lambda: window.health_view is not None and window.health_view.isVisible(), timeout=5000)
    view = window.health_view
    assert isinstance(view, HealthView) and view.host() == HOST_B
    assert any(r[CHECK] == "stack.devices" and r[SEVERITY] == "error" for r in view.rows())

    click_health(qtbot, tab, ssh_host.dest)
    qtbot.waitUntil(lambda: view.host() == ssh_host.dest, timeout=5000)

    # A host removed from the overview is no longer checked.
    qtbot.mouseClick(tab.tree.viewport(), Qt.MouseButton.LeftButton,
                     pos=tab.tree.visualItemRect(tab._items[HOST_B]).center())
    qtbot.mouseClick(tab.remove_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: HOST_B not in health.hosts(), timeout=5000)
    window._shutdown_tabs()
    assert ssh_host.wait_no_processes(but_agent=True) == []  # the host's agent stays

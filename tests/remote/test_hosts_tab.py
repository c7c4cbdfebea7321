"""The Hosts tab against a real SSH server: added by clicking, every card of the host shown, the
host's full panel opened, a dropped connection shown as a state and recovered, nothing left on the
host after the tab is shut down."""

from __future__ import annotations

from typing import cast

from PySide6.QtCore import Qt

from gaudi_gui import __version__
from gaudi_gui.app import create_services
from gaudi_gui.core import remote
from gaudi_gui.services import device_poller as dp
from gaudi_gui.ui.devices_tab import DevicesTab
from gaudi_gui.ui.hosts_tab import MEMORY, STATE, UTIL, VERSION, HostsTab
from tests.remote.conftest import SshHost


def click_item(qtbot, tab: HostsTab, item) -> None:
    rect = tab.tree.visualItemRect(item)
    qtbot.mouseClick(tab.tree.viewport(), Qt.MouseButton.LeftButton, pos=rect.center())


def test_add_host_watch_its_cards_open_panel_survive_a_drop(qtbot, ssh_host: SshHost) -> None:
    services = create_services()
    services.settings.set("devices/interval_s", 0.2)
    tab = HostsTab(services)
    qtbot.addWidget(tab)
    tab.resize(1200, 800)
    tab.show()
    # The alias of the ssh config is offered, not connected to.
    assert ssh_host.dest in tab._items and tab.hosts.poller(ssh_host.dest) is None
    assert "not watched" in tab._items[ssh_host.dest].text(STATE)

    qtbot.keyClicks(tab.dest_edit, "-oProxyCommand=touch /tmp/x")
    qtbot.mouseClick(tab.add_button, Qt.MouseButton.LeftButton)
    assert tab.error_label.isVisible() and "cannot begin with '-'" in tab.error_label.text()
    assert remote.saved_hosts() == []

    # A remote command with no gaudi-gui behind it: the handshake says so, with the fix.
    tab.dest_edit.clear()
    qtbot.keyClicks(tab.dest_edit, ssh_host.dest)
    qtbot.keyClicks(tab.command_edit, "python3 -m no_such_module")
    qtbot.mouseClick(tab.add_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: "missing" in tab._items[ssh_host.dest].text(VERSION), timeout=30000)
    assert f"gaudi-gui hosts --setup {ssh_host.dest}" in tab._items[ssh_host.dest].toolTip(VERSION)

    qtbot.keyClicks(tab.dest_edit, ssh_host.dest)  # added again, with the default remote command
    qtbot.mouseClick(tab.add_button, Qt.MouseButton.LeftButton)
    assert not tab.error_label.isVisible()
    assert [h.name for h in remote.saved_hosts()] == [ssh_host.dest]
    qtbot.waitUntil(lambda: tab._items[ssh_host.dest].text(VERSION) == __version__, timeout=30000)
    assert "transformers" in tab._items[ssh_host.dest].toolTip(VERSION)
    poller = tab.hosts.poller(ssh_host.dest)
    assert poller is not None
    poller.backoff_initial_s = 0.2
    states: list[str] = []
    poller.state_changed.connect(lambda state, _m: states.append(state))
    item = tab._items[ssh_host.dest]
    qtbot.waitUntil(lambda: tab._items[ssh_host.dest].childCount() == 8
                    and tab._items[ssh_host.dest].text(STATE).startswith("connected"), timeout=30000)
    item = tab._items[ssh_host.dest]
    card = item.child(0)
    assert card is not None
    # Index 0 of the recorded server is module 2: the card's one name, the index in its tooltip.
    assert card.text(0) == "module 2" and card.toolTip(0).startswith("index 0")
    assert card.text(UTIL) != "—" and "GiB" in card.text(MEMORY)
    assert "8 cards" in item.text(0) and "GiB" in item.text(MEMORY)

    click_item(qtbot, tab, item)
    assert tab.selected_host() == ssh_host.dest and tab.remove_button.isEnabled()
    qtbot.mouseClick(tab.open_button, Qt.MouseButton.LeftButton)
    panel = cast(DevicesTab, tab._panels[ssh_host.dest])
    qtbot.waitUntil(lambda: panel.isVisible() and panel.table.rowCount() == 8, timeout=20000)

    ssh_host.drop()  # the network goes: a state of the row, then it comes back by itself
    qtbot.waitUntil(lambda: dp.STATE_UNREACHABLE in states or dp.STATE_FAILED in states, timeout=20000)
    qtbot.waitUntil(lambda: poller.state == dp.STATE_OK
                    and tab._items[ssh_host.dest].text(STATE).startswith("connected"), timeout=30000)

    click_item(qtbot, tab, tab._items[ssh_host.dest])
    qtbot.mouseClick(tab.remove_button, Qt.MouseButton.LeftButton)
    assert remote.saved_hosts() == [] and tab.hosts.poller(ssh_host.dest) is None
    assert "not watched" in tab._items[ssh_host.dest].text(STATE)  # still an alias of the config
    tab.shutdown()
    services.poller.stop()
    assert ssh_host.wait_no_processes(20, but_agent=True) == []  # the host's agent stays


def test_set_up_host_by_clicking(qtbot, ssh_host: SshHost, tmp_path) -> None:
    import sys
    from pathlib import Path
    services = create_services()
    tab = HostsTab(services)
    qtbot.addWidget(tab)
    tab.show()
    python = str(Path(sys.base_prefix) / "bin" / "python3")  # a plain interpreter, as on a new host
    venv = tmp_path / "host venv"
    tab.setup_options = ("--venv", str(venv), "--python", python, "--no-deps")
    # First a host whose key is refused (before any connection to the server exists: ssh would
    # otherwise multiplex over the open one, as it does for any alias of the same user@host:port).
    click_item(qtbot, tab, tab._items["gg-nokey"])
    qtbot.mouseClick(tab.setup_button, Qt.MouseButton.LeftButton)
    assert not tab.setup_button.isEnabled() and "setting up gg-nokey" in tab.setup_status.text()
    qtbot.waitUntil(lambda: not tab.hosts.setup_running(), timeout=120000)
    assert "set-up failed" in tab.setup_status.text() and "ssh-copy-id gg-nokey" in tab.setup_status.text()
    assert remote.saved_hosts() == []

    click_item(qtbot, tab, tab._items[ssh_host.dest])
    assert tab.setup_button.isEnabled()
    qtbot.mouseClick(tab.setup_button, Qt.MouseButton.LeftButton)
    qtbot.waitUntil(lambda: not tab.hosts.setup_running(), timeout=240000)
    assert "set up; reconnecting" in tab.setup_status.text(), tab.setup_status.text()
    saved = remote.saved_hosts()
    assert [h.name for h in saved] == [ssh_host.dest] and str(venv) in saved[0].remote_command
    assert tab.hosts.poller(ssh_host.dest) is not None  # watched through the new remote command
    tab.shutdown()
    services.poller.stop()
    assert ssh_host.wait_no_processes(20, but_agent=True) == []  # the host's agent stays

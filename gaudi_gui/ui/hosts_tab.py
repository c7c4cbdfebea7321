"""Hosts: every machine's cards at once, the way a person watches a rack.

One row per host ("local" first, then the saved hosts, then ~/.ssh/config aliases not added yet),
its cards beneath it, each by its one name ("module 3"): utilization, memory, temperature and power,
and in its State the doctor's worst finding for it (held, failed to initialise, ECC, ports down…) or
"healthy, free". The host's State says which cards a job should use there ("connected · healthy and
free: modules 0, 4 and 7; for 2 cards: …"). A sick card, a failing hl-smi and an unreachable host
stand out; a lost connection is a state of its row (retried with
back-off by the host's poller), never a dialog. "Open panel" (or a double-click) opens the host's
full Devices panel in a window of its own. The add row takes a destination exactly as ``ssh DEST``
does, and the command that runs gaudi-gui there; a bad one is refused at the field.

The tab binds to ``AppServices.hosts`` (``services.hosts.HostsService``): the host list, pollers,
handshakes and "Set up host" (``hosts --setup`` as the service's child) are the service's; the tab
starts no process and reads no file.
"""

from __future__ import annotations

import contextlib
import dataclasses
from typing import Any

from PySide6.QtCore import QObject, Qt
from PySide6.QtGui import QBrush, QColor, QFont
from PySide6.QtWidgets import (
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QTreeWidget,
    QTreeWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core.devices import DeviceSample, card_detail, sample_name
from gaudi_gui.core.remote import DEFAULT_REMOTE_COMMAND, LOCAL, HostError
from gaudi_gui.services import device_poller as dp
from gaudi_gui.services.context import AppServices

COLUMNS = ("Host / card", "Util %", "Memory", "Temp °C", "Power W", "gaudi-gui", "Health", "Queue", "State")
#: Column indexes (the numbers sit next to the names; the state, which can be a long line, is last).
NAME, UTIL, MEMORY, TEMP, POWER, VERSION, HEALTH, QUEUE, STATE = range(len(COLUMNS))
_LABEL_ROLE = int(Qt.ItemDataRole.UserRole) + 1
_BAD = QColor("#b3261e")
_WARN = QColor("#b26a00")
_IDLE = QColor("#6b6b6b")


class _QueueRow(QObject):
    """Shows one row's queue length when its queue service changes. A child of the tab: when the tab
    goes, Qt drops these connections with it. A lambda connected to the (longer-lived) service
    outlived the tab and wrote to its deleted rows ("Internal C++ object already deleted", seen in
    a full run under load)."""

    def __init__(self, tab: HostsTab, name: str) -> None:
        super().__init__(tab)
        self._tab = tab
        self._name = name

    def changed(self, *_args: object) -> None:
        self._tab._show_queue(self._name)


class HostsTab(QWidget):
    def __init__(self, services: AppServices, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.services = services
        self.hosts = services.ensure_hosts(services.settings.parent())
        self._panels: dict[str, QWidget] = {}

        self.dest_edit = QLineEdit()
        self.dest_edit.setPlaceholderText("ssh destination: alias, user@host or host:port")
        self.dest_edit.setObjectName("host_dest")
        self.command_edit = QLineEdit()
        self.command_edit.setPlaceholderText(f"remote command (default: {DEFAULT_REMOTE_COMMAND})")
        self.hl_smi_edit = QLineEdit()
        self.hl_smi_edit.setPlaceholderText("hl-smi on the host (default: on its PATH)")
        self.add_button = QPushButton("&Add host")
        self.add_button.clicked.connect(lambda: self.add_host())  # noqa: PLW0108
        self.dest_edit.returnPressed.connect(lambda: self.add_host())  # noqa: PLW0108
        self.error_label = QLabel("")
        self.error_label.setStyleSheet("color: #b3261e")
        self.error_label.setWordWrap(True)
        self.error_label.hide()

        self.tree = QTreeWidget()
        self.tree.setColumnCount(len(COLUMNS))
        self.tree.setHeaderLabels(list(COLUMNS))
        self.tree.setRootIsDecorated(True)
        self.tree.setUniformRowHeights(True)
        # Columns are fitted to their contents when a host's card rows first appear (and on rebuild),
        # not on every sample: a ResizeToContents header measures every row at each of 4 hosts x 8
        # cards' updates a second (a 35 ms stall measured); the state column takes the rest.
        self.tree.header().setStretchLastSection(True)
        self.tree.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.tree.itemDoubleClicked.connect(lambda item, _col: self.open_panel(self._host_of(item)))
        self.tree.itemClicked.connect(self._on_item_clicked)
        self.tree.itemSelectionChanged.connect(self._update_buttons)
        self.open_button = QPushButton("&Open panel")
        self.open_button.clicked.connect(lambda: self.open_panel(self.selected_host()))
        self.remove_button = QPushButton("&Remove host")
        self.remove_button.clicked.connect(lambda: self.remove_host(self.selected_host()))
        self.setup_button = QPushButton("&Set up host")
        self.setup_button.setToolTip("install this gaudi-gui version on the host: a venv that sees the "
                                     "host's torch (--system-site-packages), from a wheel built here")
        self.setup_button.clicked.connect(
            lambda: self.setup_host(self.selected_host(), self.setup_options))
        self.setup_status = QLabel("")
        self.setup_status.setWordWrap(True)
        # `gaudi-gui hosts --setup DEST` runs as the service's child: building and copying a wheel,
        # pip on the host.
        self.hosts.setup_progressed.connect(self._on_setup_line)
        self.hosts.setup_finished.connect(self._on_setup_finished)
        #: More ``hosts --setup`` options (``--venv``, ``--python``, ``--no-deps``) for the button.
        self.setup_options: tuple[str, ...] = ()

        form = QHBoxLayout()
        form.addWidget(self.dest_edit, 3)
        form.addWidget(self.command_edit, 3)
        form.addWidget(self.hl_smi_edit, 2)
        form.addWidget(self.add_button)
        actions = QHBoxLayout()
        actions.addWidget(self.open_button)
        actions.addWidget(self.remove_button)
        actions.addWidget(self.setup_button)
        actions.addWidget(self.setup_status, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.error_label)
        layout.addWidget(self.tree, 1)
        layout.addLayout(actions)

        self._items: dict[str, QTreeWidgetItem] = {}
        #: The hosts whose queue this tab watches (the host agent's ``queue`` events through this
        #: machine's agent, once its gaudi-gui answered the handshake; this machine's through
        #: ``services.queue``).
        self._queues: set[str] = set()
        #: (signal, slot) of the queue services, which outlive this tab: disconnected at shutdown.
        self._queue_slots: list[tuple[Any, Any]] = []
        #: The connection's word per host (the poller's state), before what the doctor adds to it.
        self._states: dict[str, tuple[str, str]] = {}
        self.hosts.changed.connect(self._rebuild)
        self.hosts.samples_received.connect(self._show_cards)
        self.hosts.state_changed.connect(self._show_state)
        self.hosts.handshake_finished.connect(self._show_handshake)
        if services.health is not None:
            services.health.report_changed.connect(self._show_health)
            services.health.alerts_changed.connect(self._show_health)
            services.health.checking_changed.connect(self._on_health_checking)
        if services.queue is not None:
            self.bind_local_queue(services.queue)
        self.hosts.start()
        self._rebuild()

    # -- actions ----------------------------------------------------------------------------------

    def add_host(self) -> None:
        try:
            host = self.hosts.add(self.dest_edit.text(), self.command_edit.text(), self.hl_smi_edit.text())
        except HostError as exc:
            self.error_label.setText(str(exc))
            self.error_label.show()
            self.dest_edit.setFocus()
            return
        except OSError as exc:
            self.error_label.setText(f"cannot save the host list: {exc}")
            self.error_label.show()
            return
        self.error_label.hide()
        self.dest_edit.clear()
        self.command_edit.clear()
        self.hl_smi_edit.clear()
        item = self._items.get(host.name)
        if item is not None:
            self.tree.setCurrentItem(item)

    def remove_host(self, name: str | None) -> None:
        if not name or name == LOCAL:
            return
        panel = self._panels.pop(name, None)
        if panel is not None:
            panel.close()
        self.hosts.remove(name)
        if self.services.health is not None:
            self.services.health.unwatch_host(name)

    def setup_host(self, name: str | None, extra: tuple[str, ...] = ()) -> bool:
        """Install this gaudi-gui on the host (``gaudi-gui hosts --setup``); False when one runs."""
        if not name or not self.hosts.setup(name, extra):
            return False
        self.setup_status.setText(f"setting up {name}…")
        self.setup_status.setStyleSheet("")
        self.setup_button.setEnabled(False)
        return True

    def _on_setup_line(self, name: str, line: str) -> None:
        self.setup_status.setText(f"{name}: {line}")

    def _on_setup_finished(self, name: str, ok: bool, why: str) -> None:
        if ok:
            # The service read the new remote command and connects through it.
            self.setup_status.setText(f"{name}: gaudi-gui set up; reconnecting")
        else:
            self.setup_status.setText(f"{name}: set-up failed — {why}")
            self.setup_status.setStyleSheet("color: #b3261e")
        self._update_buttons()

    def selected_host(self) -> str | None:
        item = self.tree.currentItem()
        return self._host_of(item) if item is not None else None

    def open_panel(self, name: str | None) -> QWidget | None:
        """The host's Devices panel in a window of its own (the main window's tab for "local")."""
        if not name:
            return None
        poller = self.hosts.poller(name)
        if poller is None:
            # An alias not added yet: adding it is what connects to it.
            try:
                self.hosts.add(name)
            except HostError as exc:
                self.error_label.setText(str(exc))
                self.error_label.show()
                return None
            poller = self.hosts.poller(name)
        if name == LOCAL:
            window = self.window()
            tabs = getattr(window, "tabs", None)
            if tabs is not None:
                tabs.setCurrentIndex(0)
            return None
        panel = self._panels.get(name)
        if panel is None:
            from gaudi_gui.ui.devices_tab import DevicesTab
            assert poller is not None
            selection = self.hosts.selection(name)
            assert selection is not None  # a watched host is a saved one
            scoped = dataclasses.replace(self.services, device_poller=poller, selection=selection)
            panel = DevicesTab(scoped)
            panel.setWindowTitle(f"gaudi-gui — devices on {name}")
            panel.setAttribute(Qt.WidgetAttribute.WA_DeleteOnClose, False)
            panel.resize(1100, 720)
            self._panels[name] = panel
        panel.show()
        panel.raise_()
        return panel

    def shutdown(self) -> None:
        for panel in self._panels.values():
            shutdown = getattr(panel, "shutdown", None)
            if callable(shutdown):
                shutdown()
            panel.close()
        self.hosts.stop()  # the pollers, handshakes and a set-up still running
        for signal, slot in self._queue_slots:
            with contextlib.suppress(RuntimeError, TypeError):
                signal.disconnect(slot)
        self._queue_slots.clear()
        for name in self._queues:  # the host queues this tab watched
            service = self.services.host_queues.get(name)
            if service is not None:
                service.shutdown()
        self._queues.clear()

    # -- the tree ---------------------------------------------------------------------------------

    def _host_of(self, item: QTreeWidgetItem) -> str:
        parent = item.parent()
        while parent is not None:
            item, parent = parent, parent.parent()
        return str(item.data(0, Qt.ItemDataRole.UserRole))

    def _update_buttons(self) -> None:
        name = self.selected_host()
        self.open_button.setEnabled(bool(name))
        self.remove_button.setEnabled(bool(name) and name != LOCAL and
                                      any(h.name == name for h in self.hosts.saved()))
        self.setup_button.setEnabled(bool(name) and name != LOCAL and not self.hosts.setup_running())

    def _rebuild(self) -> None:
        current = self.selected_host()
        saved = {h.name for h in self.hosts.saved()}
        for name in sorted(self._queues - saved):  # a host removed: its queue is no longer asked for
            self._queues.discard(name)
            service = self.services.host_queues.get(name)
            if service is not None:
                service.shutdown()
        self.tree.clear()
        self._items.clear()
        for host in self.hosts.hosts():
            item = QTreeWidgetItem([host.label] + [""] * (len(COLUMNS) - 1))
            item.setData(0, Qt.ItemDataRole.UserRole, host.name)
            item.setData(0, _LABEL_ROLE, host.label)
            font = QFont(item.font(0))
            font.setBold(True)
            item.setFont(0, font)
            self.tree.addTopLevelItem(item)
            self._items[host.name] = item
            poller = self.hosts.poller(host.name)
            if poller is None:
                item.setText(STATE, "not watched — Open panel or Add host connects")
                item.setForeground(STATE, QBrush(_IDLE))
            else:
                self._show_state(host.name, poller.state, poller.message)
                if host.name in self.hosts.handshakes:
                    self._show_handshake(host.name, self.hosts.handshakes[host.name])
                self._show_cards(host.name, poller.latest())
            self._show_health(host.name)
            self._show_queue(host.name)
            item.setExpanded(True)
            if host.name == current:
                self.tree.setCurrentItem(item)
        self._fit_columns()
        self._update_buttons()

    def _show_state(self, name: str, state: str, message: str) -> None:
        item = self._items.get(name)
        if item is None:
            return
        self._states[name] = (state, message)
        first = next((ln for ln in message.splitlines() if ln.strip()), "")
        unreachable = first if "unreachable" in first else f"unreachable: {first}"
        text = {dp.STATE_OK: self._connected_text(name), dp.STATE_UNREACHABLE: unreachable,
                dp.STATE_FAILED: f"hl-smi failing: {first}", dp.STATE_ABSENT: "no hl-smi (host only)",
                dp.STATE_STARTING: "connecting…" if name != LOCAL else "starting…",
                dp.STATE_STOPPED: "stopped"}.get(state, state)
        item.setText(STATE, text)
        item.setToolTip(STATE, message)
        color = _BAD if state in (dp.STATE_UNREACHABLE, dp.STATE_FAILED) else None
        item.setForeground(STATE, QBrush(color) if color else QBrush())
        if state == dp.STATE_UNREACHABLE:
            for child in _children(item):
                child.setForeground(STATE, QBrush(_IDLE))
                child.setText(STATE, "stale")

    def _connected_text(self, name: str) -> str:
        """"connected", and which cards a job should use there once the doctor has said."""
        health = self.services.health
        found = health.health(name) if health is not None else None
        if found is None or not found.reachable or not found.cards:
            return "connected"
        selection = self.services.selection if name == LOCAL else self.hosts.selection(name)
        held = sorted({i for ids in (selection.claims().values() if selection is not None else [])
                       for i in ids})
        return f"connected · {found.usable_text(held)}"

    def _show_health(self, name: str) -> None:
        """The host's health at a glance: the doctor's errors/warnings and the alerts (a click on it
        opens the Health view); which cards are healthy and free, on the host and on each card."""
        item = self._items.get(name)
        health = self.services.health
        if item is None or health is None:
            return
        state = self._states.get(name)
        if state is not None and state[0] == dp.STATE_OK:
            item.setText(STATE, self._connected_text(name))
            item.setToolTip(STATE, self._connected_text(name))
        poller = self.hosts.poller(name)
        if poller is not None and poller.latest():
            self._show_cards(name, poller.latest())
        from gaudi_gui.ui.health_view import badge_text

        worst = health.worst(name)
        item.setText(HEALTH, badge_text(health, name).removeprefix("Health: "))
        item.setData(HEALTH, Qt.ItemDataRole.UserRole, worst)
        item.setForeground(HEALTH, QBrush({"error": _BAD, "warning": _WARN}[worst])
                           if worst in ("error", "warning") else QBrush())
        item.setToolTip(HEALTH, "click to open the Health view")
        self.tree.resizeColumnToContents(HEALTH)

    def _on_health_checking(self, name: str, _checking: bool) -> None:
        self._show_health(name)

    def _on_item_clicked(self, item: QTreeWidgetItem, column: int) -> None:
        if column == HEALTH and item.parent() is None and self.services.health is not None:
            self.services.health.view_requested.emit(self._host_of(item))

    def _show_handshake(self, name: str, answer: dict) -> None:
        """The host's gaudi-gui: its version (libraries in the tooltip), or what is wrong and the fix."""
        item = self._items.get(name)
        if item is None:
            return
        if answer.get("ok"):
            versions = answer.get("versions") or {}
            item.setText(VERSION, str(answer.get("version")))
            item.setToolTip(VERSION, "\n".join(f"{k} {v}" for k, v in sorted(versions.items())))
            item.setForeground(VERSION, QBrush())
            self._watch_queue(name)
            self._fit_columns()
            return
        kind = str(answer.get("kind") or "")
        fix = {"missing": "missing — Set up host", "version": "other version — Set up host"}.get(kind)
        # Not reached (the state column says why): no version known, nothing to set up.
        item.setText(VERSION, fix or "—")
        item.setToolTip(VERSION, str(answer.get("message") or ""))
        item.setForeground(VERSION, QBrush(_BAD if fix else _IDLE))
        self._fit_columns()

    def _watch_queue(self, name: str) -> None:
        """Watch a saved host's queue length once its gaudi-gui answered (cheap: its agent's ``queue``
        events over the agent's one link to the host, as the queue changes)."""
        if name == LOCAL or name in self._queues or not any(h.name == name for h in self.hosts.saved()):
            return
        self._queues.add(name)
        service = self.services.ensure_host_queue(name)
        row = _QueueRow(self, name)
        self._connect_queue(service.state_changed, row.changed)
        self._connect_queue(service.problem_changed, row.changed)
        self._show_queue(name)

    def bind_local_queue(self, service: Any) -> None:
        """This machine's queue service (``AppServices.queue``, made by whoever first needed it): the
        local row's queue length follows it."""
        self._connect_queue(service.state_changed, _QueueRow(self, LOCAL).changed)
        self._show_queue(LOCAL)

    def _connect_queue(self, signal: Any, slot: Any) -> None:
        signal.connect(slot)
        self._queue_slots.append((signal, slot))

    def queue_text(self, name: str) -> tuple[str, str]:
        """The Queue column of a host's row and its tooltip: "2 queued · 1 started", "empty", "" (not
        watched), or "?" with why the host's queue could not be read."""
        if name == LOCAL:
            service: object = self.services.queue
        else:
            service = self.services.host_queues.get(name) if name in self._queues else None
        if service is None:
            return "", ""
        problem = str(getattr(service, "problem", "") or "")
        if problem:
            return "?", problem
        if not getattr(service, "known", True):
            return "…", "asking the host for its queue"
        state = service.state  # type: ignore[attr-defined]
        queued = len(state.pending())
        started = len(state.active())
        if not queued and not started:
            return "empty", "no job queued or started by the queue (View → Queue shows it)"
        parts = [f"{queued} queued"] if queued else []
        if started:
            parts.append(f"{started} started")
        head = next(iter(state.pending()), None)
        tip = f"next: {head.name or head.id} — {head.state_text()}" + (f": {head.why}" if head.why else "") \
            if head is not None else ""
        return " · ".join(parts), tip

    def _show_queue(self, name: str) -> None:
        item = self._items.get(name)
        if item is None:
            return
        text, tip = self.queue_text(name)
        item.setText(QUEUE, text)
        item.setToolTip(QUEUE, tip)
        item.setForeground(QUEUE, QBrush(_IDLE) if text in ("?", "…", "empty") else QBrush())

    def _show_cards(self, name: str, samples: list[DeviceSample]) -> None:
        item = self._items.get(name)
        if item is None:
            return
        cards = [s for s in samples if s.kind in ("hpu", "cuda")]
        while item.childCount() > len(cards):
            item.takeChild(item.childCount() - 1)
        grown = item.childCount() < len(cards)
        while item.childCount() < len(cards):
            item.addChild(QTreeWidgetItem([""] * len(COLUMNS)))
        # One repaint for the whole host, not one per cell.
        self.tree.setUpdatesEnabled(False)
        try:
            self._fill_cards(item, name, cards)
        finally:
            self.tree.setUpdatesEnabled(True)
        if grown:
            self._fit_columns()

    def _fit_columns(self) -> None:
        for col in range(STATE):
            self.tree.resizeColumnToContents(col)

    def _fill_cards(self, item: QTreeWidgetItem, name: str, cards: list[DeviceSample]) -> None:
        # What this app runs there holds its cards (a run, the Model runner, a server): said per card.
        selection = self.services.selection if name == LOCAL else self.hosts.selection(name)
        holders = selection.holders() if selection is not None else {}
        health = self.services.health
        found = health.health(name) if health is not None else None
        if found is not None and (not found.reachable or not found.cards):
            found = None
        usable = 0
        for child, s in zip(_children(item), cards, strict=True):
            card_id = s.module_id if s.kind == "hpu" and s.module_id is not None else s.index
            mem = (f"{(s.memory_used_mib or 0) / 1024:.1f} / {s.memory_total_mib / 1024:.0f} GiB"
                   if s.memory_total_mib else "—")
            held = holders.get(card_id)
            worst = found.card_worst(card_id) if found is not None and s.kind == "hpu" else None
            if held:
                state, color = f"in use: {', '.join(held)}", _WARN
            elif worst is not None:
                state, color = worst.seen, _BAD if worst.severity == "error" else _WARN
                if worst.severity == "warning" and card_id in found.free_modules:  # type: ignore[union-attr]
                    usable += 1
            elif found is not None and s.kind == "hpu" and card_id in found.free_modules:
                state, color = "healthy, free", None
                usable += 1
            elif s.processes:
                state, color = f"in use by pid {', '.join(str(p.pid) for p in s.processes[:3])}", _WARN
            else:
                state, color = ("not checked yet" if s.kind == "hpu" else ""), _IDLE
            values = [""] * len(COLUMNS)  # by column name: the columns may change
            values[NAME], values[UTIL], values[MEMORY] = sample_name(s), _num(s.utilization), mem
            values[TEMP], values[POWER], values[STATE] = _num(s.temperature_c), _num(s.power_w), state
            for col, value in enumerate(values):
                if child.text(col) != value:
                    child.setText(col, value)
            child.setToolTip(NAME, card_detail(s.module_id, s.index, s.bus_id))
            child.setToolTip(STATE, state)
            child.setForeground(STATE, QBrush(color) if color else QBrush())
        label = str(item.data(0, _LABEL_ROLE) or name)
        if cards:
            # The host's row sums up its server: mean utilization, memory used of all cards, the
            # hottest card, the power of the whole server.
            utils = [s.utilization for s in cards if s.utilization is not None]
            used = sum(s.memory_used_mib or 0 for s in cards)
            total = sum(s.memory_total_mib or 0 for s in cards)
            temps = [s.temperature_c for s in cards if s.temperature_c is not None]
            power = [s.power_w for s in cards if s.power_w is not None]
            count = f"{len(cards)} cards" + (f", {usable} healthy and free" if found is not None else "")
            if item.text(NAME) != f"{label}  ·  {count}":
                item.setText(NAME, f"{label}  ·  {count}")
                self._fit_columns()  # the host's line changes with the doctor's report, not per sample
            item.setText(UTIL, _num(sum(utils) / len(utils)) if utils else "—")
            item.setText(MEMORY, f"{used / 1024:.1f} / {total / 1024:.0f} GiB" if total else "—")
            item.setText(TEMP, f"max {_num(max(temps))}" if temps else "—")
            item.setText(POWER, _num(sum(power)) if power else "—")
        else:
            item.setText(NAME, label)


def _num(value: float | None) -> str:
    return "—" if value is None else f"{value:.0f}"


def _children(item: QTreeWidgetItem) -> list[QTreeWidgetItem]:
    return [c for c in (item.child(i) for i in range(item.childCount())) if c is not None]

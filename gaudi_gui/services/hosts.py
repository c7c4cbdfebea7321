"""The hosts the window watches: one DevicePoller per saved remote host, for the Hosts overview.

"local" is the window's own poller. A saved host (added in the Hosts tab or with ``gaudi-gui hosts
--add``) gets its own poller, whose hl-smi loop runs on the host over ssh; aliases of ~/.ssh/config
are listed but not connected to until the user adds them (a config may name fifty machines). Each
poller has its own card selection. Pollers run only while ``start()`` is in effect (the Hosts tab
shown), so an unused window makes no connections.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core import remote
from gaudi_gui.core.remote import Host, HostError, RemoteError
from gaudi_gui.services.device_poller import DevicePoller
from gaudi_gui.services.device_selection import DeviceSelection
from gaudi_gui.services.process import ProcessRunner, delete_when_reaped
from gaudi_gui.services.settings import Settings


class _Hello(QObject):
    """``gaudi-gui hello --json`` on a host as a child (the handshake, never blocking the GUI)."""

    def __init__(self, host: Host, parent: QObject) -> None:
        super().__init__(parent)
        self.host = host
        self.out: list[str] = []
        self.err: list[str] = []
        self.runner = ProcessRunner(self, parse_protocol=False, tail_lines=20)
        self.runner.line_received.connect(
            lambda stream, line: (self.out if stream == "stdout" else self.err).append(line))

    def start(self) -> None:
        argv = self.host.wrap(self.host.gaudi_gui_argv("hello", "--json"))
        self.runner.start(argv[0], argv[1:])


class HostsService(QObject):
    #: The host list changed (a host added or removed).
    hosts_changed = Signal()
    #: A host's poller was created: (host name, poller).
    poller_added = Signal(str, object)
    #: The handshake with a host ended: (host name, {"ok", "version", "message", "kind", "versions"}).
    #: A missing or different gaudi-gui says so with the command that fixes it.
    handshake_finished = Signal(str, dict)

    def __init__(self, settings: Settings, local: DevicePoller, parent: QObject | None = None, *,
                 selections: dict[str, DeviceSelection] | None = None) -> None:
        super().__init__(parent)
        self._settings = settings
        self.local = local
        self.pollers: dict[str, DevicePoller] = {}
        #: Card selection per host (shared with the runner through ``AppServices.host_selections``).
        self.selections: dict[str, DeviceSelection] = selections if selections is not None else {}
        self._running = False
        self._hellos: dict[str, _Hello] = {}
        #: The newest handshake answer per host (see ``handshake_finished``).
        self.handshakes: dict[str, dict[str, Any]] = {}

    def hosts(self) -> list[Host]:
        """local, the saved hosts, then ~/.ssh/config aliases not saved yet."""
        return remote.all_hosts()

    def saved(self) -> list[Host]:
        return remote.saved_hosts()

    def poller(self, name: str) -> DevicePoller | None:
        if name == remote.LOCAL:
            return self.local
        return self.pollers.get(name)

    def start(self) -> None:
        """Connect to every saved host (idempotent)."""
        self._running = True
        for host in self.saved():
            self._ensure(host).start()

    def stop(self) -> None:
        self._running = False
        for poller in self.pollers.values():
            poller.stop()
        for hello in self._hellos.values():
            if hello.runner.is_running():
                hello.runner.kill_tree()

    def shake_hands(self, host: Host) -> None:
        """Run the host's ``gaudi-gui hello`` (its version, protocol and libraries) in a child."""
        old = self._hellos.pop(host.name, None)
        if old is not None:
            delete_when_reaped(old)
        hello = _Hello(host, self)
        hello.runner.finished.connect(lambda code, _status, h=hello: self._on_hello(h, code))
        self._hellos[host.name] = hello
        hello.start()

    def _on_hello(self, hello: _Hello, code: int) -> None:
        if self._hellos.get(hello.host.name) is not hello:
            return  # replaced by a newer handshake
        try:
            info = remote.read_hello(hello.host, code, "\n".join(hello.out), "\n".join(hello.err))
            answer = {"ok": True, "version": str(info.get("gaudi_gui")), "kind": "", "message": "",
                      "versions": dict(info.get("versions") or {})}
        except RemoteError as exc:
            answer = {"ok": False, "version": "", "kind": exc.kind, "message": str(exc), "versions": {}}
        self.handshakes[hello.host.name] = answer
        self.handshake_finished.emit(hello.host.name, answer)

    def add(self, name: str, remote_command: str = "", hl_smi: str = "") -> Host:
        """Save a host and, while watching, connect to it; HostError says what is wrong with it."""
        host = Host.parse(name, remote_command, hl_smi)
        if host.is_local:
            raise HostError("'local' is always there")
        saved = [h for h in self.saved() if h.name != host.name] + [host]
        remote.save_hosts(saved)
        old = self.pollers.pop(host.name, None)
        if old is not None:
            old.stop()
            delete_when_reaped(old)
        if self._running:
            self._ensure(host).start()
        self.hosts_changed.emit()
        return host

    def reload(self, name: str) -> None:
        """The saved entry of ``name`` changed on disk (set-up wrote a new remote command): a new
        poller for it, connected while watching."""
        old = self.pollers.pop(name, None)
        if old is not None:
            old.stop()
            delete_when_reaped(old)
        host = next((h for h in self.saved() if h.name == name), None)
        if host is not None and self._running:
            self._ensure(host).start()
        self.hosts_changed.emit()

    def remove(self, name: str) -> None:
        remote.save_hosts([h for h in self.saved() if h.name != name])
        poller = self.pollers.pop(name, None)
        if poller is not None:
            poller.stop()
            delete_when_reaped(poller)
        self.hosts_changed.emit()

    def _ensure(self, host: Host) -> DevicePoller:
        poller = self.pollers.get(host.name)
        if poller is None:
            selection = self.selections.setdefault(host.name, DeviceSelection())
            poller = DevicePoller(self._settings, selection, self, host=host)
            self.pollers[host.name] = poller
            self.poller_added.emit(host.name, poller)
            self.shake_hands(host)
        return poller

"""The hosts of the window: the saved host list in memory, each host's card selection and poller, the
handshake, ``ssh -G`` address resolution and ``hosts --setup``, for every view to bind to.

This service is the Qt process's one reader and writer of hosts.json: it reads the file once when it
is made (``gaudi_gui.app.create_services``) and again only when the file changed on disk (a
``gaudi-gui hosts --add`` in a terminal, a set-up child that saved a new remote command), which a
directory watcher notices by the file's size, time and inode (a stat, never a read per event). Views
take ``saved()``, ``hosts()`` and ``find()`` from memory and follow ``changed``: typing in a host
field or opening a Host list reads no file.

Every saved host has its card selection (``selection(name)``, also in
``AppServices.host_selections``) from the moment it is loaded or added, whether or not its Devices
panel was ever opened: the runner and the training placement read a host's cards from it.

"local" is the window's own poller. A saved host gets its own poller, whose hl-smi loop runs on the
host over ssh; aliases of ~/.ssh/config are listed but not connected to until the user adds them (a
config may name fifty machines). Pollers run only while ``start()`` is in effect (the Hosts tab
built), so an unused window makes no connections.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core import multi_host, remote
from gaudi_gui.core.remote import Host, HostError, RemoteError
from gaudi_gui.services import disk_watch
from gaudi_gui.services.agent_child import AgentChild
from gaudi_gui.services.agent_client import AgentClient
from gaudi_gui.services.device_poller import DevicePoller
from gaudi_gui.services.device_selection import DeviceSelection
from gaudi_gui.services.settings import Settings

#: A set-up's last lines kept for its failure message.
_SETUP_TAIL = 20


class _Ask(QObject):
    """``ssh -G HOST`` (ssh's resolved configuration, without connecting), the agent's child: the
    window starts no process."""

    def __init__(self, host: Host, client: AgentClient, parent: QObject) -> None:
        super().__init__(parent)
        self.host = host
        self.out: list[str] = []
        self.err: list[str] = []
        self.runner = AgentChild(self, client=client, tail_lines=20)
        self.runner.line_received.connect(
            lambda stream, line: (self.out if stream == "stdout" else self.err).append(line))

    def start(self) -> None:
        self.runner.start("ssh_config", {"dest": self.host.name})


def _file_stamp(path: Path) -> tuple[int, int, int] | None:
    """hosts.json's (inode, size, mtime) or None when it is not there: what tells a change."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns)


class HostsService(QObject):
    #: The saved host list changed (added, removed, set up, or the file changed on disk).
    changed = Signal()
    #: A host's poller was created: (host name, poller).
    poller_added = Signal(str, object)
    #: Any watched poller's samples, the window's own included: (host name or "local", samples).
    samples_received = Signal(str, object)
    #: Any watched poller's state changed: (host name or "local", state, message).
    state_changed = Signal(str, str, str)
    #: The handshake with a host ended: (host name, {"ok", "version", "message", "kind", "versions"}).
    #: A missing or different gaudi-gui says so with the command that fixes it.
    handshake_finished = Signal(str, dict)
    #: ``ssh -G`` answered for a host: (host name, its address as other machines reach it).
    address_resolved = Signal(str, str)
    #: A set-up said something: (host name, the line).
    setup_progressed = Signal(str, str)
    #: A set-up ended: (host name, ok, what to show: "" when ok, else why it failed).
    setup_finished = Signal(str, bool, str)

    def __init__(self, settings: Settings, local: DevicePoller, parent: QObject | None = None, *,
                 selections: dict[str, DeviceSelection] | None = None,
                 agent: Callable[[], AgentClient]) -> None:
        super().__init__(parent)
        self._settings = settings
        self.local = local
        self._forward(remote.LOCAL, local)
        self.pollers: dict[str, DevicePoller] = {}
        #: Card selection per saved host (the same dict as ``AppServices.host_selections``).
        self.selections: dict[str, DeviceSelection] = selections if selections is not None else {}
        self._running = False
        #: This machine's agent (made on first use): it carries the handshakes to the hosts' agents.
        self._agent = agent
        self._hello_tokens: dict[str, int] = {}
        #: The host entry each handshake was made with (a changed one reconnects its link).
        self._shaken: dict[str, Host] = {}
        #: The newest handshake answer per host (see ``handshake_finished``).
        self.handshakes: dict[str, dict[str, Any]] = {}
        self._addresses: dict[str, str] = {}
        self._resolves: dict[str, _Ask] = {}
        # ``hosts --setup``: the agent's child, made on the first set-up.
        self._setup_runner: AgentChild | None = None
        #: The host a set-up runs for ("" when none).
        self.setup_host = ""
        self._saved: list[Host] = []
        #: The file this list is kept in (fixed when made: the config folder is read once).
        self.path = remote.hosts_file()
        self._stamp: tuple[int, int, int] | None = None
        disk_watch.shared().changed.connect(self._on_disk_change)
        self._load()

    # -- the host list (memory) -------------------------------------------------------------------

    def _load(self) -> None:
        """Read hosts.json (the only place this process does), give every host its card selection,
        and watch the file's folder for changes made by other processes."""
        self._stamp = _file_stamp(self.path)
        self._saved = remote.saved_hosts(self.path)
        for host in self._saved:
            self.selections.setdefault(host.name, DeviceSelection(self))
        self._watch_file()

    def _watch_file(self) -> None:
        watch = disk_watch.shared()
        wanted = [p for p in (str(self.path.parent), str(self.path)) if os.path.exists(p)]
        missing = [p for p in wanted if not watch.watching(p)]
        if missing:
            watch.watch(missing)

    def _on_disk_change(self, _path: str = "") -> None:
        if _file_stamp(self.path) != self._stamp:
            self.reload()
        else:
            self._watch_file()  # an atomic replace drops the file's watch: take the new file

    def reload(self) -> None:
        """Read the file again (another process changed it): new hosts get a selection (and, while
        watching, a poller), removed ones lose theirs, a host whose entry changed is reconnected."""
        before = {h.name: h for h in self._saved}
        self._load()
        after = {h.name: h for h in self._saved}
        for name, host in before.items():
            if after.get(name) != host:
                self._drop_poller(name)
            if name not in after:
                self._drop_selection(name)
        if self._running:
            for host in self._saved:
                self._ensure(host).start()
        if before != after:
            self.changed.emit()

    def saved(self) -> list[Host]:
        """The saved hosts, in order (from memory)."""
        return list(self._saved)

    def hosts(self) -> list[Host]:
        """local, the saved hosts, then ~/.ssh/config aliases not saved yet."""
        return remote.all_hosts(saved=self._saved)

    def find(self, name: str, remote_command: str = "") -> Host:
        """``core.remote.find_host`` from memory: local, a saved host (its remote command unless one is
        given), or a new host for any valid destination; HostError says what is wrong with ``name``."""
        return remote.find_host(name, remote_command, saved=self._saved)

    def selection(self, name: str) -> DeviceSelection | None:
        """The card selection of a saved host (None for one not saved)."""
        return self.selections.get(name)

    def _write(self, change: Callable[[list[Host]], list[Host]]) -> None:
        """Apply ``change`` to the saved list as it is on disk now, under the lock the command line
        takes too (core.remote.update_hosts)."""
        self._saved = remote.update_hosts(change, self.path)
        self._stamp = _file_stamp(self.path)
        self._watch_file()

    def _merge_disk(self) -> None:
        """Before a write: take what another process saved since (never write over it)."""
        if _file_stamp(self.path) != self._stamp:
            self.reload()

    def add(self, name: str, remote_command: str = "", hl_smi: str = "") -> Host:
        """Save a host and, while watching, connect to it; HostError says what is wrong with it."""
        host = Host.parse(name, remote_command, hl_smi)
        if host.is_local:
            raise HostError("'local' is always there")
        self._merge_disk()  # hosts another process saved since get their pollers too
        self._write(lambda saved: [h for h in saved if h.name != host.name] + [host])
        self.selections.setdefault(host.name, DeviceSelection(self))
        self._drop_poller(host.name)
        if self._running:
            self._ensure(host).start()
        self.changed.emit()
        return host

    def remove(self, name: str) -> None:
        self._merge_disk()
        self._write(lambda saved: [h for h in saved if h.name != name])
        self._drop_poller(name)  # its unwatch first, over the link that is still there
        if self._shaken.pop(name, None) is not None:
            self._agent().request("hosts.disconnect", None, host=name)  # its link closes now
        self._drop_selection(name)
        self.changed.emit()

    def _drop_selection(self, name: str) -> None:
        selection = self.selections.pop(name, None)
        if selection is not None and selection.parent() is self:
            selection.deleteLater()

    # -- watching ---------------------------------------------------------------------------------

    def poller(self, name: str) -> DevicePoller | None:
        if name == remote.LOCAL:
            return self.local
        return self.pollers.get(name)

    def start(self) -> None:
        """Connect to every saved host (idempotent)."""
        self._running = True
        for host in self._saved:
            self._ensure(host).start()

    def stop(self) -> None:
        """Stop every host's poller, handshake, address look-up and set-up."""
        self._running = False
        for poller in self.pollers.values():
            poller.stop()
        # A handshake still on its way says nothing more; a client still reaching the agent for them
        # stops trying (no retry outlives the tab; the next handshake starts it again).
        self._hello_tokens = {name: token + 1 for name, token in self._hello_tokens.items()}
        if self._hello_tokens:
            client = self._agent()
            if client.state != "up":
                client.close()
        runners = [r.runner for r in self._resolves.values()]
        for runner in runners:
            if runner.is_running():
                runner.kill_tree()
        if self.setup_running():
            assert self._setup_runner is not None
            self._setup_runner.kill_tree()

    def _drop_poller(self, name: str) -> None:
        old = self.pollers.pop(name, None)
        if old is not None:
            old.stop()
            old.blockSignals(True)  # retired: mute, then gone (it holds no process)
            old.deleteLater()

    def _forward(self, name: str, poller: DevicePoller) -> None:
        """Re-emit ``poller``'s signals under ``name``: a view binds its own slots to this service's
        signals (disconnected when the view goes), never lambdas to a poller that outlives it."""
        poller.samples_received.connect(lambda samples: self.samples_received.emit(name, samples))
        poller.state_changed.connect(lambda state, message: self.state_changed.emit(name, state, message))

    def _ensure(self, host: Host) -> DevicePoller:
        poller = self.pollers.get(host.name)
        if poller is None:
            selection = self.selections.setdefault(host.name, DeviceSelection(self))
            # The host's cards from its agent's one loop, over this machine's agent's one ssh session
            # to it (no ssh of the window's own).
            poller = DevicePoller(self._settings, selection, self, host=host, agent=self._agent)
            self.pollers[host.name] = poller
            self._forward(host.name, poller)
            self.poller_added.emit(host.name, poller)
            self.shake_hands(host)
        return poller

    # -- the handshake ----------------------------------------------------------------------------

    def shake_hands(self, host: Host) -> None:
        """Ask the host's agent for its ``host.info`` (version, protocol, libraries) through this
        machine's agent: over the host's one ssh session, no child of the window. A link to a host
        whose entry changed is made again first (its remote command may be another)."""
        agent = self._agent()
        agent.start()  # closed by a stop() while it was still reaching the agent: reach it again
        self._hello_tokens[host.name] = token = self._hello_tokens.get(host.name, 0) + 1
        if self._shaken.get(host.name, host) != host:
            agent.request("hosts.disconnect", None, host=host.name)
        self._shaken[host.name] = host
        agent.request("host.info", lambda reply: self._on_hello(host, token, reply), host=host.name)

    def _on_hello(self, host: Host, token: int, reply: dict[str, Any]) -> None:
        if self._hello_tokens.get(host.name) != token:
            return  # replaced by a newer handshake, or stopped
        try:
            if not reply.get("ok"):
                words = str(reply.get("error") or f"{host.name} did not answer")
                # The link's words name the kind: no gaudi-gui behind the remote command.
                raise RemoteError("missing" if "has no gaudi-gui" in words else "unreachable", words)
            info = remote.read_hello(host, 0, json.dumps(reply.get("info") or {}), "")
            answer = {"ok": True, "version": str(info.get("gaudi_gui")), "kind": "", "message": "",
                      "versions": dict(info.get("versions") or {})}
        except RemoteError as exc:
            answer = {"ok": False, "version": "", "kind": exc.kind, "message": str(exc), "versions": {}}
        self.handshakes[host.name] = answer
        self.handshake_finished.emit(host.name, answer)

    # -- addresses --------------------------------------------------------------------------------

    def address(self, name: str) -> str | None:
        """The host's address as other machines reach it (``ssh -G``'s hostname), or None while it
        is being asked: ``address_resolved`` follows. Asked once per host; "local" is this machine's
        host name (no DNS look-up in the GUI thread)."""
        if name in self._addresses:
            return self._addresses[name]
        if name == remote.LOCAL:
            import socket
            self._addresses[name] = socket.gethostname()
            return self._addresses[name]
        if name not in self._resolves:
            try:
                host = self.find(name)
            except HostError:
                return None
            resolve = _Ask(host, self._agent(), self)
            resolve.runner.finished.connect(lambda _code, _status, r=resolve: self._on_resolved(r))
            self._resolves[name] = resolve
            resolve.start()
        return None

    def _on_resolved(self, resolve: _Ask) -> None:
        name = resolve.host.name
        if self._resolves.get(name) is not resolve:
            return
        del self._resolves[name]
        resolve.blockSignals(True)  # retired: mute, then gone (it holds no process)
        resolve.deleteLater()
        address = multi_host.address_from_ssh_g(resolve.host, "\n".join(resolve.out))
        self._addresses[name] = address
        self.address_resolved.emit(name, address)

    # -- set-up -----------------------------------------------------------------------------------

    def setup_running(self) -> bool:
        return self._setup_runner is not None and self._setup_runner.is_running()

    def setup(self, name: str, extra: tuple[str, ...] = ()) -> bool:
        """Install this gaudi-gui on the host (``gaudi-gui hosts --setup NAME EXTRA`` as a child: a
        wheel built here, a venv there); False when ``name`` is local or a set-up already runs.
        ``setup_progressed`` says what it does, ``setup_finished`` how it ended; on success the host
        list is read again (the child saved the new remote command) and the host reconnected."""
        if not name or name == remote.LOCAL or self.setup_running():
            return False
        self.setup_host = name
        if self._setup_runner is None:
            self._setup_runner = AgentChild(self, client=self._agent(), tail_lines=_SETUP_TAIL)
            self._setup_runner.line_received.connect(self._on_setup_line)
            self._setup_runner.finished.connect(self._on_setup_done)
        self._setup_runner.start("host_setup", {"dest": name, "options": list(extra)})
        return True

    def _on_setup_line(self, _stream: str, line: str) -> None:
        if line.strip():
            self.setup_progressed.emit(self.setup_host, line.strip())

    def _on_setup_done(self, code: int, _status: str) -> None:
        name, self.setup_host = self.setup_host, ""
        if code == 0:
            self._drop_poller(name)  # its remote command changed: connect again through the new one
            self.reload()
            if self._running and name not in self.pollers:
                host = next((h for h in self._saved if h.name == name), None)
                if host is not None:
                    self._ensure(host).start()
            self.setup_finished.emit(name, True, "")
            return
        said = self._setup_runner.tail(5) if self._setup_runner is not None else []
        last = next((t for t in reversed(said) if t.strip()), f"exit {code}")
        self.setup_finished.emit(name, False, last.removeprefix("gaudi-gui hosts --setup: "))

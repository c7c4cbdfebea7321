"""A host's folders and Hugging Face cache for the Browse dialog, answered by the host's own agent.

The "Browse HOST" dialog (``gaudi_gui.ui.remote_browser``) binds to this service; it starts no
process. A listing is one ``files.list`` request to this machine's agent, naming the host: the agent
carries it over the host's one ssh session to the host's agent (``gaudi_gui.agent.hosts``), which
reads the folder (``gaudi_gui.core.listing``, the same answer as ``gaudi-gui ls --json``). A path is
data in a JSON message, never a word for a shell. A listing can be abandoned at any time (another
folder asked, the dialog closed): it says nothing more. A failure (no such folder, permission denied,
no gaudi-gui there, ssh itself) comes back as the agent's one sentence.

The Models tab's listings and deletes (``services/downloads.ModelPlaces``) are ``AgentListing``s of
``models.list`` / ``models.delete`` the same way: the place's agent reads or deletes in its own Hub
cache.

The last folder shown per host is remembered for the session (the settings schema has no per-host
key for it).
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core import remote
from gaudi_gui.core.remote import Host
from gaudi_gui.services.agent_client import AgentClient

FOLDER, CACHE = "folder", "cache"


class AgentListing(QObject):
    """One request to the agent (for ``host``: ``files.list``, or ``op``) and what it answered."""

    #: The listing ended: (the answer, {} on failure; "" or the sentence saying why it failed).
    finished = Signal(dict, str)

    def __init__(self, host: Host, kind: str, agent: AgentClient, args: dict[str, Any],
                 parent: QObject, *, op: str = "files.list") -> None:
        super().__init__(parent)
        self.host = host
        #: FOLDER or CACHE.
        self.kind = kind
        self.op = op
        self._running = True
        self._cancelled = False
        where = {} if host.is_local else {"host": host.name}
        agent.start()  # where it was closed: reach the agent again (no-op while it is reached)
        agent.request(op, self._on_reply, **args, **where)

    def is_running(self) -> bool:
        return self._running

    def cancel(self) -> None:
        """Say nothing more (the answer, when it comes, is dropped and this object deleted)."""
        self._cancelled = True

    def _on_reply(self, message: dict[str, Any]) -> None:
        self._running = False
        if self._cancelled:
            self.deleteLater()
            return
        if message.get("ok"):
            self.finished.emit({k: v for k, v in message.items() if k not in ("v", "re", "ok")}, "")
            return
        error = str(message.get("error") or f"'{self.op}' on {self.host.name} was not answered")
        if f"knows no operation '{self.op}'" in error and not self.host.is_local:
            # A host's older gaudi-gui: its agent answers the link but not this request.
            error = (f"{self.host.name}'s gaudi-gui is older than this one (its agent has no "
                     f"'{self.op}'); fix: {remote.fix_command(self.host)}")
        self.finished.emit({}, error)


class RemoteFiles(QObject):
    """Asks the agent for listings; remembers the last folder shown per host."""

    def __init__(self, agent: AgentClient, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._agent = agent
        self._last: dict[str, str] = {}

    def list_folder(self, host: Host, path: str) -> AgentListing:
        """``path`` on ``host`` (``~`` is the host's home); the answer holds the folder as the host
        resolved it, its parent and entries (name, is_dir, model, size)."""
        listing = AgentListing(host, FOLDER, self._agent, {"path": path}, self)
        listing.finished.connect(
            lambda answer, _msg: self._remember(host.name, str(answer.get("path") or "")))
        return listing

    def list_cache(self, host: Host) -> AgentListing:
        """The models in ``host``'s Hugging Face cache (Hub ids, sizes, paths)."""
        return AgentListing(host, CACHE, self._agent, {"hf_cache": True}, self)

    def last_folder(self, host_name: str) -> str:
        """The folder last shown for this host in this session ("" when none)."""
        return self._last.get(host_name, "")

    def _remember(self, host_name: str, folder: str) -> None:
        if folder:
            self._last[host_name] = folder

"""A host's folders and Hugging Face cache for the Browse dialog, answered by the host's own agent.

The "Browse HOST" dialog (``gaudi_gui.ui.remote_browser``) binds to this service; it starts no
process. A listing is one ``files.list`` request to this machine's agent, naming the host: the agent
carries it over the host's one ssh session to the host's agent (``gaudi_gui.agent.hosts``), which
reads the folder (``gaudi_gui.core.listing``, the same answer as ``gaudi-gui ls --json``). A path is
data in a JSON message, never a word for a shell. A listing can be abandoned at any time (another
folder asked, the dialog closed): it says nothing more. A failure (no such folder, permission denied,
no gaudi-gui there, ssh itself) comes back as the agent's one sentence.

``Listing`` (one ``gaudi-gui`` command as a child) stays for the other listings (the models and
queue views) until they are requests to the agent too.

The last folder shown per host is remembered for the session (the settings schema has no per-host
key for it).
"""

from __future__ import annotations

import json
from typing import Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core import remote
from gaudi_gui.core.remote import Host
from gaudi_gui.services.agent_client import AgentClient
from gaudi_gui.services.process import EXIT_FAILED_TO_START, ProcessRunner, delete_when_reaped, describe_exit

FOLDER, CACHE = "folder", "cache"


def last_json(lines: list[str]) -> dict[str, Any] | None:
    """The answer among a listing's stdout lines: a login script on the host may print before
    gaudi-gui does, so it is the last line that starts a JSON object."""
    for line in reversed(lines):
        text = line.strip()
        if text.startswith("{"):
            try:
                value = json.loads(text)
            except ValueError:
                return None
            return value if isinstance(value, dict) else None
    return None


class Listing(QObject):
    """One ``gaudi-gui ls`` child on a host and what it answered."""

    #: The listing ended: (the answer, {} on failure; "" or the sentence saying why it failed).
    finished = Signal(dict, str)

    def __init__(self, host: Host, kind: str, args: list[str], parent: QObject) -> None:
        super().__init__(parent)
        self.host = host
        #: FOLDER or CACHE.
        self.kind = kind
        self._command = args[0] if args else "ls"
        self._stdout: list[str] = []
        self._stderr: list[str] = []
        self._runner = ProcessRunner(self, parse_protocol=False)
        self._runner.line_received.connect(
            lambda stream, line: (self._stdout if stream == "stdout" else self._stderr).append(line))
        self._runner.finished.connect(self._on_finished)
        argv = host.wrap(host.gaudi_gui_argv(*args))
        self._runner.start(argv[0], argv[1:])

    def is_running(self) -> bool:
        return self._runner.is_running()

    def cancel(self) -> None:
        """Say nothing more; the child is killed, and this object deleted once it is reaped."""
        delete_when_reaped(self)

    def _on_finished(self, code: int, status: str) -> None:
        answer = last_json(self._stdout) if code == 0 else None
        if answer is None:
            self.finished.emit({}, self._failure(code, status))
        else:
            self.finished.emit(answer, "")

    def _failure(self, code: int, status: str) -> str:
        host = self.host
        err = "\n".join(self._stderr)
        last = next((ln.strip() for ln in reversed(self._stderr) if ln.strip()), "")
        if status == EXIT_FAILED_TO_START:
            return next(iter(self._runner.tail(1)), "the listing could not start")
        if not host.is_local and code == remote.SSH_FAILED:
            return remote.explain_ssh_failure(host.name, err)[1]
        if "invalid choice" in err or "No module named" in err or code in (126, 127):
            return (f"{host.name} has no gaudi-gui with the `{self._command}` command behind "
                    f"`{host.remote_command}` ({last or describe_exit(code, status)}); fix: "
                    f"{remote.fix_command(host)}")
        if last.startswith(f"gaudi-gui {self._command}: "):
            last = last[len(f"gaudi-gui {self._command}: "):]
        if code == 0:
            return f"{host.name} answered something that is not a listing"
        return last or f"the listing on {host.name} {describe_exit(code, status)}"


class AgentListing(QObject):
    """One ``files.list`` request to the agent (for ``host``) and what it answered."""

    #: The listing ended: (the answer, {} on failure; "" or the sentence saying why it failed).
    finished = Signal(dict, str)

    def __init__(self, host: Host, kind: str, agent: AgentClient, args: dict[str, Any],
                 parent: QObject) -> None:
        super().__init__(parent)
        self.host = host
        #: FOLDER or CACHE.
        self.kind = kind
        self._running = True
        self._cancelled = False
        where = {} if host.is_local else {"host": host.name}
        agent.start()  # where it was closed: reach the agent again (no-op while it is reached)
        agent.request("files.list", self._on_reply, **args, **where)

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
        else:
            self.finished.emit({}, str(message.get("error") or f"the listing on {self.host.name} failed"))


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

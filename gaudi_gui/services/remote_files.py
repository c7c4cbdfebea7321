"""A host's folders and Hugging Face cache, listed by the host's own ``gaudi-gui ls --json``.

The "Browse HOST" dialog (``gaudi_gui.ui.remote_browser``) binds to this service; it never starts a
process. Each listing is one child through ``ProcessRunner``: ``host.wrap(host.gaudi_gui_argv(...))``,
an argv whose every word is quoted for the host's shell, so a folder named ``$(touch X)`` stays a
name. A listing can be abandoned at any time (another folder asked, the dialog closed): its child is
killed and reaped in the background, and it says nothing more. A failure (no such folder, permission
denied, no gaudi-gui there, ssh itself) comes back as one sentence, an ssh failure in the words of
``gaudi_gui.core.remote.explain_ssh_failure``.

The last folder shown per host is remembered for the session (the settings schema has no per-host
key for it).
"""

from __future__ import annotations

import json
from typing import Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core import remote
from gaudi_gui.core.remote import Host
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


class RemoteFiles(QObject):
    """Starts listings; remembers the last folder shown per host."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._last: dict[str, str] = {}

    def list_folder(self, host: Host, path: str) -> Listing:
        """``path`` on ``host`` (``~`` is the host's home); the answer holds the folder as the host
        resolved it, its parent and entries (name, is_dir, model, size)."""
        listing = Listing(host, FOLDER, ["ls", "--json", "--", path], self)
        listing.finished.connect(
            lambda answer, _msg: self._remember(host.name, str(answer.get("path") or "")))
        return listing

    def list_cache(self, host: Host) -> Listing:
        """The models in ``host``'s Hugging Face cache (Hub ids, sizes, paths)."""
        return Listing(host, CACHE, ["ls", "--json", "--hf-cache"], self)

    def last_folder(self, host_name: str) -> str:
        """The folder last shown for this host in this session ("" when none)."""
        return self._last.get(host_name, "")

    def _remember(self, host_name: str, folder: str) -> None:
        if folder:
            self._last[host_name] = folder

"""The Runs list's "Open in TensorBoard" / "Open in trackio": one dashboard per (kind, machine), reused.

Each dashboard is a ``gaudi-gui runs open RUN --KIND --no-browser --json`` child on the machine that
holds the run (``commands/runs_open``: it exports the run, serves the dashboard on a free port of that
machine's 127.0.0.1, and answers one JSON line per run; each further run is one more line on its stdin).
It is an agent's ``dashboard`` child (``AgentChild``): this machine's agent's, or on a host that host's
agent's, reached through this machine's agent and its one ssh session to the host (the window starts
no process for it). A host's dashboard port is forwarded to a free port here by this machine's agent
(``hosts.forward``: on its link's connection, as for Serve); the URL given is this machine's. The
dashboards are not jobs: they end when this service shuts down (the window closes: stdin closed, then
the child's tree ended; the forward cancelled), and a host's when the link to it drops (its agent ends
it).

Qt adapter only: the export, the dashboard and its waiting are the command's (``core.dashboard``).
"""

from __future__ import annotations

import contextlib
import json
import os
from typing import Any

from PySide6.QtCore import QObject, QTimer, QUrl, Signal
from PySide6.QtGui import QDesktopServices

from gaudi_gui.core import dashboard
from gaudi_gui.core.placement import Forward
from gaudi_gui.core.remote import Host
from gaudi_gui.core.serve import pick_free_port
from gaudi_gui.services.agent_child import AgentChild, describe_exit
from gaudi_gui.services.forwards import request_forward

#: Tries of the agent's forward (1 s, then 2 s apart) before the forward is said to have failed.
FORWARD_ATTEMPTS = 3


class _Board:
    """One dashboard child: its runner, the runs waiting for their URL, its forward (a host's)."""

    def __init__(self, runner: AgentChild, kind: str, host: Host) -> None:
        self.runner, self.kind, self.host = runner, kind, host
        self.waiting: list[str] = []
        self.forward: Forward | None = None
        self.said: list[str] = []
        #: The command answered at least once (its own error lines say why it ended).
        self.answered = False


class DashboardService(QObject):
    #: (kind, url): the page at the run answers here (the browser is asked to open it when
    #: ``open_browser``; whether one did: ``shown``).
    opened = Signal(str, str)
    #: (kind, url, browser): the page at the run answers at ``url``, and ``browser`` says whether a
    #: browser was opened at it here (QDesktopServices.openUrl's answer: False where this session
    #: has no browser, or ``open_browser`` is off). Emitted just before ``opened``.
    shown = Signal(str, str, bool)
    #: (kind, message): why the run could not be opened: not installed (with the pip command), the
    #: export, the dashboard's end (its exit status and last lines), the forward.
    failed = Signal(str, str)
    #: (kind, message): what is under way ("opening run-a in TensorBoard on this machine…").
    state_changed = Signal(str, str)

    def __init__(self, parent: QObject | None = None, *, python: str = "") -> None:
        super().__init__(parent)
        #: The Python with tensorboard/trackio on this machine ('' = the app's own, or
        #: $GAUDI_GUI_DASHBOARD_PYTHON).
        self.python = python
        #: Open the browser at the run (the app: yes; tests intercept it with setUrlHandler).
        self.open_browser = True
        self.boards: dict[tuple[str, str], _Board] = {}
        #: The last URL per (kind, machine).
        self.urls: dict[tuple[str, str], str] = {}

    def running(self) -> list[tuple[str, str]]:
        """(kind, machine) of each dashboard child that runs."""
        return [key for key, board in self.boards.items() if board.runner.is_running()]

    def open(self, folder: str, kind: str, host: Host | None = None) -> None:
        """Open the run in ``folder`` (a path on ``host``) in ``kind``'s dashboard: the one already
        running for (kind, machine) when there is one, else a new one."""
        host = host or Host.local()
        where = "this machine" if host.is_local else host.name
        label = dashboard.LABELS[kind]
        key = (kind, host.name)
        board = self.boards.get(key)
        name = folder.rstrip("/").rsplit("/", 1)[-1]
        self.state_changed.emit(kind, f"opening {name} in {label} on {where}…")
        if board is not None and board.runner.is_running():
            board.waiting.append(folder)
            board.runner.write_line(folder)
            return
        # This machine's agent runs it, or the host's agent (the request names the host).
        runner = AgentChild(self, tail_lines=40, host=None if host.is_local else host.name)
        board = _Board(runner, kind, host)
        board.waiting.append(folder)
        self.boards[key] = board
        runner.line_received.connect(lambda stream, line: self._line(board, stream, line))
        runner.finished.connect(lambda code, status: self._ended(board, code, status))
        args = {"kind": kind, "folder": folder}
        if host.is_local:
            # This machine's Python with the dashboards; a host's command uses its own.
            args["python"] = self.python or os.environ.get("GAUDI_GUI_DASHBOARD_PYTHON", "")
        runner.start("dashboard", args)

    # -- the child's answers ------------------------------------------------------------------------

    def _line(self, board: _Board, stream: str, line: str) -> None:
        text = line.strip()
        if stream != "stdout" or not text.startswith("{"):
            if text:
                board.said.append(text)
            return
        try:
            message = json.loads(text)
        except ValueError:
            return
        if not isinstance(message, dict):
            return
        if board.waiting:
            board.waiting.pop(0)
        board.answered = True
        if message.get("t") == "error":
            self.failed.emit(board.kind, str(message.get("message", "")))
        elif message.get("t") == "opened" and isinstance(message.get("url"), str):
            self._opened(board, message)

    def _opened(self, board: _Board, message: dict[str, Any]) -> None:
        url, port = str(message["url"]), message.get("port")
        if board.host.is_local:
            self._show(board, url)
            return
        if not isinstance(port, int):
            self.failed.emit(board.kind, f"the dashboard on {board.host.name} gave no port")
            return
        if board.forward is not None and board.forward.remote_port == port:
            self._show(board, url.replace(f":{port}/", f":{board.forward.local_port}/", 1))
            return
        board.forward = Forward(pick_free_port(), port)
        self._ask_forward(board, url, attempt=1)

    def _ask_forward(self, board: _Board, url: str, attempt: int, cancel: bool = False) -> None:
        """The host's dashboard port forwarded here (or given back), asked of the agent."""
        if board.forward is not None:
            request_forward(board.host.name, board.forward, None if cancel else
                            lambda ok, why: self._forwarded(board, url, ok, why, attempt), cancel=cancel)

    def _forwarded(self, board: _Board, url: str, ok: bool, why: str, attempt: int) -> None:
        if not ok and board.runner.is_running() and attempt < FORWARD_ATTEMPTS:
            # A connection that is being made again refuses for a moment: asked again, with back-off.
            QTimer.singleShot(1000 * attempt, self, lambda: self._ask_forward(board, url, attempt + 1))
            return
        forward = board.forward
        if not ok or forward is None:
            self.failed.emit(board.kind, f"the forward of the dashboard on {board.host.name} failed"
                                         f"{': ' + why if why else ''}")
            return
        self._show(board, url.replace(f":{forward.remote_port}/", f":{forward.local_port}/", 1))

    def _show(self, board: _Board, url: str) -> None:
        self.urls[(board.kind, board.host.name)] = url
        # openUrl says whether the platform could hand the URL to a browser (False on a session
        # without one: a server's VNC, ssh -X without xdg-open, the offscreen platform).
        browsed = bool(QDesktopServices.openUrl(QUrl(url))) if self.open_browser else False
        self.shown.emit(board.kind, url, browsed)
        self.opened.emit(board.kind, url)

    def _ended(self, board: _Board, code: int, status: str) -> None:
        key = (board.kind, board.host.name)
        if self.boards.get(key) is board:
            del self.boards[key]
        if board.forward is not None:
            self._ask_forward(board, "", 0, cancel=True)  # the connection would keep the local port
            board.forward = None
        if board.runner.is_stopping():
            return
        if not board.waiting and (code == 0 or board.answered):
            return  # nobody waits, and the command's own answer said why it ended
        said = board.said or board.runner.tail(6)
        lines = "\n".join(said[-6:])
        where = "this machine" if board.host.is_local else board.host.name
        self.failed.emit(board.kind, f"{dashboard.LABELS[board.kind]} on {where} ended "
                                     f"({describe_exit(code, status)})" + (f": {lines}" if lines else ""))

    # -- the end ------------------------------------------------------------------------------------

    def shutdown(self) -> None:
        """End every dashboard (they are not kept after the window)."""
        for board in list(self.boards.values()):
            with contextlib.suppress(RuntimeError):
                board.runner.close_stdin()  # the command ends its dashboard and itself
                board.runner.terminate_tree(3000)


__all__ = ["DashboardService"]

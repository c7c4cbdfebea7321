"""A job of a kind other than training in the app (Serve, Evaluate): the agent's, followed.

The service asks this machine's agent to start ``gaudi-gui serve|eval …`` (``job.start``: the kind's own
``--detach``, a supervisor that owns a run folder of its kind in the runs store); for a saved host the
agent carries the request over its one ssh session to the host's agent, and the run folder is the
host's. The window starts no process: it follows the job through ``services/agent_job.JobFollow`` (its
events and log replayed from the start, then live; its record says how it ended), and Stop is
``job.stop`` (the kind's own stop, with its grace; a second Stop kills now). Closing the window lets the
user leave it running: the agent keeps it, and the next window asks the agents (this machine's, each
saved host's: ``jobs.list``) what runs and follows the newest job of its kind from its beginning, so the
view shows it as if it had never left. A lost connection to a host leaves the job going: the view says
so, and follows again when the link is back. Subclasses turn the events into their own signals
(``take_event``) and say how it ended (``take_end``).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject

from gaudi_gui.core.remote import Host
from gaudi_gui.services.agent_child import shared_client
from gaudi_gui.services.agent_job import FollowsJob, JobFollow

if TYPE_CHECKING:
    from gaudi_gui.services.agent_client import AgentClient


class KindJob(FollowsJob, QObject):
    """What Serve and Evaluate share: the start through the agent, the follower, stop, leave running,
    re-attach (services/jobs.py ``JobOwner``)."""

    #: "serve" or "eval" (core.kinds); the command is ``COMMAND``.
    KIND = ""
    COMMAND = ""
    #: Left running when the window closes (the user's choice), re-attached at the next start.
    outlives_window = True

    def __init__(self, parent: QObject | None = None,
                 client: Callable[[], AgentClient] = shared_client) -> None:
        super().__init__(parent)
        #: The runs store the job's folder goes to ("": the data folder's).
        self.runs_dir = ""
        #: Where the job runs: this machine, or a host (its supervisor and run folder are the host's).
        self.host = Host.local()
        #: The app's settings (what only the window knows of a job left running: a server's forward).
        self.settings: Any = None
        self.job = JobFollow(client, self)
        self.job.event_received.connect(self.take_event)
        self.job.line_received.connect(self._on_line)
        self.job.started.connect(self._on_started)
        self.job.refused.connect(self._on_refused)
        self.job.ended.connect(self.take_end)
        self.job.link_changed.connect(self.link_changed)
        #: The last lines of the job's log (for a failure said without an event).
        self.lines: list[str] = []
        #: What the start runs, as a person would type it (``gaudi-gui serve … --detach --json``).
        self.last_argv: list[str] = []

    @property
    def stop_sent(self) -> int:
        """0: no stop asked, 1: stop, 2: kill now."""
        return self.job.stop_sent

    def is_running(self) -> bool:
        return self.job.running

    def start_words(self, words: list[str], host: Host | None = None) -> None:
        """``gaudi-gui COMMAND WORDS --detach --json`` through the agent (for ``host``: the host's)."""
        self.host = host or Host.local()
        self.lines = []
        self.last_argv = self.host.gaudi_gui_argv(self.COMMAND, *words, "--detach", "--json")
        if self.host.is_local:
            # The job reads the window's relative paths and variables (an API key's, HF_HOME …).
            self.job.start(self.KIND, words, runs_dir=self.runs_dir, cwd=os.getcwd(), env=dict(os.environ))
        else:
            self.job.start(self.KIND, words, host=self.host.name)

    def reattach(self, hosts: Iterable[Host] = ()) -> bool:
        """Ask this machine's agent and each of ``hosts``' (``jobs.list``) for a running job of this
        kind, and follow the first found (the newest of that agent's) from its beginning. False when
        one is followed already."""
        if self.is_running():
            return False
        client = self.job.client()
        client.request("jobs.list", self._listed(Host.local()), runs_dir=self.runs_dir)
        for host in hosts:
            if not host.is_local:
                client.request("jobs.list", self._listed(host), host=host.name)
        return True

    def _listed(self, host: Host) -> Callable[[dict[str, Any]], None]:
        def take(reply: dict[str, Any]) -> None:
            if self.is_running() or not reply.get("ok"):
                return
            for record in reply.get("jobs") or []:  # newest first
                if isinstance(record, dict) and record.get("kind") == self.KIND and record.get("alive") \
                        and record.get("state") in ("queued", "running"):
                    self.host, self.lines = host, []
                    self.job.follow(record, "" if host.is_local else host.name)
                    self.attached(record)
                    return
        return take

    def attached(self, record: dict[str, Any]) -> None:
        """A running job was taken up again (``reattach``; ``record``: the agent's): the subclass may
        say so."""

    def stop(self) -> None:
        """``job.stop``: the supervisor stops the command (it ends its own processes within the kind's
        grace); pressed again, it kills now."""
        self.job.stop()

    def _on_line(self, line: str) -> None:
        self.lines = [*self.lines[-39:], line]

    def _on_started(self, record: dict[str, Any]) -> None:
        where = "" if self.host.is_local else f" on {self.host.name}"
        self._on_line(f"[gaudi-gui] run folder{where}: {record.get('folder')} (it goes on if the app"
                      f"{'' if self.host.is_local else ' or the connection'} ends)")

    def _on_refused(self, words: str) -> None:
        self._on_line(words)
        self.take_end("failed", f"Failed: {words}")

    def link_changed(self, state: str, words: str) -> None:
        """``lost``: the connection to where the job runs went (the job goes on); ``up``: it is back and
        the job is followed again. The subclass says so."""

    def take_event(self, event: dict[str, Any]) -> None:
        """One event of the command (as it printed it, kept in the run's events.jsonl)."""

    def take_end(self, state: str, summary: str) -> None:
        """The job ended (finished / stopped / failed / killed) with its supervisor's ``summary``."""

    # -- JobOwner (services/jobs.py) ---------------------------------------------------------------

    def followed_jobs(self) -> list[str]:
        """The agent's job id of the job followed (the close dialog names it once, as this service's)."""
        return [self.job.job_id] if self.is_running() and self.job.job_id and self.host.is_local else []

    def stop_jobs(self) -> None:
        self.stop()

    def detach_jobs(self) -> list[str]:
        """Stop following: the job goes on (the agent's) and is followed again next time."""
        if not self.is_running():
            return []
        folder = self.folder
        self.job.detach()
        return [folder] if self.host.is_local else [f"{self.host.name}:{folder}"]

    def shutdown(self) -> None:
        """The window goes: the follower ends, the job does not (Stop and quit stopped it already)."""
        self.job.detach()


__all__ = ["KindJob"]

"""A job of a kind other than training in the app (Serve, Evaluate): started detached, followed.

The service starts ``gaudi-gui serve|eval … --detach --json`` (``core.jobkind``: a supervisor that owns
a run folder of its kind in the runs store) and follows the run folder through a ``SupervisedPart``,
exactly as a training run on this machine is followed (``runs follow``: the events the command printed,
its log, the supervisor's status; ``runs stop`` to stop). Closing the window lets the user leave it
running; the next window re-attaches to the newest one still running (``reattach``), replaying its
events from the start, so the view shows it as if it had never left. Subclasses turn the events into
their own signals (``take_event``) and say how it ended (``take_end``).
"""

from __future__ import annotations

import contextlib
from typing import Any

from PySide6.QtCore import QObject

from gaudi_gui.core.kinds import canonical
from gaudi_gui.core.remote import Host
from gaudi_gui.core.runstore import Run, RunStore
from gaudi_gui.services.run_parts import SupervisedPart

#: Seconds a stopped Serve or Evaluate command gets to end its own processes before they are killed.
GRACE_S = 30.0
#: The settings key of the Serve and Evaluate jobs on hosts left running (one record each).
FOLLOWED_KEY = "jobs/followed_on_hosts"


class KindJob(QObject):
    """What Serve and Evaluate share: the detached start, the follower, stop, leave running, re-attach
    (services/jobs.py ``JobOwner``)."""

    #: "serve" or "eval" (core.kinds); the command is ``COMMAND``.
    KIND = ""
    COMMAND = ""
    #: Left running when the window closes (the user's choice), re-attached at the next start.
    outlives_window = True

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        #: The runs store the job's folder goes to ("": the data folder's).
        self.runs_dir = ""
        #: Where the job runs: this machine, or a host (its supervisor and run folder are the host's).
        self.host = Host.local()
        #: Where the followed jobs on hosts are kept for the next start (the app's settings).
        self.settings: Any = None
        self.part: SupervisedPart | None = None
        #: The job's run folder ("" until its supervisor announced it).
        self.folder = ""
        #: The last lines of the follow (for a failure said without an event).
        self.lines: list[str] = []
        self.last_argv: list[str] = []

    def is_running(self) -> bool:
        return self.part is not None and self.part.is_running()

    def _new_part(self) -> SupervisedPart:
        if self.part is not None:
            self.part.shutdown()
            self.part.deleteLater()
        part = SupervisedPart(self.host, grace_s=GRACE_S, runs_dir=self.runs_dir, parent=self)
        part.event_received.connect(self.take_event)
        part.line_received.connect(self._on_line)
        part.identified.connect(self._on_identified)
        part.ended.connect(lambda code, state, summary, lines: self.take_end(state, summary))
        self.part, self.folder, self.lines = part, "", []
        return part

    def start_words(self, words: list[str], host: Host | None = None) -> None:
        """Start ``gaudi-gui COMMAND WORDS --detach --json`` (on ``host``: there, over ssh) and follow
        what it announces."""
        self.host = host or Host.local()
        part = self._new_part()
        runs = ["--runs-dir", self.runs_dir] if self.runs_dir and self.host.is_local else []
        argv = [self.COMMAND, *words, "--detach", "--json", *runs]
        self.last_argv = self.host.gaudi_gui_argv(*argv)
        part.start_command(argv)

    def reattach(self) -> bool:
        """Follow the newest job of this kind still running in the runs store (from its beginning);
        False when there is none (or one is followed already)."""
        if self.is_running():
            return False
        records = self._records()
        for record in records[-1:]:
            self.host = Host.parse(str(record.get("host", "")), str(record.get("remote_command", "")))
            self._new_part().follow(str(record.get("folder", "")))
            self.folder = str(record.get("folder", ""))
            self.attached_record(record)
            self._keep([])
            return True
        self.host = Host.local()
        for run in RunStore(self.runs_dir or None).runs()[:50]:
            with contextlib.suppress(OSError):
                status = run.status()
                if status.kind == self.KIND and status.state in ("queued", "running") \
                        and run.supervisor() is not None:
                    self.follow(run)
                    return True
        return False

    def follow(self, run: Run) -> None:
        self._new_part().follow(str(run.folder), name=run.name)
        self.folder = str(run.folder)
        self.attached(run)

    def attached(self, run: Run) -> None:
        """A running job was taken up again (``reattach``): the subclass may say so."""

    def attached_record(self, record: dict[str, Any]) -> None:
        """A job on a host was taken up again from what ``detach_jobs`` kept (``record``)."""

    def record(self) -> dict[str, Any]:
        """What is kept of a job on a host to follow it again at the next start."""
        return {"kind": self.KIND, "host": self.host.name, "remote_command": self.host.remote_command,
                "folder": self.folder}

    def _records(self) -> list[dict[str, Any]]:
        with contextlib.suppress(Exception):
            if self.settings is not None:
                return [r for r in self.settings.get(FOLLOWED_KEY) or []
                        if isinstance(r, dict) and canonical(str(r.get("kind"))) == self.KIND
                        and r.get("folder")]
        return []

    def _keep(self, records: list[dict[str, Any]]) -> None:
        with contextlib.suppress(Exception):
            if self.settings is not None:
                others = [r for r in self.settings.get(FOLLOWED_KEY) or []
                          if isinstance(r, dict) and canonical(str(r.get("kind"))) != self.KIND]
                self.settings.set(FOLLOWED_KEY, others + records)

    def stop(self) -> None:
        """``runs stop``: the supervisor sends the command SIGTERM (it ends its own processes)."""
        if self.part is not None and self.is_running():
            self.part.stop()

    def _on_line(self, line: str) -> None:
        self.lines = [*self.lines[-39:], line]

    def _on_identified(self, folder: str) -> None:
        self.folder = folder

    def take_event(self, event: dict[str, Any]) -> None:
        """One event of the command (as it printed it, kept in the run's events.jsonl)."""

    def take_end(self, state: str, summary: str) -> None:
        """The job ended (finished / stopped / failed / killed) with its supervisor's ``summary``."""

    # -- JobOwner (services/jobs.py) ---------------------------------------------------------------

    def stop_jobs(self) -> None:
        self.stop()

    def detach_jobs(self) -> list[str]:
        """Stop following: the job goes on (its supervisor owns it) and is re-attached next time."""
        if not self.is_running() or self.part is None:
            return []
        self.part.detach()
        if not self.host.is_local:  # this machine's store is scanned; a host's job is remembered
            self._keep([self.record()])
            return [f"{self.host.name}:{self.folder}"]
        return [self.folder]

    def shutdown(self) -> None:
        """The window goes: the follower ends, the job does not (Stop and quit stopped it already)."""
        if self.part is not None:
            self.part.shutdown()


__all__ = ["GRACE_S", "KindJob"]

"""Every job of every kind the window started, in one registry: what the close dialog lists, stops or
leaves running, and what the status bar counts.

A job owner is a service or a view that runs child processes: the training service, the Serve server
and the Evaluate job (each a detached supervisor with a run folder, ``core.jobkind``: left running,
they outlive the window and are followed again at the next start), and the model runner's worker (it
lives with the window: it ends when the window closes, whichever choice the user makes, and the dialog
says so).
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core import kinds

if TYPE_CHECKING:
    from gaudi_gui.services.agent_client import AgentClient


@runtime_checkable
class JobOwner(Protocol):
    """A service or view that runs child processes the main window must account for when it closes."""

    #: Its jobs go on after the window closes when the user leaves them running (training, Serve,
    #: Evaluate); False: they end with the window whatever the choice (the runner).
    outlives_window: bool

    def active_jobs(self) -> list[str]:
        """One line per running job, for the 'jobs are running' question at close."""

    def stop_jobs(self) -> None:
        """Start stopping every job (asynchronous: ``active_jobs`` empties when they are gone)."""

    def detach_jobs(self) -> list[str]:
        """Leave jobs running after the app exits; returns what can be re-attached next start.

        Owners whose jobs cannot outlive the window stop them instead and return nothing."""

    def shutdown(self) -> None:
        """Release timers and processes; called once, right before the window closes."""


@dataclass(frozen=True)
class ActiveJob:
    """One running job as the close dialog names it."""

    text: str
    outlives_window: bool


class JobRegistry(QObject):
    """The app's one list of job owners (made in ``gaudi_gui.app.window_services``)."""

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._owners: list[JobOwner] = []

    def register(self, owner: JobOwner) -> None:
        """Account for ``owner``'s jobs from now on (a QObject leaves the registry when destroyed)."""
        if any(o is owner for o in self._owners):
            return
        self._owners.append(owner)
        if isinstance(owner, QObject):
            # Plain Python bookkeeping: safe when the registry's own C++ side went first.
            owner.destroyed.connect(lambda _obj=None, o=owner: self.unregister(o))

    def unregister(self, owner: JobOwner) -> None:
        self._owners = [o for o in self._owners if o is not owner]

    def owners(self) -> list[JobOwner]:
        return list(self._owners)


class AgentJobs(QObject):
    """The agent's running jobs (agent/jobs.py), as the close dialog lists them: what the agent started
    or took up again (the command line's too). Kept from its ``job`` events (a subscription without a
    key: every record now, then each change), never read from a file. They outlive the window: the
    agent keeps them; Stop asks the agent to stop each (a training run saves a checkpoint first)."""

    outlives_window = True
    #: The running jobs changed.
    changed = Signal()

    def __init__(self, client: AgentClient, parent: QObject | None = None, *,
                 registry: JobRegistry | None = None) -> None:
        super().__init__(parent)
        self._client = client
        #: The window's other job owners: a job one of them follows (``followed_job_ids``: a download
        #: the Models tab shows) or a run one of them follows itself (``followed_folders``: the agent
        #: takes up every run that was running when it started) is listed and stopped by it, not a
        #: second time here.
        self._registry = registry
        #: "Leave running and quit" was chosen: the agent keeps them.
        self._left = False
        #: job_id -> its record, while it runs.
        self.running: dict[str, dict[str, Any]] = {}
        from gaudi_gui.core.agentwire import Ev  # here: the window imports this module before its first paint

        client.subscribe(Ev.JOB, self._take)
        client.request("jobs.list", self._listed)

    def _listed(self, reply: dict[str, Any]) -> None:
        for record in (reply.get("jobs") or []) if reply.get("ok") else []:
            if isinstance(record, dict):
                self._keep(record)
        self.changed.emit()

    def _take(self, event: dict[str, Any]) -> None:
        record = event.get("job")
        if isinstance(record, dict):
            self._keep(record)
            self.changed.emit()

    def _keep(self, record: dict[str, Any]) -> None:
        job_id = str(record.get("job_id") or "")
        if not job_id:
            return
        if record.get("state") in ("queued", "running") or record.get("alive"):
            self.running[job_id] = record
        else:
            self.running.pop(job_id, None)

    def _own(self) -> list[str]:
        """The running jobs no other owner follows (none once they were left running)."""
        if self._left:
            return []
        ids: set[str] = set()
        folders: set[str] = set()
        for owner in self._registry.owners() if self._registry is not None else []:
            if owner is self:
                continue
            followed = getattr(owner, "followed_job_ids", None)
            if callable(followed):
                ids |= set(followed())
            followed = getattr(owner, "followed_folders", None)
            if callable(followed):
                folders |= set(followed())
        return [job_id for job_id in sorted(self.running) if job_id not in ids
                and str(self.running[job_id].get("folder") or "") not in folders]

    def active_jobs(self, skip: Collection[str] = ()) -> list[str]:
        """``skip``: the jobs another owner names already (Serve and Evaluate follow theirs)."""
        return [f"{kinds.text(str(r.get('kind') or ''))} {job_id}: {r.get('summary') or r.get('state')}"
                for job_id in self._own() if job_id not in skip for r in [self.running[job_id]]]

    def stop_jobs(self) -> None:
        for job_id in self._own():
            self._client.request("job.stop", None, job_id=job_id, now=False)

    def detach_jobs(self) -> list[str]:
        """The agent keeps them: nothing for the window to remember, and none is listed any more (the
        window stops whatever is still listed after "Leave running" as a job that ends with it)."""
        self._left = True
        return []

    def shutdown(self) -> None:
        from gaudi_gui.core.agentwire import Ev

        self._client.unsubscribe(Ev.JOB, self._take)


def close_question(jobs: list[ActiveJob]) -> str:
    """The close dialog's text: every running job, then what each choice does to each kind."""
    lines = [f"• {job.text}" for job in jobs]
    going = [j for j in jobs if j.outlives_window]
    ending = [j for j in jobs if not j.outlives_window]
    training = all(j.text.startswith("training") for j in going)
    noun = ("training run", "training runs") if training else ("job", "jobs")
    runs = (f"the {noun[0]} goes on and is" if len(going) == 1
            else f"the {len(going)} {noun[1]} go on and are")
    others = "the other job ends" if len(ending) == 1 else f"the other {len(ending)} jobs end"
    if going and ending:
        leave = (f"Leave running and quit: {runs} followed again at the next start; {others} now "
                 f"(the runner lives with this window).")
    elif going:
        leave = f"Leave running and quit: {runs} followed again at the next start."
    else:
        leave = ("Leave running and quit is not offered: these jobs live with this window and end "
                 "when it closes.")
    saves = any(j.text.startswith("training") for j in going)
    stop = ("Stop and quit: every job stops" + (" (training saves a checkpoint first)" if saves else "")
            + "; an evaluation keeps the results it has so far.")
    return "\n".join(lines) + "\n\n" + leave + "\n" + stop


__all__ = ["ActiveJob", "AgentJobs", "JobOwner", "JobRegistry", "close_question"]

"""Every job of every kind the window started, in one registry: what the close dialog lists, stops or
leaves running, and what the status bar counts.

A job owner is a service or a view that runs child processes: the training service, the Serve server
and the Evaluate job (each a detached supervisor with a run folder, ``core.jobkind``: left running,
they outlive the window and are followed again at the next start), and the model runner's worker (it
lives with the window: it ends when the window closes, whichever choice the user makes, and the dialog
says so).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from PySide6.QtCore import QObject


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


__all__ = ["ActiveJob", "JobOwner", "JobRegistry", "close_question"]

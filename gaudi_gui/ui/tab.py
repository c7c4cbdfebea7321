"""What the main window expects of a tab, beyond being a QWidget."""

from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class JobOwner(Protocol):
    """A tab that runs child processes the main window must account for when it closes."""

    def active_jobs(self) -> list[str]:
        """One line per running job, for the 'a job is running' question at close."""

    def stop_jobs(self) -> None:
        """Start stopping every job (asynchronous: ``active_jobs`` empties when they are gone)."""

    def detach_jobs(self) -> list[str]:
        """Leave jobs running after the app exits; returns what can be re-attached next start.

        Tabs whose jobs cannot outlive the window (the model runner's worker) stop them instead and
        return nothing."""

    def shutdown(self) -> None:
        """Release timers and processes; called once, right before the window closes."""

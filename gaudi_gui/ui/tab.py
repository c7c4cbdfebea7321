"""What the main window expects of a tab, beyond being a QWidget: a tab that runs child processes is a
``JobOwner`` (services/jobs.py, where every kind of job owner is described)."""

from __future__ import annotations

from gaudi_gui.services.jobs import JobOwner

__all__ = ["JobOwner"]

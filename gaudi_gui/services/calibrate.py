"""An FP8 calibration in the app: started by this machine's agent (``job.start`` of kind ``calibrate``:
the command's own ``--detach``, a run folder in the runs store), followed by its events.

The window starts no process: the agent starts ``gaudi-gui calibrate`` and replays then follows its
events (``event``: phase, rows measured, the manifest as its result) and its record (``job``: the state,
how it ended). The manifest is what the command writes in manifest.json (core.fp8).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject

from gaudi_gui.services.agent_job import AgentJob

if TYPE_CHECKING:
    from gaudi_gui.services.agent_client import AgentClient


class CalibrateJob(AgentJob):
    """One calibration at a time, through the agent."""

    def __init__(self, client: Callable[[], AgentClient], parent: QObject | None = None) -> None:
        super().__init__(client, parent, kind="calibrate")


__all__ = ["CalibrateJob"]

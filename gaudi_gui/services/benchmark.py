"""A benchmark in the app: started by this machine's agent (``job.start`` of kind ``benchmark``: the
command's own ``--detach``, a run folder in the runs store), followed by its events.

The window starts no process: the agent starts the job and replays then follows its events
(``event``: progress, the result record) and its record (``job``: the state, how it ended). The result
record is what ``gaudi-gui benchmark`` writes in result.json (core.benchmark: the figures, their
verdicts against the reference, a slow card with the doctor's findings).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject

from gaudi_gui.services.agent_job import AgentJob

if TYPE_CHECKING:
    from gaudi_gui.services.agent_client import AgentClient


class BenchmarkJob(AgentJob):
    """One benchmark at a time, through the agent."""

    def __init__(self, client: Callable[[], AgentClient], parent: QObject | None = None) -> None:
        super().__init__(client, parent, kind="benchmark")


__all__ = ["BenchmarkJob"]

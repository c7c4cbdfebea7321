"""A running job's meter as the agent of its machine reads it: the agent's ``meter`` event (agent/jobs.py),
what the Training tab's strip shows (power now, energy and card-hours so far).

The window reads no meter.jsonl: it subscribes to the job's ``meter`` (``key``: the job's id, its run
folder's name) through its one agent connection, and a run on a host is the host's agent's, carried over
that host's one ssh session the same way (``host``). A subscription is remade after a reconnect by the
client; a run that ended sends no more readings (its meter summary says what it cost).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core.agentwire import Ev

if TYPE_CHECKING:
    from gaudi_gui.services.agent_client import AgentClient


class RunMeter(QObject):
    """One followed job's meter at a time."""

    #: What the job's meter says so far (the event's ``meter``: power_w, energy_j, card_hours, samples,
    #: energy_coverage, last_t, and ``text``, the line a person reads), about once a second while it runs.
    reading_received = Signal(dict)

    def __init__(self, client: Callable[[], AgentClient] | None = None,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        if client is None:
            # This process's one client (as the agent's children speak through), connected on first
            # use. Not ``AppServices.ensure_agent``: that one also makes the agent's jobs the close
            # dialog's, and a run this window follows would then be counted twice (the agent takes up
            # a run that was running when it started).
            from gaudi_gui.services.agent_child import shared_client
            client = shared_client
        self._client_of = client
        self._client: AgentClient | None = None
        #: (job id, host: "" this machine) followed now, or None.
        self.followed: tuple[str, str] | None = None

    @property
    def following(self) -> bool:
        return self.followed is not None

    def follow(self, job_id: str, *, host: str = "", runs_dir: str = "") -> None:
        """Take ``job_id``'s readings (on ``host``'s agent where one is named). ``runs_dir``: the runs
        store on this machine the job is in, where it is not the data folder's (the agent is told of it
        first, so it finds the job by its id)."""
        if not job_id or self.followed == (job_id, host):
            return
        self.stop()
        self._client = self._client or self._client_of()
        if runs_dir and not host:
            # Requests are answered in the order sent: the store is known before the subscription.
            self._client.request("jobs.list", None, runs_dir=runs_dir)
        self.followed = (job_id, host)
        self._client.subscribe(Ev.METER, self._take, key=job_id, host=host or None)

    def stop(self) -> None:
        if self.followed is not None and self._client is not None:
            job_id, host = self.followed
            self._client.unsubscribe(Ev.METER, self._take, key=job_id, host=host or None)
        self.followed = None

    def _take(self, message: dict[str, Any]) -> None:
        reading = message.get("meter")
        if self.followed is not None and message.get("job_id") == self.followed[0] \
                and isinstance(reading, dict):
            self.reading_received.emit(reading)


__all__ = ["RunMeter"]

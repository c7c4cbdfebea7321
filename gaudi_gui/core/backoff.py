"""When repeated work runs. Exponential back-off between retries (a dead hl-smi, a dropped host, a lost
follower): the first retry after ``initial_s``, each next one twice as late, never later than
``max_s``; a success starts over. One rule for every retry loop, so a host that comes back is seen as
soon everywhere. And :func:`phase_s`: each host's periodic work at its own moment in the period.
Qt-free."""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field


@dataclass
class Backoff:
    initial_s: float = 1.0
    max_s: float = 30.0
    #: The delay the next retry waits (what "retrying in N s" says).
    delay_s: float = field(init=False)

    def __post_init__(self) -> None:
        self.delay_s = self.initial_s

    def reset(self) -> None:
        """A success: the next failure is retried after ``initial_s`` again."""
        self.delay_s = self.initial_s

    def next(self) -> float:
        """The delay to wait now; the one after is doubled (up to ``max_s``)."""
        delay = self.delay_s
        self.delay_s = min(self.max_s, self.delay_s * 2)
        return delay


def phase_s(key: str, period_s: float) -> float:
    """A fixed offset in [0, period_s) for ``key`` (a host's name). Every host answers its first
    sample at about the same moment, so periodic work started then (each host's process table, its
    queue listing: a process started here and a Python on the host) would run for all hosts at once,
    every period: a burst of starts the window waits through. Delaying each host's first period by
    its own offset spreads them, the same way at every start."""
    if period_s <= 0:
        return 0.0
    return (zlib.crc32(key.encode()) % 1000) / 1000 * period_s


__all__ = ["Backoff", "phase_s"]

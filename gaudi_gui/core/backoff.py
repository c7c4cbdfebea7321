"""Exponential back-off between retries (a dead hl-smi, a dropped host, a lost follower): the first
retry after ``initial_s``, each next one twice as late, never later than ``max_s``; a success starts
over. One rule for every retry loop, so a host that comes back is seen as soon everywhere. Qt-free."""

from __future__ import annotations

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


__all__ = ["Backoff"]

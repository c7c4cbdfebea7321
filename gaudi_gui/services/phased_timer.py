"""A host's periodic work at its own moment in the period (``core.backoff.phase_s``).

Every host answers its first sample at about the same moment, so work started then and repeated
every period (each host's process table, its queue listing: a process started here and a Python on
the host each time) would run for all hosts together, every period: a burst of starts that the
window's thread waits through. :class:`PhasedTimer` makes its first period longer by the host's
fixed phase; every later one is the period itself.
"""

from __future__ import annotations

from PySide6.QtCore import QObject, QTimer

from gaudi_gui.core.backoff import phase_s


class PhasedTimer(QTimer):
    """A repeating timer whose first period is ``period + phase_s(key, period)``, then ``period``
    (``key`` None: no phase, this machine's own work)."""

    def __init__(self, key: str | None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.key = key
        self._period_ms = 0
        self.timeout.connect(self._after_first)  # connected first: runs before the owner's slot

    def start_phased(self, period_s: float) -> None:
        """Start (or restart) with this period; the first one longer by the key's phase."""
        self._period_ms = int(period_s * 1000)
        phase = phase_s(self.key, period_s) if self.key is not None else 0.0
        self.start(self._period_ms + int(phase * 1000))

    def _after_first(self) -> None:
        if self.interval() != self._period_ms:  # the first, phased period is over
            self.setInterval(self._period_ms)


__all__ = ["PhasedTimer"]

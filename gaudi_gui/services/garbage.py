"""Python's cyclic garbage collected on the window's thread only.

CPython runs a collection on whichever thread happens to allocate when a generation's threshold is
crossed. The window's process has threads of its own (each doctor's, the process bookkeeper, exports,
dashboards, downloads' readers), so a cycle that holds a QObject (a widget and a lambda connected to
one of its signals, a service and its reader) can be collected on one of them: the QObject is then
destroyed off its thread. Qt says "QObject::killTimer: Timers cannot be stopped from another thread"
and the next turn of the event loop may crash (a fresh-clone run: a segmentation fault in
``processEvents`` of a later test, after that warning in an earlier one).

So :func:`collect_on_this_thread` turns automatic collection off and a timer of the window's thread
collects instead, by generation, as the thresholds would have (checked twice a second). Objects
without cycles are freed by reference counting as always, wherever their last reference goes.
"""

from __future__ import annotations

import gc

import shiboken6
from PySide6.QtCore import QCoreApplication, QObject, QThread, QTimer

#: How often the window's thread looks at the collector's counts.
CHECK_MS = 500

_INSTALLED: GarbageCollector | None = None


class GarbageCollector(QObject):
    """Automatic collection off while this object lives; :meth:`check` collects on its thread."""

    def __init__(self, parent: QObject) -> None:
        super().__init__(parent)
        self.thresholds = gc.get_threshold()
        #: Collections made, per generation (for a test and a curious reader).
        self.collections = [0, 0, 0]
        gc.disable()
        self._timer = QTimer(self)
        self._timer.setInterval(CHECK_MS)
        self._timer.timeout.connect(self.check)
        self._timer.start()
        self.destroyed.connect(gc.enable)

    def check(self) -> int:
        """Collect the generation the thresholds call for (none: -1); returns the generation."""
        count0, count1, count2 = gc.get_count()
        limit0, limit1, limit2 = self.thresholds
        if limit0 <= 0 or count0 <= limit0:
            return -1
        generation = 0
        if count1 + 1 > limit1:
            generation = 1
            if count2 + 1 > limit2:
                generation = 2
        gc.collect(generation)
        self.collections[generation] += 1
        return generation


def collect_on_this_thread() -> GarbageCollector | None:
    """Once per process, on the application's thread: automatic collection off, the application's
    thread collecting instead. None where there is no application yet or this is another thread."""
    global _INSTALLED
    app = QCoreApplication.instance()
    if app is None or QThread.currentThread() is not app.thread():
        return None  # (Qt's application thread is the main thread: QApplication must be made there)
    if _INSTALLED is None or not shiboken6.isValid(_INSTALLED):  # (or the application made anew)
        _INSTALLED = GarbageCollector(app)
    elif not _INSTALLED._timer.isActive():  # stopped from outside: collection would never happen
        gc.disable()
        _INSTALLED._timer.start()
    return _INSTALLED


__all__ = ["CHECK_MS", "GarbageCollector", "collect_on_this_thread"]

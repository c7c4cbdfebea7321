"""Python's cyclic garbage collected on the window's thread only.

CPython runs a collection on whichever thread happens to allocate when a generation's threshold is
crossed. The window's process has threads of its own (each doctor's, the process bookkeeper, exports,
dashboards, downloads' readers), so a cycle that holds a QObject (a widget and a lambda connected to
one of its signals, a service and its reader) can be collected on one of them: the QObject is then
destroyed off its thread. Qt says "QObject::killTimer: Timers cannot be stopped from another thread"
and the next turn of the event loop may crash (a fresh-clone run: a segmentation fault in
``processEvents`` of a later test, after that warning in an earlier one).

So :func:`collect_on_this_thread` turns automatic collection off and a timer of the window's thread
collects instead, by generation, as the interpreter would have (checked ten times a second). Objects
without cycles are freed by reference counting as always, wherever their last reference goes.

As the interpreter does, a full collection waits until the objects that reached the oldest
generation since the last one are a quarter of those it held then (CPython's ``long_lived_pending``
rule): a full pass over the window's ~90,000 objects takes 40 ms on a quiet machine and 120 ms in the
Hosts bench, and without the rule it ran every eleventh collection of the middle generation (the
Hosts bench: worst stall 58 ms against 13 ms for the bare children). Once the window has been built,
:meth:`GarbageCollector.settle` moves what exists then (modules, classes, the widgets) out of every
later pass (``gc.freeze``): a full pass then reads only what came after.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Callable

from PySide6.QtCore import QCoreApplication, QObject, QTimer

#: How often the window's thread looks at the collector's counts (a longer wait makes each young
#: collection larger: the same work, in longer stalls).
CHECK_MS = 100

_INSTALLED: GarbageCollector | None = None


class GarbageCollector(QObject):
    """Automatic collection off while this object lives; :meth:`check` collects on its thread."""

    def __init__(self, parent: QObject) -> None:
        super().__init__(parent)
        self.thresholds = gc.get_threshold()
        #: Collections made, per generation (for a test and a curious reader).
        self.collections = [0, 0, 0]
        #: Objects in the oldest generation after the last full collection (or the start).
        self.long_lived = len(gc.get_objects(2))
        self._declined_at: int | None = None
        gc.disable()
        self._timer = QTimer(self)
        self._timer.setInterval(CHECK_MS)
        self._timer.timeout.connect(self.check)
        self._timer.start()
        self.destroyed.connect(gc.enable)

    def check(self) -> int:
        """Collect the generation the interpreter would have (none: -1); returns the generation."""
        generation = due_generation(gc.get_count(), self.thresholds, self._full_allowed)
        if generation < 0:
            return -1
        gc.collect(generation)
        self.collections[generation] += 1
        if generation == 2:
            self.long_lived = len(gc.get_objects(2))
        return generation

    def settle(self) -> int:
        """Once the window is built: collect everything, then keep what is left (the modules, the
        classes, the window's widgets, the services) out of every later collection. Returns the
        number of objects set aside."""
        gc.collect()
        gc.freeze()
        self.long_lived = len(gc.get_objects(2))
        return gc.get_freeze_count()

    def _full_allowed(self) -> bool:
        """CPython's rule: a full collection once what reached the oldest generation since the last
        one is at least a quarter of what it held then. That only changes when a middle collection
        moves objects up (the oldest's count goes up with it): a "no" is kept until then."""
        count2 = gc.get_count()[2]
        if self._declined_at == count2:
            return False
        if len(gc.get_objects(2)) - self.long_lived >= self.long_lived / 4:
            return True
        self._declined_at = count2
        return False


def due_generation(counts: tuple[int, int, int], thresholds: tuple[int, ...],
                   full_allowed: Callable[[], bool]) -> int:
    """The generation CPython 3.11's ``collect_generations`` collects for these counts (-1: none): when
    the youngest passed its threshold, the oldest whose count passed its own, the oldest only where
    ``full_allowed()`` (asked only then)."""
    count0, count1, count2 = counts
    limit0, limit1, limit2 = thresholds[:3]
    if limit0 <= 0 or count0 <= limit0:
        return -1
    if count2 > limit2 and full_allowed():
        return 2
    return 1 if count1 > limit1 else 0


def collect_on_this_thread() -> GarbageCollector | None:
    """Once per process, on the application's thread: automatic collection off, the application's
    thread collecting instead. None where there is no application yet or this is another thread."""
    global _INSTALLED
    app = QCoreApplication.instance()
    if app is None or threading.current_thread() is not threading.main_thread():
        return None  # (Qt's application thread is the main thread: QApplication must be made there)
    if _INSTALLED is None:
        _INSTALLED = GarbageCollector(app)
    return _INSTALLED


__all__ = ["CHECK_MS", "GarbageCollector", "collect_on_this_thread", "due_generation"]

"""Cyclic garbage is collected on the window's thread only (services/garbage.py)."""

from __future__ import annotations

import gc
import threading
import weakref

from PySide6.QtCore import QObject, QTimer

from gaudi_gui.services.garbage import collect_on_this_thread


def test_a_cycle_holding_a_qt_object_is_collected_on_the_window_thread(qtbot) -> None:
    """A QObject with a running timer, in a reference cycle, becomes garbage; then another thread
    allocates enough to cross the collector's first threshold. With automatic collection that thread
    collected the cycle and destroyed the object there ("Timers cannot be stopped from another
    thread"; a fresh-clone run then crashed in processEvents). Now the window's thread does."""
    collector = collect_on_this_thread()
    assert collector is not None and not gc.isenabled()
    owner = QObject()
    QTimer(owner).start(1000)
    owner.setProperty("why", "a cycle")
    owner.me = owner  # type: ignore[attr-defined]  # a cycle: only the collector frees it
    gone_on: list[int] = []
    watch = weakref.ref(owner, lambda _ref: gone_on.append(threading.get_ident()))
    del owner
    threshold = gc.get_threshold()[0]

    def allocate() -> None:
        kept: list[list[int]] = [[] for _ in range(threshold * 4)]  # kept: a collection is due
        assert len(kept) == threshold * 4

    other = threading.Thread(target=allocate)
    other.start()
    other.join()
    held: list[list[int]] = []  # what the window's thread allocates meanwhile

    def collected() -> bool:
        # Allocated while it waits, not once before: the count is allocations less deallocations, and
        # an earlier test's widgets freed here (their deleteLater) took a count of 1,628 back under
        # the threshold before the collector's first look (this test failed after test_reward_charts).
        held.extend([] for _ in range(threshold))
        return watch() is None

    try:
        qtbot.waitUntil(collected, timeout=10000)
    except Exception as exc:  # what the collector saw, for whoever reads the failure
        raise AssertionError(f"not collected: counts {gc.get_count()}, thresholds {collector.thresholds}, "
                             f"collections {collector.collections}, timer active "
                             f"{collector._timer.isActive()}, gc enabled {gc.isenabled()}") from exc
    assert held and gone_on == [threading.get_ident()], "collected on another thread than the window's"

"""The window's collector (services/garbage.py): it collects what the interpreter would have, when it
would have, on the window's thread; full passes wait for CPython's quarter rule; ``settle`` sets the
built window aside."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from collections.abc import Callable

from gaudi_gui.services.garbage import due_generation

LIMITS = (700, 10, 10)


def test_the_generation_due_follows_the_interpreters_order() -> None:
    asked: list[int] = []

    def allowed(answer: bool) -> Callable[[], bool]:
        def ask() -> bool:
            asked.append(1)
            return answer
        return ask

    assert due_generation((700, 30, 30), LIMITS, allowed(True)) == -1  # the youngest has not passed
    assert due_generation((701, 0, 0), LIMITS, allowed(True)) == 0
    assert due_generation((701, 10, 10), LIMITS, allowed(True)) == 0  # "passed" is strictly over
    assert asked == []  # the quarter rule is asked only when a full pass is otherwise due
    assert due_generation((701, 11, 0), LIMITS, allowed(True)) == 1
    assert due_generation((701, 0, 11), LIMITS, allowed(True)) == 2
    assert due_generation((701, 0, 11), LIMITS, allowed(False)) == 0  # declined: the young one still
    assert due_generation((701, 11, 11), LIMITS, allowed(False)) == 1
    assert len(asked) == 3
    assert due_generation((701, 0, 0), (0, 10, 10), allowed(True)) == -1  # collection turned off


def test_full_passes_wait_for_the_quarter_rule_and_settle_sets_the_window_aside() -> None:
    """A real application thread in a child (settle freezes that process's objects for good): many
    middle collections and few full ones while a large long-lived heap stays; after ``settle`` a
    full pass reads only what came later; a cycle holding a QObject made after it is still freed, on
    the application's thread."""
    script = textwrap.dedent("""
        import gc, json, threading, weakref
        from PySide6.QtCore import QObject, QTimer
        from PySide6.QtWidgets import QApplication
        app = QApplication(["t"])
        from gaudi_gui.services.garbage import collect_on_this_thread
        collector = collect_on_this_thread()
        assert not gc.isenabled()
        kept = [[i] for i in range(200000)]  # a window's worth of long-lived objects
        for _ in range(40):  # reach the oldest generation
            [kept.append([j]) for j in range(800)]
            collector.check()
        gc.collect()
        collector.long_lived = len(gc.get_objects(2))
        before = list(collector.collections)
        def cycles():
            for _ in range(800):
                loop = []
                loop.append(loop)  # freed by a collection only: the young count goes up
        for _ in range(3000):  # a busy window: young cyclic garbage, nothing long-lived added
            cycles()
            collector.check()
        after = [a - b for a, b in zip(collector.collections, before)]
        frozen = collector.settle()
        freed_on = []
        class Holder(QObject):
            pass
        holder = Holder()
        holder.cycle = holder  # only the collector can free it
        watch = weakref.ref(holder, lambda _r: freed_on.append(threading.get_ident()))
        del holder
        for _ in range(200):
            if watch() is None:
                break
            cycles()
            collector.check()
        print(json.dumps({"after": after, "frozen": frozen, "gen2": len(gc.get_objects(2)),
                          "freed_on_main": freed_on == [threading.get_ident()]}))
    """)
    import json
    import os

    env = dict(os.environ, QT_QPA_PLATFORM="offscreen")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env,
                          timeout=120, check=False)
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout.strip().splitlines()[-1])
    young, middle, full = got["after"]
    assert young > 2000 and middle > 200, got
    assert full == 0, got  # 200,000 long-lived objects and none added: no full pass is due
    assert got["frozen"] > 200000 and got["gen2"] < 20000, got
    assert got["freed_on_main"], got

"""The window's thread does none of a child's process-tree bookkeeping (issue 26): every record of a
ProcessRunner's tree (a read of the whole process table) runs on the bookkeeping thread, and the
guarantees hold all the same: a stop reaches a descendant started after every record, a sweep
reaches what was recorded, and ``reap_all`` leaves nothing behind without an event loop."""

from __future__ import annotations

import functools
import sys
import threading

import psutil
import pytest

from gaudi_gui.core import proctree
from gaudi_gui.services import process
from gaudi_gui.services.process import EXIT_CRASHED, ProcessRunner
from tests.helpers import wait_until

#: A child that, for every line on its stdin, starts a helper in a session of its own (out of its
#: process group: only a record of its tree reaches it) and prints the helper's pid.
SPAWNER = """
import subprocess, sys, time
for line in sys.stdin:
    helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                              start_new_session=True)
    print("helper", helper.pid, flush=True)
    if line.strip() == "exit":
        break
"""


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


@pytest.fixture
def record_threads(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The thread of every ``ProcessTree.record`` from now on."""
    seen: list[int] = []
    original = proctree.ProcessTree.record

    def record(self: proctree.ProcessTree, *, fresh: bool = False) -> None:
        seen.append(threading.get_ident())
        original(self, fresh=fresh)

    monkeypatch.setattr(proctree.ProcessTree, "record", record)
    return seen


def _helpers(lines: list[tuple[str, str]]) -> list[int]:
    return [int(text.split()[1]) for _stream, text in lines if text.startswith("helper ")]


def test_records_run_off_the_gui_thread_and_a_stop_reaches_later_descendants(
        qtbot, record_threads: list[int]) -> None:
    runner = ProcessRunner()
    lines: list[tuple[str, str]] = []
    runner.line_received.connect(lambda s, t: lines.append((s, t)))
    with qtbot.waitSignal(runner.started, timeout=10000):
        assert runner.start(sys.executable, ["-c", SPAWNER], new_session=True, stdin_open=True)
    qtbot.waitUntil(lambda: len(record_threads) >= 1, timeout=10000)  # the start's record ran
    runner.write_line("go")  # a helper started after that record, in a session of its own
    qtbot.waitUntil(lambda: len(_helpers(lines)) == 1, timeout=10000)
    helper = _helpers(lines)[0]
    with qtbot.waitSignal(runner.finished, timeout=15000) as blocker:
        runner.kill_tree()
    assert blocker.args == [-9, EXIT_CRASHED]
    assert wait_until(lambda: _gone(helper), timeout=10), "the stop did not reach the later helper"
    assert len(record_threads) >= 2  # the start's record and the stop's
    assert threading.main_thread().ident not in record_threads, "a record ran on the window's thread"
    assert proctree.BOOKKEEPER.thread is not None
    assert set(record_threads) == {proctree.BOOKKEEPER.thread.ident}


def test_terminate_records_off_the_gui_thread_and_reaches_the_helper(
        qtbot, record_threads: list[int]) -> None:
    runner = ProcessRunner()
    lines: list[tuple[str, str]] = []
    runner.line_received.connect(lambda s, t: lines.append((s, t)))
    with qtbot.waitSignal(runner.started, timeout=10000):
        runner.start(sys.executable, ["-c", SPAWNER], new_session=True, stdin_open=True)
    runner.write_line("go")
    qtbot.waitUntil(lambda: len(_helpers(lines)) == 1, timeout=10000)
    helper = _helpers(lines)[0]
    before = len(record_threads)
    with qtbot.waitSignal(runner.finished, timeout=15000):
        runner.terminate_tree(grace_ms=5000)  # the child ends at SIGTERM: its helper is re-parented
    assert wait_until(lambda: _gone(helper), timeout=10), "SIGTERM did not reach the helper"
    assert len(record_threads) > before
    assert threading.main_thread().ident not in record_threads


def test_sweep_reaches_what_was_recorded_of_a_child_that_ended_by_itself(qtbot) -> None:
    runner = ProcessRunner()
    lines: list[tuple[str, str]] = []
    runner.line_received.connect(lambda s, t: lines.append((s, t)))
    with qtbot.waitSignal(runner.started, timeout=10000):
        runner.start(sys.executable, ["-c", SPAWNER], new_session=True, stdin_open=True)
    runner.write_line("go")
    qtbot.waitUntil(lambda: len(_helpers(lines)) == 1, timeout=10000)
    helper = _helpers(lines)[0]
    runner._record_descendants()
    qtbot.waitUntil(lambda: helper in runner.descendants(), timeout=10000)
    with qtbot.waitSignal(runner.finished, timeout=10000) as blocker:
        runner.write_line("exit")  # a second helper, then the child ends by itself
    assert blocker.args[1] == process.EXIT_NORMAL
    assert not _gone(helper)  # the child's end alone leaves it (re-parented to init)
    runner.sweep()
    assert wait_until(lambda: _gone(helper), timeout=10), "the sweep missed a recorded helper"
    for pid in _helpers(lines)[1:]:  # started after the last record: not ours to find any more
        psutil.Process(pid).kill()


def test_reap_all_ends_every_tree_without_an_event_loop(qtbot) -> None:
    runner = ProcessRunner()
    lines: list[tuple[str, str]] = []
    runner.line_received.connect(lambda s, t: lines.append((s, t)))
    with qtbot.waitSignal(runner.started, timeout=10000):
        runner.start(sys.executable, ["-c", SPAWNER], new_session=True, stdin_open=True)
    runner.write_line("go")
    qtbot.waitUntil(lambda: len(_helpers(lines)) == 1, timeout=10000)
    helper = _helpers(lines)[0]
    process.reap_all(timeout_ms=10000)  # the app's exit: no event loop runs after this
    assert not runner.is_running()
    assert wait_until(lambda: _gone(helper), timeout=10)


def test_bookkeeper_runs_work_in_order_and_survives_a_failure() -> None:
    keeper = proctree.Bookkeeper(name="test-bookkeeper")
    done: list[int] = []
    gate = threading.Event()
    keeper.submit(gate.wait)  # hold the thread: everything after waits its turn

    def fail() -> None:
        raise RuntimeError("a failing record")

    for i in range(5):
        keeper.submit(functools.partial(done.append, i))
        if i == 2:
            keeper.submit(fail)
    assert not keeper.wait_idle(timeout=0.05)  # held: not idle
    assert done == []
    gate.set()
    assert keeper.wait_idle(timeout=10)
    assert done == [0, 1, 2, 3, 4]
    assert keeper.thread is not None and keeper.thread is not threading.current_thread()
    assert keeper.thread.daemon


def test_the_bookkeeping_thread_is_named() -> None:
    keeper = proctree.Bookkeeper(name="named-keeper")
    keeper.submit(lambda: None)
    assert keeper.wait_idle(timeout=10)
    assert keeper.thread is not None and keeper.thread.name == "named-keeper"

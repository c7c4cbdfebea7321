"""ThreadedRunner (the device pollers' children): started, read and reaped off the window's thread, its
lines and end delivered on the window's thread in order, and a kill asked before the spawn spawns
nothing. Real tiny Python children."""

from __future__ import annotations

import subprocess
import sys
import threading

from gaudi_gui.services import threaded_process
from gaudi_gui.services.process import EXIT_CRASHED, EXIT_FAILED_TO_START, EXIT_NORMAL
from gaudi_gui.services.threaded_process import ThreadedRunner

CHILD = ("import sys\n"
         "for i in range(3): print(f'row {i}')\n"
         "sys.stdout.flush()\n"
         "print('last words', file=sys.stderr)\n"
         "sys.exit(3)\n")


def test_lines_and_end_come_on_the_window_thread_the_child_started_off_it(qtbot, monkeypatch) -> None:
    spawned_on: list[str] = []
    real_popen = subprocess.Popen

    def popen(*args: object, **kwargs: object) -> subprocess.Popen[bytes]:
        spawned_on.append(threading.current_thread().name)
        return real_popen(*args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(threaded_process.subprocess, "Popen", popen)
    runner = ThreadedRunner(tail_lines=10)
    seen: list[tuple[str, str, bool]] = []
    main = threading.main_thread()
    runner.line_received.connect(
        lambda stream, line: seen.append((stream, line, threading.current_thread() is main)))
    digested_on: list[str] = []

    def digest(lines: list[str]) -> list[str]:
        digested_on.append(threading.current_thread().name)
        return [line.upper() for line in lines]

    with qtbot.waitSignal(runner.finished, timeout=20000) as ended:
        assert runner.start(sys.executable, ["-c", CHILD], new_session=True, digest=digest)
        assert runner.is_running()  # at once, before the thread has spawned anything
    assert ended.args == [3, EXIT_NORMAL]
    assert not runner.is_running()
    assert spawned_on and spawned_on[0] != threading.main_thread().name
    assert [(s, line) for s, line, _main in seen] == [("stdout", "row 0"), ("stdout", "row 1"),
                                                      ("stdout", "row 2"), ("stderr", "last words")]
    assert all(main for _s, _l, main in seen)
    assert runner.tail(2) == ["row 2", "last words"]
    assert runner.digested is None and digested_on == []  # exit 3: no digest

    with qtbot.waitSignal(runner.finished, timeout=20000) as ended:
        runner.start(sys.executable, ["-c", "print('a'); print('b')"], digest=digest)
    assert ended.args == [0, EXIT_NORMAL]
    assert runner.digested == ["A", "B"]
    assert digested_on and digested_on[0] != threading.main_thread().name


def test_a_missing_program_is_a_failed_start_that_says_so(qtbot) -> None:
    runner = ThreadedRunner()
    with qtbot.waitSignal(runner.finished, timeout=10000) as ended:
        runner.start("gaudi-gui-no-such-program-here")
    assert ended.args == [-1, EXIT_FAILED_TO_START]
    assert "was not found" in runner.tail(1)[0]


def test_a_kill_before_the_spawn_spawns_nothing(qtbot, monkeypatch) -> None:
    gate = threading.Event()
    real_which = threaded_process.shutil.which

    def slow_which(program: str) -> str | None:
        gate.wait(10)  # the thread is held before its spawn until the kill has been asked
        return real_which(program)

    monkeypatch.setattr(threaded_process.shutil, "which", slow_which)
    runner = ThreadedRunner()
    with qtbot.waitSignal(runner.finished, timeout=10000) as ended:
        runner.start(sys.executable, ["-c", "import time; time.sleep(60)"], new_session=True)
        runner.kill_tree()
        gate.set()
    assert ended.args[1] == EXIT_CRASHED
    assert runner.pid == 0  # never spawned


def test_a_spawn_that_raises_anything_ends_failed_to_start_with_the_error(qtbot, monkeypatch) -> None:
    """Not only OSError: an escaped exception ended the child's thread with the runner "running" for
    good and no child (every later test's teardown then waited for it). A NUL in an argument is a
    ValueError from Popen; a test's patched Popen raises what it likes."""
    runner = ThreadedRunner()
    with qtbot.waitSignal(runner.finished, timeout=10000) as ended:
        runner.start(sys.executable, ["-c", "print('a')\0"])
    assert ended.args == [-1, EXIT_FAILED_TO_START]
    assert not runner.is_running() and runner.pid == 0
    assert "could not start" in runner.tail(1)[0] and "null" in runner.tail(1)[0], runner.tail()

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("started something")

    monkeypatch.setattr(threaded_process.subprocess, "Popen", refuse)
    with qtbot.waitSignal(runner.finished, timeout=10000) as ended:
        runner.start(sys.executable, ["-c", "pass"])
    assert ended.args == [-1, EXIT_FAILED_TO_START] and not runner.is_running()
    assert "AssertionError: started something" in runner.tail(1)[0], runner.tail()


def test_a_thread_that_cannot_start_is_a_failed_start(qtbot, monkeypatch) -> None:
    class NoThread(threading.Thread):
        def start(self) -> None:
            raise RuntimeError("can't start new thread")

    runner = ThreadedRunner()
    monkeypatch.setattr(threaded_process.threading, "Thread", NoThread)
    with qtbot.waitSignal(runner.finished, timeout=10000) as ended:
        runner.start(sys.executable, ["-c", "pass"])
        monkeypatch.undo()  # only this start meets it
    assert ended.args == [-1, EXIT_FAILED_TO_START] and not runner.is_running()
    assert "can't start new thread" in runner.tail(1)[0], runner.tail()


def test_a_reader_that_fails_ends_the_child_and_still_reports_the_end(qtbot, monkeypatch) -> None:
    """The child ran, then reading it failed (a bug, a select on a descriptor past FD_SETSIZE): the
    child is killed, its end reported with why, never a runner left "running" with its thread gone."""
    def broken(self: ThreadedRunner, fd: int, named: object, *, final: bool) -> bool:
        raise RuntimeError("reader broke")

    monkeypatch.setattr(ThreadedRunner, "_read", broken)
    runner = ThreadedRunner()
    with qtbot.waitSignal(runner.finished, timeout=20000) as ended:
        runner.start(sys.executable, ["-c", "import time; print('hi', flush=True); time.sleep(120)"],
                     new_session=True)
    assert ended.args[1] == EXIT_CRASHED and not runner.is_running(), ended.args
    assert any("reader broke" in line for line in runner.tail()), runner.tail()
    pid = runner.pid
    assert pid > 0
    import psutil
    assert not psutil.pid_exists(pid) or psutil.Process(pid).status() == psutil.STATUS_ZOMBIE


def test_a_child_is_read_through_descriptors_numbered_past_1024(qtbot) -> None:
    """A long-lived process with many files open gets pipes numbered past FD_SETSIZE, which select()
    refuses (ValueError): the child must be read all the same."""
    import os

    devnull = os.open(os.devnull, os.O_RDONLY)
    held = [devnull]
    try:
        while held[-1] < 1100:  # every lower number taken: the child's pipes and pidfd come above
            held.append(os.dup(devnull))
        runner = ThreadedRunner()
        with qtbot.waitSignal(runner.finished, timeout=20000) as ended:
            runner.start(sys.executable, ["-c", "print('read past 1024')"])
        assert ended.args == [0, EXIT_NORMAL], runner.tail()
        assert runner.tail(1) == ["read past 1024"]
    finally:
        for fd in held:
            os.close(fd)

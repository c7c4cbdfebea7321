"""What the stall benchmarks compare the app with, and the process table they run in.

``BareChildren``: the same children the app starts (a long-running stream, periodic reads, the
doctor), started by bare QProcesses whose output is thrown away. It holds what the app cannot avoid
on this machine: the children's own CPU (they share its cores here), the forks, the pipes.

``crowd(n)``: ``n`` idle processes in the process table while a benchmark runs. A Gaudi server or a
busy workstation lists 1,000-3,000 processes (kernel threads included); a container lists a hundred.
Whatever reads the whole table (psutil's ``children``) costs in proportion: 1.6 ms per read with
100 processes on the 2-core bench machine, 60 ms with 1,100. Without a crowd, a table scan on the
window's thread would hide here and freeze the window on a real server.

``worst_gap_ms``: the one stall measure: the longest gap between two ticks of a 1 ms QTimer while
the real event loop runs.
"""

from __future__ import annotations

import contextlib
import functools
import os
import subprocess
import time
from collections.abc import Callable, Iterator
from typing import Any

#: Idle processes added to the table (``BENCH_CROWD`` overrides; 0: none).
DEFAULT_CROWD = 1000


def crowd_size() -> int:
    return int(os.environ.get("BENCH_CROWD", str(DEFAULT_CROWD)))


@contextlib.contextmanager
def crowd(n: int) -> Iterator[int]:
    """``n`` sleeping processes (each in a session of its own, killed and reaped after the block)."""
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for _ in range(n):
            procs.append(subprocess.Popen(["sleep", "3600"], start_new_session=True,
                                          stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                          stderr=subprocess.DEVNULL))
        yield len(procs)
    finally:
        for proc in procs:
            with contextlib.suppress(OSError):
                proc.kill()
        for proc in procs:
            proc.wait()


def worst_gap_ms(seconds: float, *, skip_s: float = 0.0,
                 spans: list[tuple[float, float]] | None = None) -> list[float]:
    """Run the event loop ``seconds``; the gaps (ms) between ticks of a 1 ms timer, those of the
    first ``skip_s`` seconds left out. ``spans`` gets each counted gap's (start, end) perf_counter
    times (bench/stall_profile.py matches them with stack samples)."""
    from PySide6.QtCore import QEventLoop, QTimer

    gaps: list[float] = []
    begin = last = time.perf_counter()

    def tick() -> None:
        nonlocal last
        t = time.perf_counter()
        if t - begin >= skip_s:
            gaps.append((t - last) * 1000)
            if spans is not None:
                spans.append((last, t))
        last = t

    loop = QEventLoop()
    probe = QTimer()
    probe.setInterval(1)
    probe.timeout.connect(tick)
    begin = last = time.perf_counter()
    probe.start()
    QTimer.singleShot(int(seconds * 1000), loop.quit)
    loop.exec()
    probe.stop()
    return gaps or [0.0]


def _discard(proc: Any) -> None:
    """Read and drop what a child wrote (a slot that returns None: a lambda returning emit()'s value
    leaks references in PySide6)."""
    proc.readAllStandardOutput()
    proc.readAllStandardError()


class BareChildren:
    """Children started by bare QProcesses, output thrown away: ``stream(argv)`` once,
    ``every(seconds, argvs)`` now and then every ``seconds``; ``stop()`` kills and reaps them."""

    def __init__(self) -> None:
        self._procs: list[Any] = []
        self._timers: list[Any] = []

    def _start(self, argv: list[str], keep_stdin: bool) -> None:
        from PySide6.QtCore import QProcess

        proc = QProcess()
        proc.readyReadStandardOutput.connect(functools.partial(_discard, proc))
        proc.readyReadStandardError.connect(functools.partial(_discard, proc))
        proc.start(argv[0], argv[1:])
        if not keep_stdin:
            proc.closeWriteChannel()
        # Ended ones are dropped as the next ones start (a QProcess is kept until its child ended).
        from PySide6.QtCore import QProcess as Q

        self._procs = [p for p in self._procs if p.state() != Q.ProcessState.NotRunning]
        self._procs.append(proc)

    def stream(self, argv: list[str], *, keep_stdin: bool = False) -> None:
        self._start(argv, keep_stdin)

    def every(self, seconds: float, argvs: Callable[[], list[list[str]]]) -> None:
        from PySide6.QtCore import QTimer

        def fire() -> None:
            for argv in argvs():
                self._start(argv, False)

        timer = QTimer()
        timer.setInterval(int(seconds * 1000))
        timer.timeout.connect(fire)
        timer.start()
        self._timers.append(timer)
        fire()

    def stop(self) -> None:
        from PySide6.QtCore import QProcess

        for timer in self._timers:
            timer.stop()
        running = [p for p in self._procs if p.state() != QProcess.ProcessState.NotRunning]
        for proc in running:
            proc.kill()
        for proc in running:  # all killed first: one slow reap does not delay the others' kills
            proc.waitForFinished(30000)
        self._procs.clear()
        self._timers.clear()

"""A just-started child's tree is read from the processes started after it, not the whole table
(``proctree.fresh_descendants``): what a tree records at every child's start (the agent's children,
the CLI's)."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator

import psutil
import pytest

from gaudi_gui.core import proctree
from gaudi_gui.core.proctree import ProcessTree, pids_since
from tests.helpers import wait_until


def _created(pid: int) -> float:
    try:
        return psutil.Process(pid).create_time()
    except psutil.Error:
        return float("inf")


def test_pids_since_follows_the_kernels_cycle() -> None:
    listed = [1, 5, 300, 301, 900, 1000, 1001, 1500, 32000, 32767]
    assert pids_since(1000, 1500, listed) == [1001, 1500]  # (1000, 1500]
    assert pids_since(1000, 1000, listed) == []  # nothing handed out since
    # wrapped past pid_max since 32000: the newer ones are above it and at the bottom up to 301
    assert pids_since(32000, 301, listed) == [1, 5, 300, 301, 32767]


#: A child that starts a helper in a session of its own, prints its pid, then waits for its stdin.
SPAWNER = ("import subprocess, sys, time\n"
           "h = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'],\n"
           "                     start_new_session=True)\n"
           "print(h.pid, flush=True)\n"
           "sys.stdin.read()\n")


@pytest.fixture
def spawner() -> Iterator[tuple[subprocess.Popen[str], int]]:
    child = subprocess.Popen([sys.executable, "-c", SPAWNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    assert child.stdout is not None
    helper = int(child.stdout.readline())
    yield child, helper
    for pid in (helper, child.pid):
        with contextlib.suppress(psutil.Error):
            psutil.Process(pid).kill()
    child.wait(timeout=30)


def test_fresh_record_finds_the_tree_reading_only_newer_processes(
        spawner: tuple[subprocess.Popen[str], int], monkeypatch: pytest.MonkeyPatch) -> None:
    child, helper = spawner
    read: list[int] = []
    original = proctree._parent_of

    def parent_of(pid: int) -> int | None:
        read.append(pid)
        return original(pid)

    monkeypatch.setattr(proctree, "_parent_of", parent_of)
    started = psutil.Process(child.pid).create_time()
    older = [p for p in psutil.pids() if _created(p) < started - 1]
    assert older  # this process, its parents: ones a whole-table scan reads and this one must not
    tree = ProcessTree(child.pid, group=False)
    tree.record(fresh=True)
    assert tree.pids() == [helper]
    assert read and not set(read) & set(older), "read the stat of processes older than the child"


def test_fresh_record_falls_back_to_the_whole_table_when_it_cannot_tell(
        spawner: tuple[subprocess.Popen[str], int], monkeypatch: pytest.MonkeyPatch) -> None:
    child, helper = spawner
    # /proc/loadavg unreadable: fresh_descendants says it cannot tell; the record still finds the helper
    real_open = open

    def no_loadavg(path: object, *args: object, **kwargs: object) -> object:
        if path == "/proc/loadavg":
            raise PermissionError(path)
        return real_open(path, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.open", no_loadavg)
    assert proctree.fresh_descendants(psutil.Process(child.pid)) is None
    tree = ProcessTree(child.pid, group=False)
    tree.record(fresh=True)
    assert tree.pids() == [helper]
    monkeypatch.undo()
    tree.kill()
    assert wait_until(lambda: not psutil.pid_exists(helper)
                      or psutil.Process(helper).status() == psutil.STATUS_ZOMBIE, timeout=10)

"""ProcessRunner against real tiny Python children."""

from __future__ import annotations

import os
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from gaudi_gui.core import protocol
from gaudi_gui.services.process import (
    EXIT_CRASHED,
    EXIT_FAILED_TO_START,
    EXIT_NORMAL,
    ProcessRunner,
    describe_exit,
)


def _script(tmp_path: Path, body: str) -> str:
    path = tmp_path / "child.py"
    path.write_text(textwrap.dedent(body))
    return str(path)


def _collect(runner: ProcessRunner) -> dict[str, list]:
    got: dict[str, list] = {"lines": [], "progress": [], "messages": [], "errors": [], "bad": []}
    runner.line_received.connect(lambda s, t: got["lines"].append((s, t)))
    runner.progress_received.connect(lambda s, t: got["progress"].append(t))
    runner.message_received.connect(got["messages"].append)
    runner.error_occurred.connect(got["errors"].append)
    runner.protocol_error.connect(got["bad"].append)
    return got


def test_lines_progress_protocol_and_drain(qtbot, tmp_path: Path) -> None:
    script = _script(tmp_path, f"""
        import sys, time
        print("hello")
        sys.stderr.write("to stderr\\n")
        for pct in (10, 50, 90):
            sys.stdout.write(f"\\r{{pct}}%|####|"); sys.stdout.flush(); time.sleep(0.05)
        sys.stdout.write("\\r100%|####|\\n")
        print({protocol.event("step", n=1)!r})
        print({(protocol.PREFIX + "{{broken")!r})
        sys.stdout.buffer.write(b"bad utf8 \\xff\\xfe here\\n")
        sys.stdout.write("no newline at the end")
    """)
    runner = ProcessRunner()
    got = _collect(runner)
    with qtbot.waitSignal(runner.finished, timeout=10000) as blocker:
        assert runner.start(sys.executable, [script])
    assert blocker.args == [0, EXIT_NORMAL]
    lines = [t for _, t in got["lines"]]
    assert ("stderr", "to stderr") in got["lines"]
    assert "hello" in lines and "100%|####|" in lines
    assert lines[-1] == "no newline at the end"  # drained and flushed at exit
    assert any("\ufffd" in t for t in lines)  # decoded with errors="replace"
    assert got["messages"] == [{"type": "step", "n": 1}]
    assert len(got["bad"]) == 1 and "broken" in got["bad"][0]
    assert got["progress"] and all("%" in p for p in got["progress"])
    assert not any(protocol.PREFIX in t for t in lines)
    assert runner.tail(1) == ["no newline at the end"]


def test_program_not_found_is_a_clear_error(qtbot) -> None:
    runner = ProcessRunner()
    got = _collect(runner)
    with qtbot.waitSignal(runner.finished, timeout=5000) as blocker:
        assert not runner.start("definitely-not-a-program-xyz")
    assert blocker.args == [-1, EXIT_FAILED_TO_START]
    assert "not found" in got["errors"][0] and "definitely-not-a-program-xyz" in got["errors"][0]


def test_not_executable_file_fails_to_start(qtbot, tmp_path: Path) -> None:
    target = tmp_path / "not-exec"
    target.write_text("#!/bin/sh\necho hi\n")
    runner = ProcessRunner()
    with qtbot.waitSignal(runner.finished, timeout=5000) as blocker:
        runner.start(str(target))
    assert blocker.args[1] == EXIT_FAILED_TO_START


def test_exit_code_and_signal_death(qtbot, tmp_path: Path) -> None:
    runner = ProcessRunner()
    with qtbot.waitSignal(runner.finished, timeout=5000) as blocker:
        runner.start(sys.executable, ["-c", "import sys; print('last words'); sys.exit(3)"])
    assert blocker.args == [3, EXIT_NORMAL]
    assert describe_exit(*blocker.args) == "exited with code 3"
    assert runner.tail() == ["last words"]
    with qtbot.waitSignal(runner.finished, timeout=5000) as blocker:
        runner.start(sys.executable, ["-c", "import os, signal; os.kill(os.getpid(), signal.SIGKILL)"])
    assert blocker.args == [-9, EXIT_CRASHED]
    assert describe_exit(*blocker.args) == "killed by signal 9 (SIGKILL)"


def test_stdin_round_trip(qtbot) -> None:
    runner = ProcessRunner()
    got = _collect(runner)
    code = "import sys\nfor line in sys.stdin:\n    print('echo:' + line.strip(), flush=True)"
    with qtbot.waitSignal(runner.started, timeout=5000):
        runner.start(sys.executable, ["-c", code], stdin_open=True)
    runner.write_line("ping")
    qtbot.waitUntil(lambda: ("stdout", "echo:ping") in got["lines"], timeout=5000)
    with qtbot.waitSignal(runner.finished, timeout=5000):
        runner.close_stdin()


def test_terminate_tree_escalates_to_sigkill_and_reaps_grandchildren(qtbot, tmp_path: Path) -> None:
    # A launcher that ignores SIGTERM and whose own child sits in a session of its own (like torchrun's
    # workers): only the recorded-descendants kill can reach it.
    script = _script(tmp_path, """
        import os, signal, subprocess, sys, time
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        child = subprocess.Popen([sys.executable, "-c",
            "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"],
            start_new_session=True)
        print("child", child.pid, flush=True)
        time.sleep(600)
    """)
    runner = ProcessRunner()
    got = _collect(runner)
    runner.start(sys.executable, [script], new_session=True)
    qtbot.waitUntil(lambda: any(t.startswith("child ") for _, t in got["lines"]), timeout=10000)
    grandchild = int(next(t for _, t in got["lines"] if t.startswith("child ")).split()[1])
    runner._record_descendants()  # a stop records too; this checks the record itself finds it
    qtbot.waitUntil(lambda: grandchild in runner.descendants(), timeout=5000)
    with qtbot.waitSignal(runner.finished, timeout=15000) as blocker:
        runner.terminate_tree(grace_ms=300)
    assert blocker.args == [-9, EXIT_CRASHED]

    def gone() -> bool:
        try:
            return psutil.Process(grandchild).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    qtbot.waitUntil(gone, timeout=5000)


def test_start_twice_is_refused(qtbot) -> None:
    runner = ProcessRunner()
    with qtbot.waitSignal(runner.started, timeout=5000):
        runner.start(sys.executable, ["-c", "import time; time.sleep(30)"])
    with pytest.raises(RuntimeError):
        runner.start(sys.executable, ["-c", "pass"])
    with qtbot.waitSignal(runner.finished, timeout=5000):
        runner.kill_tree()


def test_detached_child_survives_reap_all(qtbot) -> None:
    import signal

    from gaudi_gui.services import process

    runner = ProcessRunner()
    with qtbot.waitSignal(runner.started, timeout=5000):
        runner.start(sys.executable, ["-c", "import time; time.sleep(60)"], new_session=True)
    runner.detach()
    process.reap_all(timeout_ms=500)
    assert runner.is_running() and process.detached_running()
    with qtbot.waitSignal(runner.finished, timeout=5000):
        os.killpg(runner.pid, signal.SIGKILL)
    assert not process.detached_running()


def test_delete_when_reaped_waits_for_the_killed_children(qtbot) -> None:
    """An owner deleted right after its children were killed would destroy a QProcess whose
    child is not reaped yet ('QProcess: Destroyed while process … is still running', an orphan):
    the owner goes only once every runner reported its end."""
    from PySide6.QtCore import QObject

    from gaudi_gui.services.process import delete_when_reaped

    owner = QObject()
    runners = [ProcessRunner(owner), ProcessRunner(owner)]
    for runner in runners:
        runner.start(sys.executable, ["-c", "import time; time.sleep(60)"])
    qtbot.waitUntil(lambda: all(r.pid > 0 for r in runners), timeout=10000)
    pids = [r.pid for r in runners]
    destroyed: list[bool] = []
    owner.destroyed.connect(lambda *_a: destroyed.append(True))
    spoke: list[str] = []
    owner.objectNameChanged.connect(spoke.append)
    runners[0].kill_tree()  # one already being stopped, one still running: both are waited for
    delete_when_reaped(owner)
    assert not destroyed
    owner.setObjectName("retired")  # its signals are blocked: nothing it does reaches a slot
    qtbot.waitUntil(lambda: bool(destroyed), timeout=10000)
    assert spoke == []
    assert not any(psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE
                   for p in pids)

    idle = QObject()  # nothing running: deleted on the next turn of the loop
    ProcessRunner(idle)
    gone: list[bool] = []
    idle.destroyed.connect(lambda *_a: gone.append(True))
    delete_when_reaped(idle)
    qtbot.waitUntil(lambda: bool(gone), timeout=5000)


@pytest.mark.parametrize("how", ["kill", "terminate"])
def test_a_kill_asked_before_the_child_started_is_not_lost(qtbot, tmp_path: Path, how: str) -> None:
    """Stop pressed right after Start: QProcess has no pid yet. The kill is done as the child starts
    (before, it was dropped and the child ran on with no one to stop it)."""
    marker = tmp_path / "ran"
    runner = ProcessRunner()
    runner.start(sys.executable, ["-c", f"import pathlib, time; time.sleep(1.5); "
                                        f"pathlib.Path({str(marker)!r}).write_text('x'); time.sleep(600)"])
    assert runner.pid == 0  # not started yet: nothing ran the event loop
    with qtbot.waitSignal(runner.finished, timeout=15000) as blocker:
        runner.kill_tree() if how == "kill" else runner.terminate_tree(grace_ms=5000)
    assert blocker.args == [-9, EXIT_CRASHED]
    # Dead (SIGKILL, reaped): it can write nothing any more, so no wait is needed to see it did not.
    assert not marker.exists()



def test_a_write_error_is_not_reported_ahead_of_the_childs_own_end(qtbot, tmp_path: Path) -> None:
    """ssh refused by a host writes why and exits before our first request reaches it; QProcess then
    says WriteError ("Error writing to process"), which was emitted as an error and heard first: the
    runner tab called a refused key a crash (fresh clone of f77d4c3, test_an_ssh_failure_is_said_in_
    words). The write error goes to the tail; the child's finish says why. Which of the two comes first
    is the scheduler's: here QProcess's own signal says WriteError while the child still runs."""
    from PySide6.QtCore import QProcess

    started = tmp_path / "started"
    script = _script(tmp_path, f"""
        import sys, time
        open({str(started)!r}, "w").close()
        time.sleep(1.0)
        sys.stderr.write("Permission denied (publickey).\\n")
        sys.exit(255)
    """)
    runner = ProcessRunner()
    got = _collect(runner)
    with qtbot.waitSignal(runner.finished, timeout=15000) as blocker:
        assert runner.start(sys.executable, [script])
        qtbot.waitUntil(started.exists, timeout=10000)
        runner._process.errorOccurred.emit(QProcess.ProcessError.WriteError)
    assert blocker.args[0] == 255
    assert got["errors"] == []
    assert ("stderr", "Permission denied (publickey).") in got["lines"]

"""The window's thread only paints (issue 26), and the window starts no process and no thread (issue 38):
every doctor of the health service is the agent's child (``AgentDoctor``: this machine's agent's, a
saved host's run by its agent), started, waited for and killed at its timeout there; the window's
thread sends the request and reads the report when the child's lines have come back. The report's
reader (``core.health``: it loaded importlib.metadata, 50-100 ms) is imported while the first doctor
runs, one module per turn of the event loop, on the window's thread: no thread does it any more.

Each test runs a real agent (the test's own, started by the first check) and real children: a fake
doctor interpreter given as the service's ``python`` (the agent runs it in place of
``python -m gaudi_gui doctor``), or, for the saved hosts, ssh to a server that takes the connection
and never answers (a host that hangs)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

#: A doctor that never answers (the agent runs it as this machine's doctor interpreter).
NEVER = "exec sleep 600"


def fake_python(tmp_path: Path, body: str, name: str = "fake-python") -> str:
    """An executable the agent runs in place of the doctor's interpreter (it ignores the doctor's
    arguments: ``-m gaudi_gui doctor --json …``)."""
    script = tmp_path / name
    script.write_text(f"#!/bin/sh\n{body}\n")
    script.chmod(0o755)
    return str(script)


@pytest.fixture
def silent_hosts(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """host-a, host-b, host-c: an ssh server that takes each connection and never says a word, so the
    checks of these hosts stay under way (the agent's link waits for the server's greeting, up to ssh's
    ConnectTimeout of 10 s) until the test closes it: then every waiting ssh is refused at once."""
    server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    server.bind(("127.0.0.1", 0))
    server.listen(16)  # never accepted: the kernel completes each connection, nobody answers
    port = server.getsockname()[1]
    config = tmp_path / "ssh_config"
    config.write_text(f"Host host-*\n  HostName 127.0.0.1\n  Port {port}\n  StrictHostKeyChecking no\n"
                      "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n")
    control = Path(tempfile.mkdtemp(prefix="ggh-"))  # short: a socket path has ~104 bytes
    monkeypatch.setenv("GAUDI_GUI_SSH_CONFIG", str(config))
    monkeypatch.setenv("GAUDI_GUI_SSH_CONTROL_DIR", str(control))
    try:
        yield server
    finally:
        server.close()
        shutil.rmtree(control, ignore_errors=True)


SCRIPT = textwrap.dedent("""
    import sys, threading, time
    from PySide6.QtWidgets import QApplication

    importers = []  # (module, the importing thread's name, whether HealthService.start was running)
    in_start = [False]
    READER = ("gaudi_gui.core.health", "gaudi_gui.core.preflight", "importlib.metadata")

    class Spy:
        def find_spec(self, name, path=None, target=None):
            if name in READER:
                importers.append((name, threading.current_thread().name, in_start[0]))
            return None

    sys.meta_path.insert(0, Spy())
    app = QApplication([])
    from gaudi_gui.services.agent_child import close_shared
    from gaudi_gui.services.health import READER_MODULES, HealthService
    from gaudi_gui.services.settings import Settings

    assert "gaudi_gui.core.health" not in sys.modules, "imported before the service started"
    pieces = []  # the reader's modules each turn imported
    piece = HealthService._import_reader_piece

    def spy(self):
        before = set(sys.modules)
        piece(self)
        pieces.append(sorted(m for m in set(sys.modules) - before if m in READER_MODULES))

    HealthService._import_reader_piece = spy
    threads = set(threading.enumerate())
    service = HealthService(Settings())
    service.python = sys.argv[1]  # a doctor that never answers: no report is read here
    in_start[0] = True
    service.start()
    in_start[0] = False
    assert service.is_checking("local")
    deadline = time.monotonic() + 60
    while not all(m in sys.modules for m in READER_MODULES) and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.01)  # polling a condition with a deadline
    assert service.is_checking("local"), "the doctor answered: this test needs one that does not"
    print("importers", importers)
    print("pieces", pieces)
    print("threads", sorted(t.name for t in set(threading.enumerate()) - threads))
    service.shutdown()
    while service.is_checking("local") and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.01)
    close_shared()
    app.processEvents()
    assert all(m in sys.modules for m in READER_MODULES), "the reader was never imported"
    assert [m for m, _t, _s in importers if m == "importlib.metadata"] == [], importers
    assert not [m for m, _t, during_start in importers if during_start], importers
    assert {t for _m, t, _s in importers} == {threading.main_thread().name}, importers
    assert all(len(p) <= 1 for p in pieces), pieces
    assert set(threading.enumerate()) == threads, threading.enumerate()
    print("ok")
""")


def test_start_imports_the_report_reader_one_module_per_turn(tmp_path: Path) -> None:
    """``HealthService.start`` imported ``core.health`` on a thread of its own; now the window's thread
    imports the reader one module per turn of its event loop while the first doctor runs (the largest,
    core.health, 4-5 ms of CPU), none of it inside ``start`` and never importlib.metadata (60-80 ms,
    which only the doctor's version check needs); no thread is started. In a fresh interpreter (this
    one imported core.health long ago); its agent is this test's (the same state folder), ended with it."""
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen"}
    done = subprocess.run([sys.executable, "-c", SCRIPT, fake_python(tmp_path, NEVER)], capture_output=True,
                          text=True, timeout=120, env=env, cwd=str(Path(__file__).resolve().parents[2]))
    assert done.returncode == 0 and done.stdout.rstrip().endswith("ok"), done.stdout + done.stderr[-3000:]


def test_a_refresh_starts_one_doctor_per_turn_of_the_event_loop(qtbot, tmp_path: Path,
                                                                 silent_hosts: socket.socket) -> None:
    """Each doctor start is an interpreter starting (the agent's child now, a fork of the app before);
    a refresh of many hosts used to start them all in one slot."""
    from gaudi_gui.services.health import LOCAL, HealthService
    from gaudi_gui.services.settings import Settings

    service = HealthService(Settings())
    service.python = fake_python(tmp_path, NEVER)
    for host in ("host-a", "host-b", "host-c"):
        service.watch_host(host)
    started: list[str] = []
    service.checking_changed.connect(lambda host, checking: started.append(host) if checking else None)
    service.refresh()
    assert started == [LOCAL]  # the first at once, the others on later turns
    qtbot.waitUntil(lambda: len(started) == 4, timeout=10000)
    assert started == [LOCAL, "host-a", "host-b", "host-c"]
    assert all(service.is_checking(h) for h in started)
    service.refresh()  # all being checked: nothing more starts
    service.shutdown()
    silent_hosts.close()  # the hosts' ssh connections end: their checks end at once
    qtbot.waitUntil(lambda: not any(service.is_checking(h) for h in started), timeout=30000)
    assert started == [LOCAL, "host-a", "host-b", "host-c"]


def test_a_stop_drops_the_checks_not_started_yet(qtbot, tmp_path: Path) -> None:
    from gaudi_gui.services.health import LOCAL, HealthService
    from gaudi_gui.services.settings import Settings

    service = HealthService(Settings())
    service.python = fake_python(tmp_path, NEVER)
    service.watch_host("host-a")
    started: list[str] = []
    service.checking_changed.connect(lambda host, checking: started.append(host) if checking else None)
    service.refresh()
    service.stop()  # host-a's start was still waiting for its turn
    qtbot.waitUntil(lambda: not service.is_checking(LOCAL), timeout=30000)
    # host-a's turn has come and gone by now: 40 ms after the refresh, on a 10 s deadline
    probe: list[bool] = []
    from PySide6.QtCore import QTimer
    QTimer.singleShot(200, lambda: probe.append(True))
    qtbot.waitUntil(lambda: bool(probe), timeout=10000)
    assert started == [LOCAL]
    service.shutdown()


#: A doctor that answers with a report of one finding (the JSON the real doctor prints).
REPORT = ('{"version": 1, "hosts": [{"host": "local", "reachable": true, "findings": [{"check": '
          '"driver.loaded", "severity": "warning", "seen": "habanalabs not loaded"}]}], "cross_host": []}')


def test_a_doctor_runs_in_the_agent_while_the_window_keeps_turning(qtbot, monkeypatch,
                                                                   tmp_path: Path) -> None:
    """With 4 hosts, the doctors' starts (a fork of the app each) and their reads froze the window
    300-400 ms at every refresh (issue 26); a thread per doctor took them off the window's thread. Now
    the doctor is the agent's child: its parent is the agent, not this process, no thread is started
    here, the window's event loop keeps turning while it runs (a 20 ms timer ticks all along), and its
    report, read once when the child's lines are in, arrives whole."""
    from PySide6.QtCore import QTimer

    from gaudi_gui.services import health as health_module
    from gaudi_gui.services.health import LOCAL, HealthService
    from gaudi_gui.services.settings import Settings

    readers: list[int] = []
    real = health_module.read_report

    def spy(*args: object, **kwargs: object) -> object:
        readers.append(threading.get_ident())
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(health_module, "read_report", spy)
    parent = tmp_path / "parent"
    # The doctor says who started it, takes a second, then prints the report.
    service = HealthService(Settings())
    service.python = fake_python(tmp_path, f"echo $PPID > {parent}\nsleep 1\necho '{REPORT}'")
    reports: list[str] = []
    service.report_changed.connect(reports.append)
    threads = set(threading.enumerate())
    ticks: list[bool] = []  # each tick: was the doctor running then
    ticker = QTimer()
    ticker.setInterval(20)
    ticker.timeout.connect(lambda: ticks.append(service.is_checking(LOCAL)))
    ticker.start()
    try:
        service.refresh()
        assert service.is_checking(LOCAL)
        qtbot.waitUntil(lambda: reports == [LOCAL], timeout=60000)
    finally:
        ticker.stop()
    assert set(threading.enumerate()) == threads  # no thread of the window's
    doctor_parent = psutil.Process(int(parent.read_text()))
    assert doctor_parent.pid != os.getpid() and "agent" in doctor_parent.cmdline(), doctor_parent.cmdline()
    # The window's thread turned while the doctor slept its second (20 ms ticks: about 50 of them).
    assert sum(ticks) >= 10, f"{sum(ticks)} ticks of the window's event loop while the doctor ran"
    assert readers == [threading.get_ident()]  # read once, on the window's thread, when it ended
    found = service.health(LOCAL)
    assert found is not None and found.reachable
    assert [f.check for f in found.findings] == ["driver.loaded"] and service.worst(LOCAL) == "warning"
    assert not service.is_checking(LOCAL)
    service.shutdown()


def _hung_doctor(tmp_path: Path, *, own_session: bool) -> tuple[str, Path]:
    """A doctor interpreter that starts a helper (in the doctor's session, or in a session of its own),
    writes the helper's pid and hangs; and the file it writes."""
    pids = tmp_path / "pids"
    script = tmp_path / "hung_doctor.py"
    script.write_text(textwrap.dedent(f"""
        import subprocess, sys, time
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"],
                                  start_new_session={own_session})
        open({str(pids)!r}, "w").write(str(helper.pid))
        time.sleep(600)
    """))
    return fake_python(tmp_path, f"exec {sys.executable} {script}"), pids


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def test_a_hung_doctor_is_killed_with_its_tree(qtbot, tmp_path: Path) -> None:
    """The timeout kills the doctor and what it started in its session (the agent ends the child's
    process group), and the host reads "did not answer"."""
    from gaudi_gui.services.health import LOCAL, HealthService
    from gaudi_gui.services.settings import Settings

    settings = Settings()
    settings.set("health/timeout_s", 5.0)
    service = HealthService(settings)
    service.python, pids = _hung_doctor(tmp_path, own_session=False)
    service.refresh()
    qtbot.waitUntil(lambda: service.health(LOCAL) is not None, timeout=60000)
    found = service.health(LOCAL)
    assert found is not None and not found.reachable and "did not answer within 5 s" in found.error
    helper = int(pids.read_text())
    qtbot.waitUntil(lambda: _gone(helper), timeout=30000)
    assert helper != os.getpid()
    service.shutdown()


def test_a_hung_doctors_helper_in_its_own_session_is_killed_too(qtbot, tmp_path: Path) -> None:
    """As above, with the doctor's helper in a session of its own (as hl-smi's calls are): the host
    still reads "did not answer" at the timeout, and the helper is gone."""
    from gaudi_gui.services.health import LOCAL, HealthService
    from gaudi_gui.services.settings import Settings

    settings = Settings()
    settings.set("health/timeout_s", 5.0)
    service = HealthService(settings)
    service.python, pids = _hung_doctor(tmp_path, own_session=True)
    service.refresh()
    try:
        qtbot.waitUntil(lambda: service.health(LOCAL) is not None, timeout=30000)
        found = service.health(LOCAL)
        assert found is not None and not found.reachable and "did not answer within 5 s" in found.error
        helper = int(pids.read_text())
        qtbot.waitUntil(lambda: _gone(helper), timeout=30000)
    finally:
        # What this test started, ended by its pid, so that the agent's child ends and nothing is left.
        if pids.exists() and not _gone(int(pids.read_text())):
            psutil.Process(int(pids.read_text())).kill()
        qtbot.waitUntil(lambda: not service.is_checking(LOCAL), timeout=30000)
        service.shutdown()


def test_a_removed_host_reports_nothing_and_its_check_is_ended(qtbot, tmp_path: Path,
                                                                silent_hosts: socket.socket) -> None:
    from gaudi_gui.services.health import HealthService
    from gaudi_gui.services.settings import Settings

    service = HealthService(Settings())
    service._hosts = []  # only the host below
    service.watch_host("host-a")
    service.start()
    check = service._checks["host-a"]
    assert service.is_checking("host-a")
    reports: list[str] = []
    service.report_changed.connect(reports.append)
    with qtbot.waitSignal(check.destroyed, timeout=30000):
        service.unwatch_host("host-a")
        assert reports == ["host-a"]  # the removal itself, said at once
        silent_hosts.close()  # the host's connection ends: the retired check's start fails at once
    assert reports == ["host-a"] and service.health("host-a") is None
    service.shutdown()


_LAST_HOLDER = textwrap.dedent("""
    import gc, sys, time
    from PySide6.QtCore import QCoreApplication, QEvent
    from PySide6.QtWidgets import QApplication
    app = QApplication([])
    from gaudi_gui.services.agent_child import close_shared
    from gaudi_gui.services.health import HealthService
    from gaudi_gui.services.settings import Settings

    gc.disable()  # the references alone decide who frees what (no collection in between)
    service = HealthService(Settings())  # parentless: Python owns it, as a test's service
    service._hosts = []
    service.watch_host("host-a")  # its ssh is refused (port 1): the check ends soon after it starts
    service.start()
    check = service._checks["host-a"]
    service.unwatch_host("host-a")  # the check is retired: killed, then deleted later
    deadline = time.monotonic() + 30
    while check._child.is_running() and time.monotonic() < deadline:
        app.processEvents()  # (no deferred delete runs here: the check is deleted below)
        time.sleep(0.01)
    assert not check._child.is_running(), "the retired check never ended"
    service.shutdown()
    del service, check  # nobody holds the service now but what its check holds
    app.processEvents()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    close_shared()
    app.processEvents()
    print("survived")
""")


def test_a_retired_check_never_frees_the_service_that_owns_it(tmp_path: Path) -> None:
    """A check's connection must not be the last holder of its parent. It was (a lambda holding the
    service): a parentless service, retired check and dropped service left that lambda the last
    reference, the check's deferred delete freed the service from inside the check's destructor, and
    the service's destructor deleted the check again: a segmentation fault in ``processEvents``
    (fresh clones #20 and #27, after
    ``test_a_removed_host_reports_nothing_and_its_check_is_ended``). In a child interpreter: a
    crash must fail this test, not the worker; its agent is this test's (the same state folder)."""
    config = tmp_path / "ssh_config"
    config.write_text("Host host-*\n  HostName 127.0.0.1\n  Port 1\n  LogLevel ERROR\n")
    env = {**os.environ, "QT_QPA_PLATFORM": "offscreen", "GAUDI_GUI_SSH_CONFIG": str(config)}
    done = subprocess.run([sys.executable, "-c", _LAST_HOLDER], capture_output=True, text=True, timeout=120,
                          env=env)
    assert done.returncode == 0 and "survived" in done.stdout, (done.returncode, done.stderr[-2000:])

"""The window's thread only paints (issue 26): the health service's first report read used to import
``core.health`` (importlib.metadata, 50-100 ms) on the window's thread. ``HealthService.start`` now
imports it on a thread of its own before any report can come back. Checked in a fresh interpreter
(this one imported core.health long ago), with an import hook that names the importing thread."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

SCRIPT = textwrap.dedent("""
    import sys, threading, time
    from PySide6.QtWidgets import QApplication

    importers = []

    class Spy:
        def find_spec(self, name, path=None, target=None):
            if name == "gaudi_gui.core.health":
                importers.append(threading.current_thread().name)
            return None

    sys.meta_path.insert(0, Spy())
    app = QApplication([])
    from gaudi_gui.services.health import HealthService
    from gaudi_gui.services.process import reap_all
    from gaudi_gui.services.settings import Settings

    assert "gaudi_gui.core.health" not in sys.modules, "imported before the service started"
    service = HealthService(Settings())
    # A doctor that never answers: no report is read here, no event loop runs.
    service.command = [sys.executable, "-c", "import time; time.sleep(600)"]
    service.start()
    deadline = time.monotonic() + 60
    while "gaudi_gui.core.health" not in sys.modules and time.monotonic() < deadline:
        time.sleep(0.05)  # polling a condition with a deadline
    service.shutdown()
    reap_all()
    print("importers", importers)
    assert importers and importers[0] != threading.main_thread().name, importers
""")


def test_start_imports_the_report_reader_off_the_gui_thread(tmp_path: Path) -> None:
    env = {"QT_QPA_PLATFORM": "offscreen", "GAUDI_GUI_HOME": str(tmp_path), "PATH": "/usr/bin:/bin",
           "HOME": str(tmp_path)}
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120,
                          env=env, cwd=str(Path(__file__).resolve().parents[2]))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "gaudi-gui-health-import" in done.stdout


def test_a_refresh_starts_one_doctor_per_turn_of_the_event_loop(qtbot) -> None:
    """Each doctor start forks the app; a refresh of many hosts used to fork them all in one slot."""
    from gaudi_gui.services.health import LOCAL, HealthService
    from gaudi_gui.services.settings import Settings

    service = HealthService(Settings())
    service.command = [sys.executable, "-c", "import time; time.sleep(600)"]  # never answers
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
    qtbot.waitUntil(lambda: not any(service.is_checking(h) for h in started), timeout=10000)
    assert started == [LOCAL, "host-a", "host-b", "host-c"]


def test_a_stop_drops_the_checks_not_started_yet(qtbot) -> None:
    from gaudi_gui.services.health import LOCAL, HealthService
    from gaudi_gui.services.settings import Settings

    service = HealthService(Settings())
    service.command = [sys.executable, "-c", "import time; time.sleep(600)"]
    service.watch_host("host-a")
    started: list[str] = []
    service.checking_changed.connect(lambda host, checking: started.append(host) if checking else None)
    service.refresh()
    service.stop()  # host-a's start was still waiting for its turn
    qtbot.waitUntil(lambda: not service.is_checking(LOCAL), timeout=10000)
    # host-a's turn has come and gone by now: 40 ms after the refresh, on a 10 s deadline
    probe: list[bool] = []
    from PySide6.QtCore import QTimer
    QTimer.singleShot(200, lambda: probe.append(True))
    qtbot.waitUntil(lambda: bool(probe), timeout=10000)
    assert started == [LOCAL]


#: A doctor that answers with a report of one finding (the JSON the real doctor prints).
REPORT = ('{"version": 1, "hosts": [{"host": "local", "reachable": true, "findings": [{"check": '
          '"driver.loaded", "severity": "warning", "seen": "habanalabs not loaded"}]}], "cross_host": []}')


def test_a_doctor_is_started_and_its_report_read_off_the_gui_thread(qtbot, monkeypatch) -> None:
    """With 4 hosts, the doctors' starts (a fork of the app each) and their reads froze the window
    300-400 ms at every refresh (issue 26). The thread ids the check records say where each ran; the
    report arrives on the window's thread whole."""
    import threading

    from gaudi_gui.services import health as health_module
    from gaudi_gui.services.health import LOCAL, HealthService
    from gaudi_gui.services.settings import Settings

    readers: list[int] = []
    real = health_module.read_report

    def spy(*args: object, **kwargs: object) -> object:
        readers.append(threading.get_ident())
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(health_module, "read_report", spy)
    service = HealthService(Settings())
    service.command = [sys.executable, "-c", f"print({REPORT!r})"]
    reports: list[str] = []
    service.report_changed.connect(reports.append)
    service.refresh()
    check = service._checks[LOCAL]
    from gaudi_gui.services.doctor_child import DoctorChild
    assert isinstance(check, DoctorChild)  # the service's own rules (the app's runs in the agent)
    assert service.is_checking(LOCAL)
    qtbot.waitUntil(lambda: reports == [LOCAL], timeout=60000)
    main = threading.get_ident()
    assert check.thread_ids["start"] != main and check.thread_ids["read"] != main
    assert readers == [check.thread_ids["read"]]
    found = service.health(LOCAL)
    assert found is not None and found.reachable
    assert [f.check for f in found.findings] == ["driver.loaded"] and service.worst(LOCAL) == "warning"
    assert not service.is_checking(LOCAL)
    service.shutdown()


def test_a_hung_doctor_is_killed_with_its_tree_off_the_gui_thread(qtbot, tmp_path: Path) -> None:
    """The timeout kills the doctor and what it started (a helper in the doctor's session and one in
    a session of its own), and the host reads "did not answer"."""
    import os

    import psutil

    from gaudi_gui.services.health import LOCAL, HealthService
    from gaudi_gui.services.settings import Settings

    pids = tmp_path / "pids"
    script = textwrap.dedent(f"""
        import subprocess, sys, time
        a = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        b = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
        open({str(pids)!r}, "w").write(f"{{a.pid}} {{b.pid}}")
        time.sleep(600)
    """)
    settings = Settings()
    settings.set("health/timeout_s", 5.0)
    service = HealthService(settings)
    service.command = [sys.executable, "-c", script]
    service.refresh()
    qtbot.waitUntil(lambda: service.health(LOCAL) is not None, timeout=60000)
    found = service.health(LOCAL)
    assert found is not None and not found.reachable and "did not answer within 5 s" in found.error
    helpers = [int(p) for p in pids.read_text().split()]
    assert len(helpers) == 2

    def gone(pid: int) -> bool:
        try:
            return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return True

    qtbot.waitUntil(lambda: all(gone(p) for p in helpers), timeout=30000)
    assert os.getpid() not in helpers
    service.shutdown()


def test_a_removed_host_reports_nothing_and_its_doctor_is_killed(qtbot) -> None:
    from gaudi_gui.services.health import HealthService
    from gaudi_gui.services.settings import Settings

    service = HealthService(Settings())
    service.command = [sys.executable, "-c", "import time; time.sleep(600)"]
    service._hosts = []  # only the host below
    service.watch_host("host-a")
    service.start()
    check = service._checks["host-a"]
    assert service.is_checking("host-a")
    reports: list[str] = []
    service.report_changed.connect(reports.append)
    service.unwatch_host("host-a")
    assert reports == ["host-a"]  # the removal itself, said at once
    qtbot.waitUntil(lambda: check.done, timeout=30000)
    assert reports == ["host-a"] and service.health("host-a") is None
    service.shutdown()


def test_a_doctors_last_reference_is_dropped_on_the_window_thread(qtbot) -> None:
    """What a doctor's thread held (the doctor, its reader, and through the reader its owner with a
    running timer) is released on the window's thread. Released on the doctor's thread, the owner and its
    timer were destroyed there ("QObject::killTimer: Timers cannot be stopped from another thread"), and
    a fresh-clone run crashed in the next turn of the event loop. Forty doctors with the interpreter
    switching threads every microsecond: the doctor's thread told the window's thread before its own
    reference was gone, and the window's thread could drop its reference first (CI of 0fe3482: one
    owner released off-thread, then a worker crashed; this test: 6 of 40 before the fix)."""
    import threading
    import weakref

    from PySide6.QtCore import QObject, QTimer

    from gaudi_gui.core import child as core_child
    from gaudi_gui.services.doctor_child import DoctorChild

    gone_on: list[int] = []
    watches = []
    switch = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    try:
        for _ in range(40):
            owner = QObject()  # a service: owned by Python, a timer of its own running
            QTimer(owner).start(1000)
            watches.append(weakref.ref(owner, lambda _ref: gone_on.append(threading.get_ident())))

            def read(outcome: core_child.Outcome, keep: QObject = owner) -> object:
                return outcome.code

            doctor = DoctorChild(None, read)  # type: ignore[arg-type]  # Python-owned: its reader is the last holder
            doctor.start([sys.executable, "-c", "pass"], 20000)
            del doctor, owner, read
        qtbot.waitUntil(lambda: all(watch() is None for watch in watches), timeout=60000)
    finally:
        sys.setswitchinterval(switch)
    elsewhere = [ident for ident in gone_on if ident != threading.get_ident()]
    assert len(gone_on) == 40 and not elsewhere, f"{len(elsewhere)} of 40 released off the window's thread"


_LAST_HOLDER = textwrap.dedent("""
    import gc, sys, time
    from PySide6.QtCore import QCoreApplication, QEvent
    from PySide6.QtWidgets import QApplication
    app = QApplication([])
    from gaudi_gui.services.health import HealthService
    from gaudi_gui.services.settings import Settings

    gc.disable()  # the references alone decide who frees what (no collection in between)
    service = HealthService(Settings())  # parentless: Python owns it, as a test's service
    service.command = [sys.executable, "-c", "import time; time.sleep(600)"]
    service._hosts = []
    service.watch_host("host-a")
    service.start()
    check = service._checks["host-a"]
    service.unwatch_host("host-a")  # the check is retired: killed, then deleted later
    deadline = time.monotonic() + 30
    while not check.done and time.monotonic() < deadline:
        app.processEvents()
        time.sleep(0.01)
    assert check.done, "the retired check never ended"
    service.shutdown()
    del service, check  # nobody holds the service now but what its check holds
    app.processEvents()
    QCoreApplication.sendPostedEvents(None, QEvent.Type.DeferredDelete)
    print("survived")
""")


def test_a_retired_check_never_frees_the_service_that_owns_it(tmp_path: Path) -> None:
    """A check's connection must not be the last holder of its parent. It was (a lambda holding the
    service): a parentless service, retired check and dropped service left that lambda the last
    reference, the check's deferred delete freed the service from inside the check's destructor, and
    the service's destructor deleted the check again: a segmentation fault in ``processEvents``
    (fresh clones #20 and #27, after
    ``test_a_removed_host_reports_nothing_and_its_doctor_is_killed``). In a child interpreter: a
    crash must fail this test, not the worker."""
    done = subprocess.run([sys.executable, "-c", _LAST_HOLDER], capture_output=True, text=True,
                          timeout=120, env={**os.environ, "QT_QPA_PLATFORM": "offscreen"})
    assert done.returncode == 0 and "survived" in done.stdout, (done.returncode, done.stderr[-2000:])

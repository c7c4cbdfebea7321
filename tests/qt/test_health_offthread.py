"""The window's thread only paints (issue 26): the health service's first report read used to import
``core.health`` (importlib.metadata, 50-100 ms) on the window's thread. ``HealthService.start`` now
imports it on a thread of its own before any report can come back. Checked in a fresh interpreter
(this one imported core.health long ago), with an import hook that names the importing thread."""

from __future__ import annotations

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

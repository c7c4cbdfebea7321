"""Every watched host's health: ``gaudi-gui doctor --json`` as a child per host, and the alerts.

The doctor runs in a child process (``python -m gaudi_gui doctor --json``, with ``--host DEST`` for a
remote host, which runs the doctor there over ssh), never on the GUI thread: it starts hl-smi eight
times, reads /proc and may wait on a slow host. Hosts are checked in parallel, one child each, and
again every ``health/interval_s``. A child that crashes, times out or prints something that is not
the report becomes ``HostHealth(reachable=False, error=...)`` with its exit and last lines, so a
broken doctor is a visible error of that host, never a silent "ok".

Alerts (``core.alerts``) are computed here from the hosts' live samples (the pollers the window
already runs) and the doctor's findings; views and the notifier subscribe to the signals.

The window's thread does none of a check's work (issue 26: with 4 hosts it froze 300-400 ms at every
refresh): each doctor is started, waited for, killed at its timeout and read (``read_report``: the
JSON parse and the findings) on a thread of its own (``services.doctor_child.DoctorChild``); the
window's thread gets the finished ``HostHealth`` through a queued signal and only stores it, updates
the alerts and tells the views. ``start`` still imports ``core.health`` (50-100 ms) on a thread while
the first doctor runs, so no other reader (a view) pays for it on the window's thread.
"""

from __future__ import annotations

import functools
import sys
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.core.alerts import CLEARED, RAISED, Alert, AlertEngine, AlertEvent, Thresholds, card_key
from gaudi_gui.services.doctor_child import DoctorChild
from gaudi_gui.services.process import ProcessRunner, describe_exit
from gaudi_gui.services.settings import Settings

if TYPE_CHECKING:
    # core.health is imported where a report is read: it loads importlib.metadata (~0.1 s), and
    # this service is made before the window's first paint.
    from gaudi_gui.core.child import Outcome
    from gaudi_gui.core.health import HostHealth
    from gaudi_gui.services.agent_child import AgentChild
    from gaudi_gui.services.preflight import AgentDoctor

LOCAL = "local"
#: Between two hosts' doctor starts in one refresh: the starts are off the window's thread, but five
#: Python interpreters starting at once on a 2-core machine still take its cores from the window;
#: spread, the window gets a turn between them.
STAGGER_MS = 40


def _import_report_reader() -> None:
    import gaudi_gui.core.preflight  # noqa: F401  (imported for its side effect: core.health too)


def import_report_reader_in_background() -> threading.Thread | None:
    """Import ``core.preflight`` (the report's reader) and ``core.health`` (it loads importlib.metadata,
    50-100 ms) on a thread, so that no view pays for it on the window's thread; None when it is
    imported already. A reader that comes first waits on the import lock for the rest of that import."""
    if "gaudi_gui.core.preflight" in sys.modules:
        return None
    thread = threading.Thread(target=_import_report_reader, name="gaudi-gui-health-import", daemon=True)
    thread.start()
    return thread


def thresholds_from(settings: Settings) -> Thresholds:
    """The alert thresholds of the settings schema (idle: the Devices panel's busy utilization)."""
    return Thresholds(
        temperature_warning_c=float(settings.get("alerts/temperature_warning_c")),
        temperature_critical_c=float(settings.get("alerts/temperature_critical_c")),
        temperature_margin_c=float(settings.get("alerts/temperature_margin_c")),
        slowdown_clear_s=float(settings.get("alerts/slowdown_clear_s")),
        idle_held_s=float(settings.get("alerts/idle_held_s")),
        idle_utilization=float(settings.get("devices/busy_utilization")))


def read_report(host: str, timeout_s: float, outcome: Outcome) -> HostHealth:
    """What a doctor child's end says of ``host``: its report, or why there is none (the start gate's
    reading, ``core.preflight.host_reply``). Runs on the doctor's thread (services.doctor_child)."""
    from gaudi_gui.core.preflight import Target, host_reply

    return host_reply(Target(host), outcome, timeout_s=timeout_s)


class _PollerWatch(QObject):
    """Feeds one host's live samples to the alerts (a child of the service, so the connection
    ends with whichever of the service and the poller goes first)."""

    def __init__(self, service: HealthService, host: str, poller: QObject) -> None:
        super().__init__(service)
        self.service = service
        self.host = host
        poller.samples_received.connect(self.on_samples)  # type: ignore[attr-defined]

    def on_samples(self, samples: list[Any]) -> None:
        self.service.feed_samples(self.host, samples)


class HealthService(QObject):
    """The doctor's report per watched host, refreshed now and then, and the alerts over them."""

    #: A host's health changed (a new report, or it did not answer): carries the host's name.
    report_changed = Signal(str)
    #: A host's check started (True) or ended (False): (host, checking).
    checking_changed = Signal(str, bool)
    #: An alert started or got worse (core.alerts.Alert); also carried by ``alerts_changed``.
    alert_raised = Signal(object)
    #: An alert ended (core.alerts.Alert).
    alert_cleared = Signal(object)
    #: A host's set of alerts in effect changed: carries the host's name.
    alerts_changed = Signal(str)
    #: Someone (a health badge, the Hosts overview) asked to show a host's Health view.
    view_requested = Signal(str)
    #: ``write_report`` ended: (written, the report's path or a one-line reason).
    report_written = Signal(bool, str)
    #: ``copy_report`` ended: (made, the report's redacted text or a one-line reason).
    report_copied = Signal(bool, str)

    def __init__(self, settings: Settings, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        #: The doctor's command line before the host options (tests put another child here).
        # --background: the periodic checks run at low CPU priority (here and on the hosts), so that
        # they never take the cores from the window or a run (the start gate's check runs at normal
        # priority: someone is waiting for it).
        self.command: list[str] = [sys.executable, "-m", "gaudi_gui", "doctor", "--json", "--background"]
        self._hosts: list[str] = [LOCAL]
        self._health: dict[str, HostHealth] = {}
        self._checked_at: dict[str, float] = {}
        self._checks: dict[str, DoctorChild | AgentDoctor] = {}
        #: This machine's checks run as the agent's children (the app sets it; tests of the
        #: service's own rules leave it off).
        self.via_agent = False
        #: The interpreter the agent runs this machine's doctor with ("" its own; tests put another).
        self.python = ""
        #: A saved host's hl-smi path (the app gives the hosts' list; "": the host's PATH).
        self.host_hl_smi: Callable[[str], str] = lambda _name: ""
        self._pending: set[str] = set()  # hosts whose check starts on a later turn (``refresh``)
        self._watches: dict[str, _PollerWatch] = {}
        self.engine = AlertEngine(thresholds_from(settings))
        self._timer = QTimer(self)
        self._timer.timeout.connect(self.refresh)
        self._read_interval()
        self._running = False
        self._shut_down = False
        # `doctor --report FILE` as a child: it runs every check again and packs the files.
        self._report_runner: ProcessRunner | AgentChild = ProcessRunner(self, parse_protocol=False,
                                                                         tail_lines=20)
        self._report_runner.finished.connect(self._on_report_finished)
        self._report_path = ""
        self._report_copy = False  # the running report child is for "Copy report" (a temporary .txt)
        settings.value_changed.connect(self._on_setting)

    # -- hosts ------------------------------------------------------------------------------------

    def hosts(self) -> list[str]:
        return list(self._hosts)

    def watch_host(self, host: str) -> None:
        """Check ``host`` too (at once when the service runs)."""
        if host in self._hosts:
            return
        self._hosts.append(host)
        if self._running:
            self.refresh(host)

    def unwatch_host(self, host: str) -> None:
        if host == LOCAL or host not in self._hosts:
            return
        self._hosts.remove(host)
        check = self._checks.pop(host, None)
        if check is not None:
            check.retire()
        self._health.pop(host, None)
        watch = self._watches.pop(host, None)
        if watch is not None:
            watch.deleteLater()
        self._apply(host, self.engine.forget(host))
        self.report_changed.emit(host)

    def watch_poller(self, host: str, poller: QObject) -> None:
        """Raise temperature and idle-but-held alerts from this poller's samples."""
        old = self._watches.pop(host, None)
        if old is not None:
            old.deleteLater()
        self._watches[host] = _PollerWatch(self, host, poller)

    # -- reports ----------------------------------------------------------------------------------

    def health(self, host: str) -> HostHealth | None:
        """The newest report of ``host`` (None: not checked yet)."""
        return self._health.get(host)

    def checked_at(self, host: str) -> float | None:
        return self._checked_at.get(host)

    def is_checking(self, host: str) -> bool:
        check = self._checks.get(host)
        return check is not None and check.is_running()

    def worst(self, host: str) -> str:
        """'error' / 'warning' / 'ok' over the host's report and alerts; '' when not checked yet."""
        found = self._health.get(host)
        alerts = self.engine.worst(host)
        if found is None:
            return alerts if alerts != "ok" else ""
        levels = {found.worst, alerts}
        return "error" if "error" in levels else "warning" if "warning" in levels else "ok"

    def alerts(self, host: str | None = None) -> list[Alert]:
        return self.engine.alerts(host)

    # -- running ----------------------------------------------------------------------------------

    def start(self) -> None:
        """Check every watched host now and then every ``health/interval_s`` (idempotent)."""
        if self._shut_down:
            return
        self._running = True
        if not self._timer.isActive():
            self._timer.start()
        import_report_reader_in_background()  # before the first report comes back (a doctor: >= 0.5 s)
        self.refresh()

    def stop(self) -> None:
        """No more periodic checks; the checks under way are killed."""
        self._running = False
        self._timer.stop()
        self._pending.clear()
        for check in list(self._checks.values()):
            check.kill()

    def shutdown(self) -> None:
        self._shut_down = True
        self.stop()
        if self._report_runner.is_running():
            self._report_runner.kill_tree()

    # -- the report for a bug ---------------------------------------------------------------------

    def report_running(self) -> bool:
        return self._report_runner.is_running()

    def write_report(self, host: str, path: str) -> bool:
        """Start ``gaudi-gui doctor --report PATH`` for ``host`` (``report_written`` follows); False
        while one is being written."""
        return self._start_report(host, path, copy=False)

    def copy_report(self, host: str) -> bool:
        """Make the same report as text (``doctor --report FILE.txt``, redacted; a remote host's
        parts made on that host); ``report_copied`` carries the text. False while a report runs."""
        return self._start_report(host, "", copy=True)

    def _start_report(self, host: str, path: str, *, copy: bool) -> bool:
        """The ``doctor --report`` child: into ``path``, or (``copy``) a temporary .txt read back."""
        if self._report_runner.is_running() or self._shut_down:
            return False
        self._report_copy = copy
        if copy:
            import tempfile
            from pathlib import Path
            path = str(Path(tempfile.mkdtemp(prefix="gaudi-report-")) / "report.txt")
        self._report_path = path
        if self.via_agent:
            # The agent's child, as every doctor of the app's: no process of the window's own.
            from gaudi_gui.services.agent_child import AgentChild
            child = self._report_runner
            if not isinstance(child, AgentChild):
                child = self._report_runner = AgentChild(self, tail_lines=20)
                child.finished.connect(self._on_report_finished)
            child.start("doctor", {"report": path, **({} if host == LOCAL else {"about": host})})
            return True
        args = ["-m", "gaudi_gui", "doctor", "--report", path, *([] if host == LOCAL else ["--host", host])]
        runner = self._report_runner
        assert isinstance(runner, ProcessRunner)
        runner.start(sys.executable, args)
        return True

    def _on_report_finished(self, code: int, status: str) -> None:
        # doctor exits 1 when it found errors: the report is written all the same.
        last = next((ln.strip() for ln in reversed(self._report_runner.tail(5)) if ln.strip()),
                    describe_exit(code, status))
        if self._report_copy:
            import shutil
            from pathlib import Path
            path = Path(self._report_path)
            try:
                text = path.read_text(errors="replace") if code in (0, 1) else ""
            except OSError as exc:
                text, last = "", f"the report could not be read: {exc.strerror}"
            shutil.rmtree(path.parent, ignore_errors=True)
            self.report_copied.emit(bool(text), text or last)
            return
        if code in (0, 1):
            self.report_written.emit(True, self._report_path)
            return
        self.report_written.emit(False, last)

    @property
    def running(self) -> bool:
        return self._running

    def refresh(self, host: str | None = None) -> None:
        """Check ``host`` (None: every watched host) now; a host already being checked is left be.

        The first host's check starts at once, each next one ``STAGGER_MS`` later (one fork per turn
        of the event loop, not all of them in this slot)."""
        if self._shut_down:
            return
        due = [name for name in ([host] if host else list(self._hosts))
               if name in self._hosts and not self.is_checking(name) and name not in self._pending]
        for turn, name in enumerate(due):
            if turn == 0:
                self._start_check(name)
            else:
                self._pending.add(name)
                QTimer.singleShot(turn * STAGGER_MS, self, lambda n=name: self._start_pending(n))

    def _start_pending(self, host: str) -> None:
        if host not in self._pending:
            return  # stopped meanwhile
        self._pending.discard(host)
        if not self._shut_down and host in self._hosts and not self.is_checking(host):
            self._start_check(host)

    def _start_check(self, host: str) -> None:
        old = self._checks.pop(host, None)
        if old is not None:
            old.deleteLater()
        timeout_s = float(self.settings.get("health/timeout_s"))
        read = functools.partial(read_report, host, timeout_s)
        hl_smi = str(self.settings.get("devices/hl_smi") or "").strip()
        if self.via_agent:
            from gaudi_gui.services.preflight import AgentDoctor  # (its core.preflight: after the paint)

            # The one place choosing: the doctor is the agent's child (no thread, no child of the
            # window), below the window's priority: this machine's with the Devices panel's hl-smi,
            # a saved host's run ON that host by its agent (over this machine's one ssh session to
            # it) with the host's saved hl-smi path.
            remote = host != LOCAL
            doctor = AgentDoctor(self, read, tail_lines=20, host=host if remote else None)
            doctor.setObjectName(host)
            self._checks[host] = doctor
            doctor.ended.connect(self._on_finished)
            args = {"timeout_s": timeout_s, "hl_smi": self.host_hl_smi(host) if remote else hl_smi,
                    "background": True, "python": "" if remote else self.python}
            doctor.start({k: v for k, v in args.items() if v}, int(timeout_s * 1000))
            self.checking_changed.emit(host, True)
            return
        check = DoctorChild(self, read, tail_lines=20)
        check.setObjectName(host)
        self._checks[host] = check
        # A bound method, not a lambda holding this service: the check's connection must never be
        # the last holder of its own parent (see _on_finished).
        check.ended.connect(self._on_finished)
        argv = list(self.command)
        if host == LOCAL and hl_smi:
            argv += ["--hl-smi", hl_smi]  # the Devices panel's hl-smi (settings), as the start gate
        if host != LOCAL:
            # One argv element each: the host name never reaches a shell here (the doctor quotes it
            # for ssh itself).
            argv += ["--host", host]
        check.start(argv, int(timeout_s * 1000))
        self.checking_changed.emit(host, True)

    def _on_finished(self, found: HostHealth) -> None:
        """A doctor's report, read on its thread (``read_report``): stored and told here.

        The check is the signal's sender. A lambda that held this service (``lambda found, c=check:
        self._on_finished(c, found)``) made the retired check's connection the last holder of a
        service nobody else kept (a test's, or any parentless one): the check's deferred delete then
        freed the service from inside the check's own destructor, and the service's destructor
        deleted the check a second time (fresh clones #20 and #27: a segmentation fault in
        ``processEvents``)."""
        check = self.sender()
        if not isinstance(check, QObject):
            return
        host = check.objectName()
        if self._checks.get(host) is not check:
            return  # a host no longer watched, or a newer check replaced it
        self._health[host] = found
        self._checked_at[host] = time.time()
        self.checking_changed.emit(host, False)
        self._apply(host, self.engine.on_findings(host, found.findings, time.time()))
        self.report_changed.emit(host)

    # -- alerts -----------------------------------------------------------------------------------

    def feed_samples(self, host: str, samples: list[Any], now: float | None = None) -> None:
        """One snapshot of a host's cards (from its poller)."""
        found = self._health.get(host)
        held = ({card_key(f.module_id, f.index) for f in found.findings
                 if f.check == "busy.held" and f.severity != "ok"} if found else set())
        self._apply(host, self.engine.on_samples(host, samples, time.time() if now is None else now, held))

    def _apply(self, host: str, events: list[AlertEvent]) -> None:
        if not events:
            return
        for event in events:
            # A lowered alert (critical -> hot) only changes what the views list: nobody is told.
            if event.action == RAISED:
                self.alert_raised.emit(event.alert)
            elif event.action == CLEARED:
                self.alert_cleared.emit(event.alert)
        self.alerts_changed.emit(host)

    # -- settings ---------------------------------------------------------------------------------

    def _read_interval(self) -> None:
        self._timer.setInterval(int(float(self.settings.get("health/interval_s")) * 1000))

    def _on_setting(self, key: str, _value: object) -> None:
        if key == "health/interval_s":
            self._read_interval()
        elif key.startswith("alerts/") or key == "devices/busy_utilization":
            self.engine.thresholds = thresholds_from(self.settings)

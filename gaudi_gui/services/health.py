"""Every watched host's health: ``gaudi-gui doctor --json`` as a child per host, and the alerts.

The doctor runs in a child process (``python -m gaudi_gui doctor --json``, on the host it checks),
never in the window: it starts hl-smi eight times, reads /proc and may wait on a slow host. Hosts are
checked in parallel, one child each, and again every ``health/interval_s``. A child that crashes,
times out or prints something that is not the report becomes ``HostHealth(reachable=False,
error=...)`` with its exit and last lines, so a broken doctor is a visible error of that host, never
a silent "ok".

Alerts (``core.alerts``) are computed here from the hosts' live samples (the pollers the window
already runs) and the doctor's findings; views and the notifier subscribe to the signals.

Every check is the agent's child (issue 38: the window starts no process and no thread): this
machine's doctor is this machine's agent's ``doctor`` child, a saved host's is run on that host by its
agent, over this machine's one ssh session to it (``services.preflight.AgentDoctor``, as the start
gate's). The window's thread only sends the request and, when the child's lines have come back, reads
its report (``read_report``: the JSON parse and the findings, 0.2 ms for the sick 8-card report),
stores it, updates the alerts and tells the views. The reader's modules (``READER_MODULES``) are
imported while the first doctor runs, one per turn of the event loop (4 ms for the largest, by
``python -X importtime``): in one slot they were 19-27 ms (45-69 ms wall on 2 loaded cores), half of it
importlib.metadata, which only the doctor's own version check imports now; a thread imported them
before (docs/benchmarks.md).
"""

from __future__ import annotations

import functools
import importlib
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.core.alerts import CLEARED, RAISED, Alert, AlertEngine, AlertEvent, Thresholds, card_key
from gaudi_gui.services.agent_child import AgentChild, describe_exit
from gaudi_gui.services.settings import Settings

if TYPE_CHECKING:
    # core.health and core.preflight are imported where a check starts (services.preflight): this
    # service is made before the window's first paint.
    from gaudi_gui.core.child import Outcome
    from gaudi_gui.core.health import HostHealth
    from gaudi_gui.services.preflight import AgentDoctor

LOCAL = "local"
#: Between two hosts' doctor starts in one refresh: the agents start them, but five Python
#: interpreters starting at once on a 2-core machine still take its cores from the window; spread,
#: the window gets a turn between them.
STAGGER_MS = 40
#: The report's reader (``read_report``): imported by ``start`` one module per turn of the event loop
#: while the first doctor runs (>= 0.5 s), so that no turn pays for all of them (about 1, 4.5 and 2.7 ms
#: of CPU, measured after the window's own imports; core.child usually came with the first check's
#: AgentDoctor already); a report that comes first imports the rest itself.
READER_MODULES = ("gaudi_gui.core.child", "gaudi_gui.core.health", "gaudi_gui.core.preflight")


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
    reading, ``core.preflight.host_reply``), on the window's thread when the child's end has come."""
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
        self._hosts: list[str] = [LOCAL]
        self._health: dict[str, HostHealth] = {}
        self._checked_at: dict[str, float] = {}
        self._checks: dict[str, AgentDoctor] = {}
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
        # `doctor --report FILE` as the agent's child: it runs every check again and packs the files.
        self._report_runner = AgentChild(self, tail_lines=20)
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
        self.refresh()
        QTimer.singleShot(0, self, self._import_reader_piece)

    def _import_reader_piece(self) -> None:
        """One module of the report's reader, then the next on a later turn (``READER_MODULES``)."""
        name = next((m for m in READER_MODULES if m not in sys.modules), None)
        if name is None or self._shut_down:
            return
        importlib.import_module(name)
        QTimer.singleShot(0, self, self._import_reader_piece)

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
        # The agent's child, as every doctor of the window's: no process of the window's own.
        self._report_runner.start("doctor", {"report": path, **({} if host == LOCAL else {"about": host})})
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
        from gaudi_gui.services.preflight import AgentDoctor  # (the reader comes later: READER_MODULES)

        # The doctor is the agent's child (no thread, no child of the window), below the window's
        # priority (--background: the start gate's check runs at normal priority, someone waits for
        # it): this machine's with the Devices panel's hl-smi, a saved host's run ON that host by its
        # agent (over this machine's one ssh session to it) with the host's saved hl-smi path.
        remote = host != LOCAL
        doctor = AgentDoctor(self, read, tail_lines=20, host=host if remote else None)
        doctor.setObjectName(host)
        self._checks[host] = doctor
        # A bound method, not a lambda holding this service: the check's connection must never be
        # the last holder of its own parent (see _on_finished).
        doctor.ended.connect(self._on_finished)
        args = {"timeout_s": timeout_s, "hl_smi": self.host_hl_smi(host) if remote else hl_smi,
                "background": True, "python": "" if remote else self.python}
        doctor.start({k: v for k, v in args.items() if v}, int(timeout_s * 1000))
        self.checking_changed.emit(host, True)

    def _on_finished(self, found: HostHealth) -> None:
        """A doctor's report (``read_report``'s reading of its end): stored and told here.

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

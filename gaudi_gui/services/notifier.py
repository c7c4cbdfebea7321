"""Desktop notifications: alerts and ended runs, so nobody has to watch the window.

Shown through ``QSystemTrayIcon.showMessage`` where the desktop has a system tray; everywhere (a
desktop without a tray, offscreen tests) the ``notified`` signal says what was shown or would have
been. They can be turned off (``notifications/enabled``) and are rate-limited: at most
``notifications/max_per_window`` in ``notifications/window_s``; what the limit held back is counted
and said with the next one that is shown ("+2 more not shown"), never queued to pop up late.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Callable

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core.alerts import Alert
from gaudi_gui.services.settings import Settings

#: The run states a notification is sent for (a run that ends any other way is not "ended").
ENDED_STATES = ("finished", "failed", "stopped", "killed")


class Notifier(QObject):
    """Rate-limited desktop notifications (a tray balloon where there is a tray)."""

    #: A notification was shown, or would have been without a tray: (title, text).
    notified = Signal(str, str)
    #: A notification was held back (turned off, or over the rate limit): (title, reason).
    suppressed = Signal(str, str)

    def __init__(self, settings: Settings, parent: QObject | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(parent)
        self.settings = settings
        self._clock = clock
        self._shown: deque[float] = deque()
        self._held_back = 0
        self._tray: object | None = None
        self._tray_checked = False
        #: Every (title, text) shown this session, newest last (the status bar and tests read it).
        self.history: list[tuple[str, str]] = []

    # -- sources ----------------------------------------------------------------------------------

    def watch_health(self, health: QObject) -> None:
        """Notify each alert the health service raises."""
        health.alert_raised.connect(self._on_alert)  # type: ignore[attr-defined]

    def watch_training(self, training: QObject) -> None:
        """Notify each run that ends (finished, failed, stopped or killed) with its one-line outcome."""
        training.job_finished.connect(self._on_job_finished)  # type: ignore[attr-defined]

    def watch_queue(self, queue: QObject) -> None:
        """Notify each queued job that starts (nobody pressed Start) and each that ends."""
        queue.entry_started.connect(self._on_queued_started)  # type: ignore[attr-defined]
        queue.entry_ended.connect(self._on_queued_ended)  # type: ignore[attr-defined]

    def _on_queued_started(self, entry: object) -> None:
        name = str(getattr(entry, "name", "") or getattr(entry, "id", "job"))
        run = str(getattr(entry, "run_name", "") or "")
        self.notify(f"Queued job {name} started", f"run {run}" if run else "started from the queue")

    def _on_queued_ended(self, entry: object) -> None:
        name = str(getattr(entry, "name", "") or getattr(entry, "id", "job"))
        outcome = str(getattr(entry, "outcome", "") or "ended")
        summary = str(getattr(entry, "summary", "") or getattr(entry, "why", "") or outcome)
        self.notify(f"Queued job {name} {outcome}", summary.splitlines()[0] if summary else outcome,
                    "error" if outcome in ("failed", "killed", "not started") else "info")

    def _on_alert(self, alert: Alert) -> None:
        where = "" if alert.host == "local" else f" on {alert.host}"
        word = "Critical" if alert.severity == "error" else "Warning"
        self.notify(f"{word}{where}", alert.text, alert.severity)

    def _on_job_finished(self, job: object) -> None:
        state = str(getattr(job, "state", "") or "")
        if state not in ENDED_STATES:
            return
        run = getattr(job, "run", None)
        name = str(getattr(run, "name", "") or getattr(job, "name", "") or "training")
        host = getattr(getattr(job, "host", None), "name", "")
        where = f" on {host}" if host and host != "local" else ""
        summary = str(getattr(job, "summary", "") or state)
        self.notify(f"Run {name}{where} {state}", summary.splitlines()[0] if summary else state,
                    "error" if state in ("failed", "killed") else "info")

    # -- showing ----------------------------------------------------------------------------------

    def notify(self, title: str, text: str, severity: str = "info") -> bool:
        """Show one notification now; False when turned off or over the rate limit."""
        if not bool(self.settings.get("notifications/enabled")):
            self.suppressed.emit(title, "notifications are turned off")
            return False
        now = self._clock()
        window = float(self.settings.get("notifications/window_s"))
        limit = int(self.settings.get("notifications/max_per_window"))
        while self._shown and now - self._shown[0] >= window:
            self._shown.popleft()
        if len(self._shown) >= limit:
            self._held_back += 1
            self.suppressed.emit(title, f"rate limit: {limit} per {window:g} s")
            return False
        self._shown.append(now)
        if self._held_back:
            text = f"{text}\n(+{self._held_back} more not shown: see the Health view)"
            self._held_back = 0
        self._show(title, text, severity)
        self.history.append((title, text))
        self.notified.emit(title, text)
        return True

    def _show(self, title: str, text: str, severity: str) -> None:
        from PySide6.QtWidgets import QSystemTrayIcon

        if not self._tray_checked:
            # Asked once: a tray that appears later is not worth a D-Bus query per notification.
            self._tray_checked = True
            if QSystemTrayIcon.isSystemTrayAvailable() and QSystemTrayIcon.supportsMessages():
                from PySide6.QtWidgets import QApplication, QStyle

                icon = QApplication.windowIcon()
                if icon.isNull():
                    icon = QApplication.style().standardIcon(QStyle.StandardPixmap.SP_ComputerIcon)
                tray = QSystemTrayIcon(icon, self)
                tray.setToolTip("gaudi-gui")
                tray.show()
                self._tray = tray
        if isinstance(self._tray, QSystemTrayIcon):
            kind = {"error": QSystemTrayIcon.MessageIcon.Critical,
                    "warning": QSystemTrayIcon.MessageIcon.Warning}.get(
                severity, QSystemTrayIcon.MessageIcon.Information)
            self._tray.showMessage(title, text, kind, 10_000)

    def shutdown(self) -> None:
        from PySide6.QtWidgets import QSystemTrayIcon

        if isinstance(self._tray, QSystemTrayIcon):
            self._tray.hide()

"""The Health view: what the doctor found on one host, and the alerts in effect there.

One row per finding: severity (colour and icon), card (its one name, "module 3": the index is in the
tooltip), check, what was seen and the fix in one line; errors first. Above them, which cards a job
should use on that host ("healthy and free: modules 0, 4 and 7; for 2 cards: …"). Refresh runs
the doctor again for the host; "Copy findings" puts them on the clipboard as text; "Copy report"
puts the whole bug report there as text and "Save report…" writes it as a file, both through the
health service's ``gaudi-gui doctor --report`` child (findings, versions, hl-smi -q, kernel messages,
the runs' last lines, secrets redacted; a remote host's parts are made on that host). Everything
here is plain text: hl-smi's and a host's output never reach rich text.

It only listens to the HealthService; it never runs the doctor's checks itself.
"""

from __future__ import annotations

import contextlib
import html
import time
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QBrush, QColor, QGuiApplication, QIcon
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QFileDialog,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QStyle,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

if TYPE_CHECKING:
    from gaudi_gui.core.health import Finding
from gaudi_gui.services.health import HealthService
from gaudi_gui.ui.flow_layout import FlowLayout

COLUMNS = ("Severity", "Card", "Check", "Seen", "Fix")
SEVERITY, CARD, CHECK, SEEN, FIX = range(len(COLUMNS))
#: Background per severity (the same reds and ambers as the Devices panel).
COLOURS = {"error": QColor("#f8d0d0"), "warning": QColor("#fff0c8"), "ok": QColor("#e3f4e3")}
#: Text colour of a health badge per worst severity ("" = not checked yet).
BADGE_STYLE = {"error": "background: #b3261e; color: white;", "warning": "background: #e6a700;",
               "ok": "background: #2e7d32; color: white;", "": ""}
_ORDER = {"error": 0, "warning": 1, "ok": 2}


def severity_icon(widget: QWidget, severity: str) -> QIcon:
    pixmap = {"error": QStyle.StandardPixmap.SP_MessageBoxCritical,
              "warning": QStyle.StandardPixmap.SP_MessageBoxWarning}.get(
        severity, QStyle.StandardPixmap.SP_DialogApplyButton)
    return widget.style().standardIcon(pixmap)


def badge_text(health: HealthService, host: str) -> str:
    """'Health: 3 errors, 2 warnings' / 'Health: ok' / 'Health: checking…' for a host's badge."""
    found = health.health(host)
    alerts = health.alerts(host)
    if found is None:
        if alerts:
            return f"Health: {len(alerts)} alert(s)"
        return "Health: checking…" if health.is_checking(host) else "Health: not checked"
    if not found.reachable:
        return "Health: no answer"
    errors = sum(1 for f in found.findings if f.severity == "error")
    warnings = sum(1 for f in found.findings if f.severity == "warning")
    parts = [f"{errors} error{'s' if errors != 1 else ''}"] if errors else []
    parts += [f"{warnings} warning{'s' if warnings != 1 else ''}"] if warnings else []
    if alerts:
        parts.append(f"{len(alerts)} alert{'s' if len(alerts) != 1 else ''}")
    return "Health: " + (", ".join(parts) if parts else "ok")


def findings_text(host: str, findings: list[Finding], error: str = "") -> str:
    """The findings as plain text, one line each (what "Copy findings" puts on the clipboard)."""
    lines = [f"gaudi-gui doctor: {host}"]
    if error:
        lines.append(f"ERROR   did not answer: {error}")
    for f in findings:
        fix = f" -> {f.fix}" if f.fix else ""
        lines.append(f"{f.severity.upper():7} {f.card_label() or '-':18} {f.check:17} {f.seen}{fix}")
    return "\n".join(lines) + "\n"


class HealthView(QWidget):
    """Findings and alerts of the chosen host."""

    #: The report file was written (its path) or could not be (a one-line reason): (ok, text).
    report_saved = Signal(bool, str)

    def __init__(self, health: HealthService, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.health = health
        self.host_combo = QComboBox(self)
        self.host_combo.setObjectName("health_host")
        self.host_combo.currentIndexChanged.connect(self._on_other_host)
        self.status_label = QLabel(self)
        self.status_label.setTextFormat(Qt.TextFormat.PlainText)
        #: The status line: what the last check found, and under it what the user's last action did
        #: (a check that ends after "report written to …" must not wipe that out).
        self._checked = ""
        self._said = ""
        self.status_label.setWordWrap(True)
        self.refresh_button = QPushButton("&Refresh", self)
        self.refresh_button.setToolTip("run the doctor on this host again")
        self.refresh_button.clicked.connect(lambda: self.refresh())  # noqa: PLW0108
        self.show_ok = QCheckBox("Show passed checks", self)
        self.show_ok.toggled.connect(self._on_host_chosen)
        self.copy_button = QPushButton("&Copy findings", self)
        self.copy_button.setToolTip("put the findings on the clipboard as text")
        self.copy_button.clicked.connect(lambda: self.copy_findings())  # noqa: PLW0108
        self.copy_report_button = QPushButton("Copy re&port", self)
        self.copy_report_button.setToolTip("put the whole report on the clipboard as text: findings, "
                                           "versions, hl-smi -q, kernel messages, the running runs' last "
                                           "lines (secrets redacted)")
        self.copy_report_button.clicked.connect(lambda: self.copy_report())  # noqa: PLW0108
        self.report_button = QPushButton("Save &report…", self)
        self.report_button.setToolTip("gaudi-gui doctor --report: findings, versions, hl-smi -q, kernel "
                                      "messages and the runs' last lines (secrets redacted) in a .tar.gz")
        self.report_button.clicked.connect(lambda: self.save_report())  # noqa: PLW0108

        self.notify_box = QCheckBox("Desktop &notifications", self)
        self.notify_box.setToolTip("alerts and ended runs as desktop notifications (rate-limited)")
        self.notify_box.setChecked(bool(health.settings.get("notifications/enabled")))
        self.notify_box.toggled.connect(self._on_notify_toggled)
        health.settings.value_changed.connect(self._on_setting)

        self.usable_label = QLabel(self)
        self.usable_label.setObjectName("health_usable")
        self.usable_label.setTextFormat(Qt.TextFormat.PlainText)
        self.usable_label.setWordWrap(True)
        self.usable_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.usable_label.setStyleSheet("font-weight: bold;")

        self.alerts_label = QLabel(self)
        self.alerts_label.setTextFormat(Qt.TextFormat.PlainText)
        self.alerts_label.setWordWrap(True)
        self.alerts_label.setStyleSheet("color: #b3261e;")

        self.table = QTableWidget(0, len(COLUMNS), self)
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.verticalHeader().setVisible(False)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setWordWrap(False)
        header = self.table.horizontalHeader()
        for col in (SEVERITY, CARD, CHECK):
            header.setSectionResizeMode(col, QHeaderView.ResizeMode.ResizeToContents)
        header.setSectionResizeMode(SEEN, QHeaderView.ResizeMode.Interactive)
        header.setStretchLastSection(True)

        top = QHBoxLayout()
        top.addWidget(QLabel("Host:", self))
        top.addWidget(self.host_combo)
        top.addWidget(self.status_label, 1)
        # The actions wrap onto more rows in a narrow dock (Serve and Health sharing the right-hand
        # side of a small screen) instead of holding the window wider than the screen.
        actions = QWidget(self)
        flow = FlowLayout(actions)
        for widget in (self.show_ok, self.refresh_button, self.copy_button, self.copy_report_button,
                       self.report_button, self.notify_box):
            flow.addWidget(widget)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(actions)
        layout.addWidget(self.usable_label)
        layout.addWidget(self.alerts_label)
        layout.addWidget(self.table, 1)

        # The report is written by the health service's `doctor --report` child; this view binds.
        health.report_written.connect(self._on_report_written)
        health.report_copied.connect(self._on_report_copied)

        health.report_changed.connect(self._on_host_changed)
        health.alerts_changed.connect(self._on_host_changed)
        health.checking_changed.connect(self._on_checking)
        self._sync_hosts()
        self._show()

    # -- hosts ------------------------------------------------------------------------------------

    def host(self) -> str:
        return str(self.host_combo.currentData() or "local")

    def show_host(self, host: str) -> None:
        """Show ``host`` (added to the list when it is not there yet)."""
        self._sync_hosts()
        index = self.host_combo.findData(host)
        if index < 0:
            self.host_combo.addItem(host, host)
            index = self.host_combo.count() - 1
        self.host_combo.setCurrentIndex(index)
        self._show()

    def _sync_hosts(self) -> None:
        known = [self.host_combo.itemData(i) for i in range(self.host_combo.count())]
        for host in self.health.hosts():
            if host not in known:
                self.host_combo.addItem(host, host)

    def _on_notify_toggled(self, on: bool) -> None:
        if bool(self.health.settings.get("notifications/enabled")) != on:
            self.health.settings.set("notifications/enabled", on)

    def _on_setting(self, key: str, _value: object) -> None:
        if key == "notifications/enabled":
            on = bool(self.health.settings.get(key))
            if self.notify_box.isChecked() != on:
                self.notify_box.setChecked(on)

    def _on_host_chosen(self, *_args: object) -> None:
        self._show()

    def _on_other_host(self, *_args: object) -> None:
        self._said = ""  # what was done was about the host shown before
        self._show()

    def _on_checking(self, host: str, _checking: bool) -> None:
        self._on_host_changed(host)

    def _on_host_changed(self, host: str) -> None:
        self._sync_hosts()
        if host == self.host():
            self._show()

    # -- actions ----------------------------------------------------------------------------------

    def refresh(self) -> None:
        self.health.refresh(self.host())
        self._show()

    def copy_findings(self) -> str:
        found = self.health.health(self.host())
        text = findings_text(self.host(), list(found.findings) if found else [],
                             found.error if found is not None and not found.reachable else "")
        QGuiApplication.clipboard().setText(text)
        self._say("findings copied to the clipboard")
        return text

    def choose_report_path(self) -> str:
        """Where the report goes ("" when the user cancels); tests replace it."""
        stamp = time.strftime("%Y%m%d-%H%M%S")
        path, _filter = QFileDialog.getSaveFileName(self, "Save the doctor's report",
                                                    f"gaudi-doctor-{self.host()}-{stamp}.tar.gz",
                                                    "Report (*.tar.gz)")
        return path

    def save_report(self) -> bool:
        if self.health.report_running():
            return False
        path = self.choose_report_path()
        if not path:
            return False
        if not path.endswith(".tar.gz"):
            path += ".tar.gz"
        if not self.health.write_report(self.host(), path):
            return False
        self.report_button.setEnabled(False)
        self._say(f"writing the report to {path}…")
        return True

    def copy_report(self) -> bool:
        if not self.health.copy_report(self.host()):
            return False
        self.copy_report_button.setEnabled(False)
        self.report_button.setEnabled(False)
        self._say("making the report…")
        return True

    def _on_report_copied(self, ok: bool, text: str) -> None:
        self.copy_report_button.setEnabled(True)
        self.report_button.setEnabled(True)
        if ok:
            QGuiApplication.clipboard().setText(text)
            self._say(f"report copied to the clipboard ({len(text.splitlines())} lines)")
        else:
            self._say(f"the report could not be made: {text}")

    def _on_report_written(self, ok: bool, text: str) -> None:
        self.report_button.setEnabled(True)
        if ok:
            self._say(f"report written to {text}")
        else:
            self._say(f"the report could not be written: {text}")
        self.report_saved.emit(ok, text)

    def shutdown(self) -> None:
        """The view's report child belongs to the health service (it ends it at the app's end)."""
        with contextlib.suppress(RuntimeError, TypeError):
            self.health.report_written.disconnect(self._on_report_written)
        with contextlib.suppress(RuntimeError, TypeError):
            self.health.report_copied.disconnect(self._on_report_copied)

    # -- showing ----------------------------------------------------------------------------------

    def rows(self) -> list[tuple[str, ...]]:
        """The table's text, row by row (tests and screen readers)."""
        out = []
        for row in range(self.table.rowCount()):
            out.append(tuple((self.table.item(row, c) or QTableWidgetItem()).text()
                             for c in range(len(COLUMNS))))
        return out

    def _say(self, text: str) -> None:
        """What the user's last action did, kept under the check's status until the next action."""
        self._said = text
        self._paint_status()

    def _paint_status(self) -> None:
        self.status_label.setText("\n".join(t for t in (self._checked, self._said) if t))

    def _show(self) -> None:
        host = self.host()
        found = self.health.health(host)
        checking = self.health.is_checking(host)
        self.refresh_button.setEnabled(not checking)
        when = self.health.checked_at(host)
        stamp = time.strftime("%H:%M:%S", time.localtime(when)) if when else ""
        if found is None:
            status = "checking…" if checking else "not checked yet: press Refresh"
        elif not found.reachable:
            status = f"did not answer ({stamp}): {found.error}"
        else:
            errors = sum(1 for f in found.findings if f.severity == "error")
            warnings = sum(1 for f in found.findings if f.severity == "warning")
            # "No Gaudi cards" only where hl-smi did not fail: a failing or missing one beside
            # /dev/accel nodes is its own error, not a card-less machine.
            failed = any(f.check == "stack.hl-smi" and f.severity == "error" for f in found.findings)
            status = (f"{errors} error(s), {warnings} warning(s) at {stamp}"
                      + ("; no Gaudi cards (only the Python stack was checked)"
                         if not found.cards and not failed else "")
                      + ("; checking again…" if checking else ""))
        self._checked = status
        self._paint_status()
        usable = found.usable_text() if found is not None and found.reachable and found.cards else ""
        self.usable_label.setText(usable[:1].upper() + usable[1:])
        self.usable_label.setVisible(bool(usable))
        alerts = self.health.alerts(host)
        self.alerts_label.setText("\n".join(f"⚠ {a.text}" for a in alerts))
        self.alerts_label.setVisible(bool(alerts))
        findings = list(found.findings) if found is not None else []
        if not self.show_ok.isChecked():
            findings = [f for f in findings if f.severity != "ok"]
        findings.sort(key=lambda f: (_ORDER.get(f.severity, 3), f.module_id if f.module_id is not None
                                     else -1, f.check))
        if found is not None and not found.reachable:
            from gaudi_gui.core.health import Finding
            findings.insert(0, Finding("host.reachable", "error", found.error,
                                       "check that the host is up and answers over ssh", host=host))
        self.table.setRowCount(len(findings))
        for row, f in enumerate(findings):
            values = (f.severity, f.card_label(), f.check, f.seen, f.fix)
            brush = QBrush(COLOURS.get(f.severity, QColor("white")))
            for col, value in enumerate(values):
                item = QTableWidgetItem(value)
                tip = f"{value} ({f.card_detail()})" if col == CARD and f.card_detail() else value
                # A tooltip is shown as rich text when it looks like HTML: escape it and say so.
                item.setToolTip(f"<p>{html.escape(tip)}</p>" if tip else "")
                if col == SEVERITY:
                    item.setIcon(severity_icon(self, f.severity))
                    item.setBackground(brush)
                self.table.setItem(row, col, item)
        self.table.resizeColumnToContents(SEEN)

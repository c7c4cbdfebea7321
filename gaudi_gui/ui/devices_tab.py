"""The Devices tab: every card (table + history charts), their processes, the job selection, and a
clear state panel when hl-smi is missing or failing. It only listens to the DevicePoller; it never runs
hl-smi itself.

Banners: the state panel (hl-smi missing / failing, each fact said once), the runtime banner (cards
are present but the job's Python cannot use them, so jobs run on the CPU: what to install), and a line
counting hl-smi rows that could not be parsed. The tab also hands the environment probe's report to
the DeviceSelection, so that ``selection.env()`` / ``card_count()`` tell jobs the truth.

Health: each card's row says the doctor's worst finding for it (from the health service's report of
this host), and a line under the table says which cards a job should use ("healthy and free:
modules 0, 4 and 7; for 2 cards: …"); "Pick healthy & free" checks them (all, or for the number of
cards chosen beside it)."""

from __future__ import annotations

import html
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QHideEvent, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QFrame,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QScrollArea,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core.devices import METRICS, DeviceSample, ProcessInfo, cards_name, sample_name
from gaudi_gui.services import device_poller as dp
from gaudi_gui.services.context import AppServices
from gaudi_gui.ui.device_charts import CHARTS, DeviceCharts
from gaudi_gui.ui.device_table import CardHealth, DeviceTable

if TYPE_CHECKING:
    from gaudi_gui.core.health import HostHealth
    from gaudi_gui.services.queue import QueueService
    from gaudi_gui.ui.benchmark_view import BenchmarkView

#: (label, seconds) of the history window choices.
WINDOWS = (("1 min", 60), ("5 min", 300), ("15 min", 900), ("1 h", 3600))
#: The process table grows with its rows up to this many, then scrolls.
PROCESS_ROWS = 4
#: Each chart is redrawn at most this often (ms): samples arrive at 1 Hz (10 Hz in the bench).
CHART_REFRESH_MS = 500
#: (label, card count or None for all) of "Pick healthy & free".
PICK_SIZES = (("all of them", None), ("1 card", 1), ("2 cards", 2), ("4 cards", 4), ("8 cards", 8))


def card_health(found: HostHealth) -> dict[int, CardHealth]:
    """The doctor's word per card (module id) of a host's report: its worst finding, or healthy and
    free; the tooltip lists every finding with its fix."""
    out: dict[int, CardHealth] = {}
    for card in found.cards:
        module = int(card.get("module_id", card.get("index", -1)))
        problems = found.card_problems(module)
        if problems:
            worst = problems[0]
            more = f" (+{len(problems) - 1} more)" if len(problems) > 1 else ""
            lines = [f"{f.severity}: {f.seen}" + (f" → {f.fix}" if f.fix else "") for f in problems]
            out[module] = CardHealth(worst.severity, worst.seen + more, "\n".join(lines))
        elif module in found.free_modules:
            out[module] = CardHealth("ok", "healthy, free", "every check of the doctor passed; no process "
                                     "holds it")
    return out


def _gib(mib: float | None) -> str:
    return "?" if mib is None else f"{mib / 1024:.1f}"


#: The state panel: an error (hl-smi failed, a named hl-smi missing) and plain information (no
#: Gaudi software on a CPU or CUDA machine, the normal case there).
STATE_PANEL_ERROR = ("#devicesStatePanel { background: #fdecea; border: 1px solid #e0a0a0; "
                     "border-radius: 4px; }")
STATE_PANEL_INFO = ("#devicesStatePanel { background: #eef3f8; border: 1px solid #c5d3e0; "
                    "border-radius: 4px; }")


class DevicesTab(QWidget):
    def __init__(self, services: AppServices, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.services = services
        self.poller = services.poller
        self.selection = services.selection
        settings = services.settings

        self.state_panel = QFrame(self)
        self.state_panel.setObjectName("devicesStatePanel")
        self.state_panel.setStyleSheet(STATE_PANEL_ERROR)
        self.state_title = QLabel(self.state_panel)
        self.state_title.setStyleSheet("font-weight: bold;")
        self.state_text = QLabel(self.state_panel)
        self.state_text.setWordWrap(True)
        self.state_text.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.retry_button = QPushButton("Retry hl-smi", self.state_panel)
        # Through a lambda: clicked passes `checked`, which must never reach a slot (DESIGN.md).
        self.retry_button.clicked.connect(lambda: self.poller.restart())  # noqa: PLW0108
        panel_layout = QVBoxLayout(self.state_panel)
        panel_layout.addWidget(self.state_title)
        panel_layout.addWidget(self.state_text)
        panel_layout.addWidget(self.retry_button, 0, Qt.AlignmentFlag.AlignLeft)
        self.state_panel.setVisible(False)

        self.runtime_panel = QLabel(self)
        self.runtime_panel.setObjectName("devicesRuntimePanel")
        self.runtime_panel.setWordWrap(True)
        self.runtime_panel.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.runtime_panel.setStyleSheet("#devicesRuntimePanel { background: #fff4d6; border: 1px solid "
                                         "#e0c070; border-radius: 4px; padding: 6px; }")
        self.runtime_panel.setVisible(False)
        self.rejected_label = QLabel(self)
        self.rejected_label.setWordWrap(True)
        self.rejected_label.setStyleSheet("color: #a33;")
        self.rejected_label.setVisible(False)

        self.source_label = QLabel("waiting for hl-smi…", self)
        self.host_label = QLabel("host: —", self)
        top = QHBoxLayout()
        top.addWidget(self.source_label, 1)
        top.addWidget(self.host_label)
        # The host's health at a glance (the doctor's worst finding and the alerts); a click opens
        # the Health view on this host.
        self.health_host = self.poller.host.name if self.poller.host is not None else "local"
        self.health_badge = QPushButton("Health: not checked", self)
        self.health_badge.setObjectName("health_badge")
        self.health_badge.setVisible(services.health is not None)
        self.health_badge.clicked.connect(lambda: self._open_health())  # noqa: PLW0108
        top.addWidget(self.health_badge)
        # The Benchmark view (ui/benchmark_view.py), built on its first opening, under the processes.
        self.benchmark_button = QPushButton("Benchmark", self)
        self.benchmark_button.setObjectName("devices_benchmark")
        self.benchmark_button.setCheckable(True)
        self.benchmark_button.setToolTip("measure this machine's cards (matmul, copy, all-reduce, decode, a "
                                         "training step) and judge them against a reference")
        self.benchmark_button.toggled.connect(self._toggle_benchmark)
        top.addWidget(self.benchmark_button)
        self.benchmark_view: BenchmarkView | None = None

        self.table = DeviceTable(self)
        self.table.hot_c = float(settings.get("devices/hot_temperature_c"))
        self.table.busy_util = float(settings.get("devices/busy_utilization"))
        self.table.selection_edited.connect(self._on_selection_edited)

        self.env_label = QLabel(self)
        self.env_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.selection_warning = QLabel(self)
        self.selection_warning.setWordWrap(True)
        self.selection_warning.setStyleSheet("color: #a33;")
        select_row = QHBoxLayout()
        select_row.addWidget(self.env_label, 1)
        self.window_combo = QComboBox(self)
        for label, seconds in WINDOWS:
            self.window_combo.addItem(label, seconds)
        saved = int(settings.get("devices/history_window_s"))
        index = next((i for i, (_l, s) in enumerate(WINDOWS) if s == saved), 1)
        self.window_combo.setCurrentIndex(index)
        self.window_combo.currentIndexChanged.connect(self._on_window_changed)
        select_row.addWidget(QLabel("history:", self))
        select_row.addWidget(self.window_combo)

        # Which cards a job should use, from the doctor's last report of this host, and the picker.
        self.usable_label = QLabel("healthy and free: not checked yet", self)
        self.usable_label.setObjectName("devicesUsable")
        self.usable_label.setWordWrap(True)
        self.usable_label.setTextFormat(Qt.TextFormat.PlainText)
        self.usable_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.pick_size = QComboBox(self)
        self.pick_size.setObjectName("pick_size")
        for label, size in PICK_SIZES:
            self.pick_size.addItem(label, size)
        self.pick_size.setToolTip("how many cards the job needs")
        self.pick_size.currentIndexChanged.connect(lambda _i: self._update_pick_button())
        self.pick_button = QPushButton("Pick &healthy && free", self)
        self.pick_button.setObjectName("pick_healthy_free")
        self.pick_button.clicked.connect(lambda: self.pick_healthy_free())  # noqa: PLW0108
        usable_row = QHBoxLayout()
        usable_row.addWidget(self.usable_label, 1)
        pick_for = QLabel("for", self)
        usable_row.addWidget(pick_for)
        usable_row.addWidget(self.pick_size)
        usable_row.addWidget(self.pick_button)
        self._usable_widgets = [self.usable_label, pick_for, self.pick_size, self.pick_button]
        # This machine's queue: "next: JOB waits for 2 cards" (hidden while nothing waits for cards).
        self.queue_line = QLabel("", self)
        self._queue: QueueService | None = None
        self.queue_line.setObjectName("devicesQueueNext")
        self.queue_line.setTextFormat(Qt.TextFormat.PlainText)
        self.queue_line.setVisible(False)
        if services.queue is not None:
            self.bind_queue(services.queue)

        self.charts = DeviceCharts(self)
        self.charts.set_window(WINDOWS[index][1])

        self.process_table = QTableWidget(0, 6, self)
        self.process_table.setHorizontalHeaderLabels(["Card", "PID", "Name", "Memory MiB", "User", "Command"])
        self.process_table.verticalHeader().setVisible(False)
        self.process_table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.process_table.horizontalHeader().setSectionResizeMode(QHeaderView.ResizeMode.ResizeToContents)
        self.process_table.horizontalHeader().setStretchLastSection(True)
        self._fit_process_table()
        self.process_label = QLabel("Processes on the cards (hl-smi lists only those it may see)", self)

        upper = QWidget(self)
        upper_layout = QVBoxLayout(upper)
        upper_layout.setContentsMargins(0, 0, 0, 0)
        upper_layout.addWidget(self.table)
        upper_layout.addLayout(usable_row)
        upper_layout.addWidget(self.queue_line)
        upper_layout.addLayout(select_row)
        upper_layout.addWidget(self.selection_warning)
        lower = QWidget(self)
        lower_layout = QVBoxLayout(lower)
        lower_layout.setContentsMargins(0, 0, 0, 0)
        lower_layout.addWidget(self.process_label)
        lower_layout.addWidget(self.process_table)
        # A plain layout, not a splitter: the table is as tall as its rows, the processes table is
        # short, and the charts take whatever height is left whatever the state panel shows.
        # All of it scrolls when the window is shorter than that (a 1280x800 laptop with the Health
        # dock open), rather than making the window taller than the screen.
        content = QWidget(self)
        scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        outer = QVBoxLayout(self)
        outer.setContentsMargins(0, 0, 0, 0)
        outer.addWidget(scroll)
        layout = QVBoxLayout(content)
        layout.addWidget(self.state_panel)
        layout.addWidget(self.runtime_panel)
        layout.addLayout(top)
        layout.addWidget(self.rejected_label)
        layout.addWidget(upper, 0)
        layout.addWidget(self.charts, 1)
        layout.addWidget(lower, 0)
        scroll.setWidget(content)
        self._content_layout, self._scroll = layout, scroll

        self._keys: list[str] = []
        #: Index -> the card's one name (the processes' table names cards as the rows do).
        self._names: dict[int, str] = {}
        self._host_key: str | None = None
        self._dirty: set[str] = set()
        self._next_chart = 0
        # One chart per tick, four ticks per period: a redraw never paints all four plots at once.
        # Ticking only while the tab is shown (showEvent / hideEvent): hidden it draws nothing, and a
        # closed window's tab must not tick on until it is deleted.
        self._chart_timer = QTimer(self)
        self._chart_timer.setInterval(CHART_REFRESH_MS // len(CHARTS))
        self._chart_timer.timeout.connect(self._refresh_charts)

        self.poller.samples_received.connect(self.on_samples)
        self.poller.host_received.connect(self.on_host)
        self.poller.processes_received.connect(self.on_processes)
        self.poller.state_changed.connect(self.on_state)
        self.poller.rows_rejected.connect(self.on_rows_rejected)
        self.selection.selection_changed.connect(self._on_selection_changed)
        services.environment.probe_finished.connect(self.selection.set_environment)
        if services.environment.result is not None:
            self.selection.set_environment(services.environment.result)
        self.selection.claims_changed.connect(self._update_selection_text)
        self.selection.claims_changed.connect(self._update_card_health)
        settings.value_changed.connect(self._on_setting_changed)
        if services.health is not None:
            services.health.report_changed.connect(self._update_health_badge)
            services.health.report_changed.connect(self._on_report_changed)
            services.health.alerts_changed.connect(self._update_health_badge)
            services.health.checking_changed.connect(self._on_health_checking)
            self._update_health_badge(self.health_host)
        self._update_card_health()

        # Restore the last selection; the poller sets which cards exist once hl-smi has answered.
        saved_ids = [int(i) for i in settings.get("devices/selected_modules") if isinstance(i, int)]
        self.selection.set_selected(saved_ids)
        self.table.set_checked(self.selection.selected)
        latest = self.poller.latest()
        if latest:
            self.on_samples(latest)
        if self.poller.state != dp.STATE_STOPPED:
            self.on_state(self.poller.state, self.poller.message)
        self._update_selection_text()

    # -- poller events ----------------------------------------------------------------------------------

    def on_samples(self, samples: Sequence[DeviceSample]) -> None:
        self.table.update_samples(samples)
        kinds_before = {k.partition(":")[0] for k in self._keys}
        self._keys = [s.key for s in samples]
        self._names = {s.index: sample_name(s) for s in samples if s.kind != "host"}
        if {k.partition(":")[0] for k in self._keys} != kinds_before:
            self._update_card_health()
        self._dirty.update(c[0] for c in CHARTS)
        self._show_metrics(samples)
        if samples:
            kind = samples[0].kind
            source = {"hpu": "hl-smi", "cuda": "nvidia-smi"}.get(kind, kind)
            self.source_label.setText(f"{len(samples)} card(s) from {source}")

    def on_host(self, sample: DeviceSample) -> None:
        self._host_key = sample.key
        util = "?" if sample.utilization is None else f"{sample.utilization:.0f}"
        self.host_label.setText(f"host: CPU {util}% · RAM {_gib(sample.memory_used_mib)} / "
                                f"{_gib(sample.memory_total_mib)} GiB")
        if not self._keys:
            # No accelerator (hl-smi absent, no NVIDIA GPU): the host is the one row of the table.
            self.table.update_samples([sample])
            self._show_metrics([sample])
            self._dirty.update(c[0] for c in CHARTS)

    def _show_metrics(self, samples: Sequence[DeviceSample]) -> None:
        # Only charts some device can fill: the host (psutil) has no power or temperature reading.
        shown = [m for m in METRICS if any(getattr(s, m) is not None for s in samples)]
        if any(s.kind != "host" for s in samples):
            shown = list(METRICS)  # a card's N/A power is still a card's chart
        self.charts.set_metrics(shown or ["utilization", "memory_used_mib"])
        totals = [s.memory_total_mib for s in samples if s.memory_total_mib]
        self.charts.set_memory_total(max(totals) if totals else None)

    def on_rows_rejected(self, count: int, reason: str) -> None:
        self.rejected_label.setText(f"⚠ hl-smi printed {count} row(s) that could not be parsed and were "
                                    f"skipped; the newest: {reason}")
        self.rejected_label.setVisible(True)

    def on_processes(self, processes: Sequence[ProcessInfo]) -> None:
        table = self.process_table
        table.setRowCount(len(processes))
        for row, p in enumerate(processes):
            memory = "—" if p.memory_mib is None else f"{p.memory_mib:.0f}"
            values = [self._names.get(p.index, f"index {p.index}"), str(p.pid), p.name, memory,
                      p.user or "(not visible)", p.cmdline or "(not visible)"]
            for col, text in enumerate(values):
                item = table.item(row, col)
                if item is None:
                    table.setItem(row, col, QTableWidgetItem(text))
                elif item.text() != text:
                    item.setText(text)
        self.process_label.setText(f"Processes on the cards: {len(processes)} "
                                   "(hl-smi lists only those it may see)")
        self._fit_process_table()

    def _fit_process_table(self) -> None:
        # As tall as its rows (one to PROCESS_ROWS, then it scrolls): an empty table no longer takes
        # the charts' height, which at 1024x700 decides between a row of charts and tabs.
        table = self.process_table
        rows = max(1, min(table.rowCount(), PROCESS_ROWS))
        row_h = table.rowHeight(0) if table.rowCount() else table.verticalHeader().defaultSectionSize()
        table.setFixedHeight(table.horizontalHeader().sizeHint().height() + rows * row_h
                             + 2 * table.frameWidth() + 2)

    def on_state(self, state: str, message: str) -> None:
        if state in (dp.STATE_OK, dp.STATE_STARTING, dp.STATE_STOPPED):
            self.state_panel.setVisible(False)
            if state == dp.STATE_STARTING:
                self.source_label.setText(message)
            return
        # The title names the situation, the text says what was run and what to do, the fallback line
        # what is shown instead: each once (the message itself never repeats the fallback).
        title = {dp.STATE_ABSENT: "No Gaudi cards can be read",
                 dp.STATE_FAILED: "hl-smi failed"}.get(state, state)
        fallback = {"nvidia-smi": "Showing NVIDIA GPUs (nvidia-smi) and the host instead.",
                    "host": "Showing the host (CPU, RAM) only."}.get(self.poller.source, "")
        lines: list[str] = []
        for line in [*message.splitlines(), fallback]:
            if line.strip() and line not in lines:
                lines.append(line)
        normal = state == dp.STATE_ABSENT and self.poller.host is None
        if normal:
            # No hl-smi on this machine and none named: the normal case of a CPU or CUDA machine
            # (README), said calmly — no error colour, no command line, nothing to retry.
            title = "No Gaudi software on this machine"
            lines = [fallback or "Showing the host.",
                     "On a Gaudi server, hl-smi comes with Intel's driver package "
                     "(habanalabs-firmware-tools); GAUDI_GUI_HL_SMI names one installed elsewhere."]
        self.state_panel.setStyleSheet(STATE_PANEL_INFO if normal else STATE_PANEL_ERROR)
        self.retry_button.setVisible(not normal)
        self.state_title.setText(title)
        self.state_text.setText("\n".join(lines))
        self.state_panel.setVisible(True)
        if self._keys and self.poller.latest() and self.poller.latest()[0].kind == "hpu":
            stamp = time.strftime("%H:%M:%S", time.localtime(self.poller.latest()[0].timestamp))
            self.source_label.setText(f"hl-smi is not answering: card values are from {stamp}")
        else:
            self.source_label.setText({"nvidia-smi": "NVIDIA GPUs and the host",
                                       "host": "host only"}.get(self.poller.source, title))

    def _on_setting_changed(self, key: str, value: object) -> None:
        if key == "devices/hot_temperature_c":
            self.table.hot_c = float(self.services.settings.get(key))
        elif key == "devices/busy_utilization":
            self.table.busy_util = float(self.services.settings.get(key))

    # -- health -------------------------------------------------------------------------------------

    def _update_health_badge(self, host: str) -> None:
        health = self.services.health
        if health is None or host != self.health_host:
            return
        from gaudi_gui.ui.health_view import BADGE_STYLE, badge_text

        self.health_badge.setText(badge_text(health, host))
        worst = health.worst(host)
        self.health_badge.setProperty("severity", worst or "unknown")
        self.health_badge.setStyleSheet(f"#health_badge {{ {BADGE_STYLE.get(worst, '')} }}")
        alerts = health.alerts(host)
        # Alert texts carry what hl-smi printed: escaped, since a tooltip may be shown as rich text.
        self.health_badge.setToolTip("<p>" + "<br>".join(html.escape(a.text) for a in alerts) + "</p>"
                                     if alerts else "open the Health view")

    def _on_health_checking(self, host: str, _checking: bool) -> None:
        self._update_health_badge(host)

    def _on_report_changed(self, host: str) -> None:
        if host == self.health_host:
            self._update_card_health()

    def _update_card_health(self) -> None:
        """Each row's doctor word, the "healthy and free" line and what the picker offers."""
        health = self.services.health
        found = health.health(self.health_host) if health is not None else None
        gaudi = self.selection.kind == "hpu" or any(k.startswith("hpu") for k in self._keys)
        for widget in self._usable_widgets:
            widget.setVisible(health is not None and gaudi)
        if found is None or not found.reachable or not found.cards:
            self.table.set_health({})
            self.selection.set_usable(None)
            if found is not None and not found.reachable:
                self.usable_label.setText(f"healthy and free: unknown (the doctor did not answer: "
                                          f"{found.error})")
            elif health is not None and health.is_checking(self.health_host):
                self.usable_label.setText("healthy and free: the doctor is checking the cards…")
            else:
                self.usable_label.setText("healthy and free: not checked yet (the Health view's Refresh "
                                          "runs the doctor)")
            self._update_pick_button()
            return
        self.table.set_health(card_health(found))
        # The cards this app's own jobs hold are not free, whatever the last check saw.
        held = sorted({i for ids in self.selection.claims().values() for i in ids})
        usable = [m for m in found.healthy_free() if m not in held]
        picks = {p.size: list(p.ids) for p in found.picks(held)}
        picks[1] = list(found.pick(1, held).ids)
        text = found.usable_text(held)
        when = health.checked_at(self.health_host) if health is not None else None
        stamp = time.strftime("%H:%M:%S", time.localtime(when)) if when else ""
        self.usable_label.setText(text[0].upper() + text[1:] + (f" (doctor at {stamp})" if stamp else ""))
        self.selection.set_usable(usable, picks, text)
        self._update_pick_button()

    def _update_pick_button(self) -> None:
        size = self.pick_size.currentData()
        ids = self.selection.pick_for(size)
        self.pick_button.setEnabled(bool(ids))
        if self.selection.usable() is None:
            tip = "the doctor has not checked the cards yet"
        elif ids:
            tip = f"check {cards_name(ids)} for jobs"
        else:
            tip = "no healthy and free cards fit" + (f" for {size} card(s)" if size else "")
        self.pick_button.setToolTip(tip)

    def pick_healthy_free(self) -> list[int]:
        """Check the healthy and free cards (all, or the pick for the chosen number of cards)."""
        ids = self.selection.pick_usable(self.pick_size.currentData())
        if ids:
            self.services.settings.set("devices/selected_modules", list(ids))
        return ids

    def _toggle_benchmark(self, shown: bool) -> None:
        if shown and self.benchmark_view is None:
            from gaudi_gui.services.benchmark import BenchmarkJob
            from gaudi_gui.ui.benchmark_view import BenchmarkView

            # The agent is reached on the first Run, not when the view opens.
            job = BenchmarkJob(lambda: self.services.ensure_agent(self.window()), self)
            self.benchmark_view = BenchmarkView(job, self)
            self._content_layout.addWidget(self.benchmark_view, 0)
            from gaudi_gui.core.runstore import RunStore
            self.benchmark_view.show_latest(RunStore().root)
        view = self.benchmark_view
        if view is not None:
            view.setVisible(shown)
            if shown:
                QTimer.singleShot(0, self, lambda: self._scroll.ensureWidgetVisible(view))

    def shutdown(self) -> None:
        """The window goes: the benchmark's follower ends (the agent's job does not)."""
        if self.benchmark_view is not None:
            self.benchmark_view.shutdown()

    def _open_health(self) -> None:
        if self.services.health is not None:
            self.services.health.view_requested.emit(self.health_host)

    # -- charts -------------------------------------------------------------------------------------

    def bind_queue(self, queue: QueueService) -> None:
        """Show the queue's next job when it waits for cards (``QueueService.next_line``)."""
        self._queue = queue
        # A bound method of this widget, not a lambda: the connection ends with the widget (the
        # queue service outlives the window; a closure would be called on a deleted label).
        queue.state_changed.connect(self._show_queue_line)
        self._show_queue_line()

    def _show_queue_line(self, _state: object = None) -> None:
        queue = self._queue
        if queue is None:
            return
        text = queue.next_line()
        waiting = queue.next_waiting()
        self.queue_line.setText(text)
        self.queue_line.setToolTip(waiting.why if waiting is not None else "")
        self.queue_line.setVisible(bool(text))

    def _on_window_changed(self, index: int) -> None:
        seconds = int(self.window_combo.itemData(index))
        self.charts.set_window(seconds)
        self.services.settings.set("devices/history_window_s", seconds)
        self.refresh_now()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self._chart_timer.start()

    def hideEvent(self, event: QHideEvent) -> None:
        super().hideEvent(event)
        self._chart_timer.stop()

    def _refresh_charts(self) -> None:
        metric = CHARTS[self._next_chart][0]
        self._next_chart = (self._next_chart + 1) % len(CHARTS)
        if (metric not in self._dirty or not self.isVisible()
                or not self.charts.due(metric, CHART_REFRESH_MS / 1000)):
            return
        self._dirty.discard(metric)
        keys = self._keys or ([self._host_key] if self._host_key else [])
        self.charts.refresh(self.poller.history_store, keys, metrics=[metric])

    def refresh_now(self) -> None:
        """Redraw all charts at once (window change, screenshots, tests)."""
        self._dirty.clear()
        keys = self._keys or ([self._host_key] if self._host_key else [])
        self.charts.refresh(self.poller.history_store, keys)

    # -- selection ----------------------------------------------------------------------------------

    def _on_selection_edited(self, ids: list[int]) -> None:
        self.selection.set_selected(ids)
        self.services.settings.set("devices/selected_modules", list(ids))

    def _on_selection_changed(self, ids: list[int]) -> None:
        self.table.set_checked(ids)
        self._update_selection_text()

    def _update_selection_text(self) -> None:
        sel = self.selection
        env = {k: v for k, v in sel.env().items() if k != "PT_ENABLE_INT64_SUPPORT"}
        problem = sel.runtime_problem()
        self.runtime_panel.setText(f"⚠ {problem}" if problem else "")
        self.runtime_panel.setVisible(bool(problem))
        if sel.kind == "cpu":
            text = "no accelerator: jobs run on the CPU"
        elif not sel.jobs_use_cards():
            where = "the CPU" if sel.jobs_kind == "cpu" else sel.jobs_kind
            text = f"jobs run on {where}: checked cards are not used (see the note above)"
        elif env:
            text = "jobs get " + " ".join(f"{k}={v}" for k, v in env.items())
        else:
            var = "HABANA_VISIBLE_MODULES" if sel.kind == "hpu" else "CUDA_VISIBLE_DEVICES"
            text = f"no card checked: jobs see every card ({var} unset)"
        held = {job: ids for job, ids in sel.claims().items() if ids}
        if held:
            text += " · in use: " + "; ".join(f"{job} ({cards_name(ids, sel.kind)})"
                                              for job, ids in sorted(held.items()))
        self.env_label.setText(text)
        warnings = sel.warnings()
        self.selection_warning.setText("\n".join(f"⚠ {w}" for w in warnings))
        self.selection_warning.setVisible(bool(warnings))

"""The Training tab: the job form, command preview, Start/Stop/Resume, live log and curves, history."""

from __future__ import annotations

import contextlib
import html
import time
import uuid
from pathlib import Path
from typing import Any

from PySide6.QtCore import QEvent, QObject, QSize, Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QResizeEvent, QShowEvent
from PySide6.QtWidgets import (
    QFileDialog,
    QFrame,
    QGridLayout,
    QHBoxLayout,
    QLabel,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSizePolicy,
    QSplitter,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core import datafile, jobcheck, meter_files, meter_words, meter_work, visibility
from gaudi_gui.core import launch as launch_mod
from gaudi_gui.core import metrics as metrics_mod
from gaudi_gui.core import preflight as preflight_mod
from gaudi_gui.core import remote as remote_mod
from gaudi_gui.core.events import EventType
from gaudi_gui.core.jobconfig import JobConfig, JobConfigError, demo_job
from gaudi_gui.core.outputs import own_checkpoint
from gaudi_gui.core.placement import Placement
from gaudi_gui.core.prepare import PrepareError
from gaudi_gui.core.queue import Entry
from gaudi_gui.core.remote import Host
from gaudi_gui.core.runstore import Run
from gaudi_gui.core.secrets import redact
from gaudi_gui.core.start_preview import start_preview
from gaudi_gui.core.training_args import Schema, hints, latest_cached
from gaudi_gui.services.context import AppServices
from gaudi_gui.services.training import TrainingService
from gaudi_gui.services.training_job import TrainingJob
from gaudi_gui.ui.log_view import LogView
from gaudi_gui.ui.loss_chart import ComparedRun, LossChart, meter_utilization
from gaudi_gui.ui.model_field import ModelCacheState
from gaudi_gui.ui.placement_widget import PlacementWidget
from gaudi_gui.ui.shortcuts import STOP_KEYS, start_stop_keys, with_keys
from gaudi_gui.ui.training_form import TrainingForm
from gaudi_gui.ui.training_runs import RunsTable


class TrainingTab(QWidget):
    #: The user wants a trained model opened in the Model runner: carries its folder.
    load_in_runner_requested = Signal(str)
    #: A run's state changed (for the window's status bar): carries the state.
    job_state_changed = Signal(str)
    #: Download… beside the form's model: (the model's Hub id, the placement's host name); the main
    #: window opens the Models tab's Download dialog with them.
    download_requested = Signal(str, str)

    def __init__(self, services: AppServices, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.services = services
        # The supervisor owns the runs; this view only binds to its current job.
        self.training = services.training or TrainingService(services.settings, services.selection,
                                                             services.environment, self)
        self.store = self.training.store
        self._bound: TrainingJob | None = None
        self.schema_loader = services.ensure_schema(services.settings.parent())
        self.schema_loader.schema_loaded.connect(self._on_schema)
        self.schema_loader.schema_failed.connect(self._on_schema_failed)
        self.schema_loader.validated.connect(self._on_validated)

        self.form = TrainingForm(self)
        scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.form)
        scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)

        self.command = QPlainTextEdit(self)
        self.command.setReadOnly(True)
        self.command.setMaximumHeight(90)
        self.command.setToolTip("exactly what Start runs: environment variables, then the argv")
        # Where Start runs: this machine, a host, several hosts, Slurm (its own widget; its value is a
        # core.placement.Placement).
        self.placement = PlacementWidget(services, grace_s=self.training._grace, runs_root=self.store.root,
                                         device=self.training.device, parent=self)
        # The start gate's answer, under the Host field: why Start was refused and the fix, or the
        # warnings with "Start anyway" (core.preflight; hidden until a check has something to say).
        self.gate_box = QWidget(self)
        gate_row = QHBoxLayout(self.gate_box)
        gate_row.setContentsMargins(0, 0, 0, 0)
        self.gate_label = QLabel("", self.gate_box)
        self.gate_label.setWordWrap(True)
        self.gate_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.gate_anyway = QPushButton("Start anyway", self.gate_box)
        self.gate_anyway.setToolTip("start although the card check found warnings (no errors)")
        self.gate_anyway.clicked.connect(lambda _checked=False: self._start_anyway())
        gate_row.addWidget(self.gate_label, 1)
        gate_row.addWidget(self.gate_anyway)
        self.gate_box.setVisible(False)
        self._gate_job: JobConfig | None = None  # the job whose card check is under way
        self._gate_warned: JobConfig | None = None  # checked, warnings only: "Start anyway" starts it
        #: The ids of the adds this tab sent to this machine's queue, not started yet.
        self._queued_here: set[str] = set()
        self._queue_followed = False
        self._gate_passed: JobConfig | None = None  # checked: the next start(job) goes ahead
        self._gate_connected = False
        self.placement.below_host.addWidget(self.gate_box)
        # Each host's live state during a multi-host run ("gg-a (rank 0): running · …").
        self.hosts_line = QLabel("", self)
        self.hosts_line.setWordWrap(True)
        self.hosts_line.setVisible(False)
        # Host 0's address as the others reach it, resolved by `ssh -G` (no connection) for the preview.
        # Host 0's address as the others reach it: the hosts service asks `ssh -G` once per host.
        self.hosts = services.ensure_hosts(services.settings.parent())
        self.hosts.address_resolved.connect(self._on_resolved)
        self.hosts.changed.connect(self.placement.refresh_hosts)
        self.placement.changed.connect(self._on_placement_changed)
        # The form's model in the placement's Hub cache (the first host of several; Slurm: this
        # machine's view), Download… when it is not there, the cached models offered in the field.
        places = services.ensure_models(services.settings.parent())
        self.model_cache = ModelCacheState(self.form.model, places, self._model_place,
                                           button=self.form.download_button, button_in_line=True,
                                           action="Start")
        self.form.attach_model_state(self.model_cache)
        self.model_cache.download_requested.connect(self.download_requested)
        self.placement.changed.connect(self.model_cache.place_changed)
        buttons = QGridLayout()
        self.btn: dict[str, QPushButton] = {}
        for name, handler in (("Copy command", self.copy_command), ("Validate", self.validate),
                              ("Save job…", self.save_job_dialog), ("Load job…", self.load_job_dialog),
                              ("Start", self.start), ("Queue", self.queue_current), ("Stop", self.stop),
                              ("Resume", self.resume_current)):
            b = QPushButton(name, self)
            # clicked(bool) would hand `checked` to a slot's first optional parameter (start(job)).
            b.clicked.connect(lambda _checked=False, h=handler: h())
            # Two rows (files, then the run) so the column fits a 1024-pixel window.
            index = len(self.btn)
            buttons.addWidget(b, 0 if index < 4 else 1, index if index < 4 else index - 4)
            self.btn[name] = b
        self.btn["Start"].setDefault(True)
        # Ctrl+Return starts and Ctrl+. stops while the focus is in this tab (Start was 36 Tabs away).
        self.shortcuts = start_stop_keys(self, self.btn["Start"], self.btn["Stop"])
        self.status = QLabel("idle", self)
        self.status.setWordWrap(True)
        self.status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        # The run meter under the status: the pace while a run trains (steady state, warm-up left
        # out), what it cost once it ended (core.meter's summary in the run folder). Hidden otherwise.
        self.meter_line = QLabel("", self)
        self.meter_line.setWordWrap(True)
        self.meter_line.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.meter_line.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.meter_line.setVisible(False)
        # Watts now and Wh so far while a run trains (the agent of its machine reads its meter); the
        # meter's warnings.
        from gaudi_gui.services.run_meter import RunMeter
        from gaudi_gui.ui.meter_strip import MeterStrip
        self.meter_strip = MeterStrip(self, RunMeter(parent=self))
        self.progress = QProgressBar(self)
        self.progress.setFormat("%p%")
        self.eta = QLabel("", self)
        prow = QHBoxLayout()
        prow.addWidget(self.progress, 1)
        prow.addWidget(self.eta)

        self.chart = LossChart(self)
        self.log = LogView(self)
        self.runs = RunsTable(self.store, self)
        self.runs.hosts = self.hosts.saved
        self.runs.jobs = services.jobs
        self.runs.queue = lambda: services.ensure_queue(services.settings.parent())
        self.runs.settings = services.settings  # the prices are the app's settings, not a second copy
        self.runs.queue_cards = lambda: (tuple(services.selection.selected)
                                         if services.selection.jobs_use_cards() else ())
        self.runs.machine = services.machine
        self.views = QTabWidget(self)
        # Curves and log together: the log explains what the curve shows (a stall, a warning).
        live = QSplitter(Qt.Orientation.Vertical, self)
        # Compare puts the compared runs' scores beside their curves (hidden otherwise).
        self.chart_row = QSplitter(Qt.Orientation.Horizontal, self)
        self.chart_row.addWidget(self.chart)
        self.chart_row.setChildrenCollapsible(False)
        self.runs.scores_dock = self.chart_row
        live.addWidget(self.chart_row)
        live.addWidget(self.log)
        live.setStretchFactor(0, 3)
        live.setStretchFactor(1, 2)
        self.live = live
        self.views.addTab(live, "Run")
        self.views.addTab(self.runs, "Runs")

        right = QWidget(self)
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(self.placement)
        rl.addWidget(QLabel("Command", self))
        rl.addWidget(self.command)
        rl.addLayout(buttons)
        rl.addWidget(self.status)
        rl.addWidget(self.meter_line)
        rl.addWidget(self.meter_strip)
        rl.addWidget(self.hosts_line)
        rl.addLayout(prow)
        rl.addWidget(self.views, 1)
        # The right column scrolls when the window is short (a 1280x800 laptop with the Health dock
        # open) instead of making the whole window taller than the screen.
        right_scroll = QScrollArea(self)
        right_scroll.setWidgetResizable(True)
        right_scroll.setWidget(right)
        right_scroll.setFrameShape(QFrame.Shape.NoFrame)
        right_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        right_scroll.setMinimumWidth(right.minimumSizeHint().width() + 16)
        splitter = QSplitter(Qt.Orientation.Horizontal, self)
        splitter.addWidget(scroll)
        splitter.addWidget(right_scroll)
        splitter.setStretchFactor(0, 2)
        splitter.setStretchFactor(1, 3)
        # A handle a person can see and grab; both positions are remembered.
        for s_ in (splitter, live):
            s_.setHandleWidth(7)
            s_.setChildrenCollapsible(False)
            s_.setStyleSheet("QSplitter::handle { background: palette(mid); margin: 1px; }")
        self.splitter = splitter
        self.form_scroll = scroll
        self.live_scroll = right_scroll
        self.form.installEventFilter(self)
        for key, widget in (("training/splitter", splitter), ("training/live_splitter", live)):
            state = services.settings.get(key)
            if state is not None and not state.isEmpty():
                widget.restoreState(state)
            widget.splitterMoved.connect(lambda _pos, _index, k=key, w=widget: self._save_splitter(k, w))
        self._outer = QVBoxLayout(self)
        self._outer.addWidget(splitter)
        # Unsaved form edits survive a restart: the form is kept in the settings as it is edited.
        self._draft_timer = QTimer(self)
        self._draft_timer.setSingleShot(True)
        self._draft_timer.setInterval(400)
        self._draft_timer.timeout.connect(self._save_draft)

        self.form.changed.connect(self.update_preview)
        self.form.changed.connect(lambda *_a: self._draft_timer.start())
        self.runs.reopen_requested.connect(self.reopen)
        self.runs.clone_requested.connect(self.clone)
        self.runs.compare_requested.connect(self.compare)
        self.runs.resume_requested.connect(self.resume_run)
        self.runs.load_in_runner_requested.connect(self._load_in_runner)
        self.runs.align_requested.connect(self.align)

        # Start from the last job, with the card count of the Devices tab as the process count.
        last = services.settings.get("training/last_job")
        job = None
        if last:
            with contextlib.suppress(JobConfigError):
                job = JobConfig.from_dict(last)
        default = job is None
        if job is None:
            # The demo job (core.jobconfig.demo_job: why its rate and rows make base and tuned differ).
            # No output_dir: each run writes into a folder of its own (core/outputs.py).
            job = demo_job(services.selection.card_count())
        #: The default job's process count, taken from the cards; while the form still shows it, it
        #: follows the cards the jobs will use (``_on_cards_changed``). The tab is built in the
        #: background before the environment probe answers: the 8 cards hl-smi sees stood as 8 ranks
        #: of a run this Python can only run on the CPU. None once the person or a loaded job chose.
        self._cards_nproc: int | None = job.launch.num_processes if default else None
        self.form.set_job(job)
        cached = latest_cached()
        if cached is not None:
            self.form.set_schema(cached)
            self._fit_form_column()
        # The probe's versions are under "packages" (a top-level "transformers" never existed: every
        # build of this tab asked the schema child, seconds of CPU, though the schema was cached).
        probed = getattr(services.environment, "result", None)
        packages = probed.get("packages") if isinstance(probed, dict) else None
        version = str(packages.get("transformers") or "") if isinstance(packages, dict) else ""
        self.schema_loader.load(version)
        self.update_preview()
        self.training.current_changed.connect(self._bind)
        # A bound method, not a lambda: Qt drops it with this tab (the selection outlives it).
        self.services.selection.selection_changed.connect(self._on_cards_changed)
        self._bind(self.training.current)
        self.training.reattach()
        self._update_buttons()

    # -- binding to the supervisor's current job ---------------------------------------------------

    @property
    def job(self) -> TrainingJob:
        return self.training.current

    def _bind(self, job: TrainingJob) -> None:
        if job is self._bound:
            return
        if self._bound is not None:
            for sig, slot in self._connections(self._bound):
                with contextlib.suppress(RuntimeError, TypeError):
                    sig.disconnect(slot)
        self._bound = job
        for sig, slot in self._connections(job):
            sig.connect(slot)
        self._show_job(job)

    def _connections(self, job: TrainingJob) -> list[tuple[Any, Any]]:
        return [(job.log_line_received, self.log.append_line), (job.metrics_received, self._on_metrics),
                (job.event_received, self._on_event), (job.event_received, self.meter_strip.take_event),
                (job.status_changed, self._on_state),
                (job.summary_changed, self._on_summary), (job.finished, self._on_finished),
                (job.hosts_changed, self._show_hosts)]

    def _show_job(self, job: TrainingJob) -> None:
        """Show a job the tab did not watch from its start (re-attached): its curve and progress; its
        log streams in from the run's beginning."""
        # This machine's card usage says nothing about a host's cards: no such chart elsewhere.
        self.chart.set_card_chart_shown(not job.is_remote)
        # Lines of a run on several hosts come prefixed "host| ": the log view filters on them.
        self.log.set_sources(job.host_names() if len(job.hosts) > 1 else [])
        self._show_hosts()
        if job.records or job.attached:
            self._clear_run_view()
            self.chart.set_records(self._curve_of(job))
            self._show_progress()
            if job.is_running():
                self._show_live_meter()
            elif job.run is not None:
                self._show_meter(job.run)
        if job.summary:
            self.status.setText(job.summary)
        self._update_buttons()

    @property
    def device(self) -> str:
        return self.training.device

    # -- where it runs ----------------------------------------------------------------------------

    def _model_place(self) -> Host:
        place = self.placement.placement()
        return place.hosts[0] if place.hosts else Host.local()

    def _on_placement_changed(self) -> None:
        """Machines and rank are set per host at Start on several hosts (the main address too,
        unless typed), on Slurm by the nodes and each node's rank in the allocation."""
        p = self.placement.placement()
        several, slurm = p.kind == "hosts", p.kind == "slurm"
        for widget in (self.form.num_machines, self.form.machine_rank):
            widget.setEnabled(not several and not slurm)
            widget.setToolTip("set for each host by \"several hosts…\"" if several else
                              "set by the Slurm fields: Nodes, and each node's rank" if slurm else "")
        self.form.main_ip.setPlaceholderText("empty: from ssh -G, first host" if several else
                                             "the allocation's first node" if slurm else "main machine IP")
        self.update_preview()

    def showEvent(self, event: QShowEvent) -> None:
        # Hosts added in the Hosts tab meanwhile appear here; their card selections may have changed.
        self.placement.refresh_hosts()
        self.update_preview()
        super().showEvent(event)

    def current_job(self) -> tuple[JobConfig, list[tuple[str, str]]]:
        """The form's job as Start would run it at the chosen placement, and what is wrong with it
        (the placement's own problems at the Host field)."""
        job, errors = self.form.job()
        p = self.placement.placement()
        if p.kind in ("hosts", "slurm"):
            # Machines, rank and the main address are set per host at Start, or by the Slurm fields.
            job.launch.num_machines, job.launch.machine_rank = 1, 0
        errors = errors + [("host", m) if f in ("placement", "hosts") else (f, m) for f, m in p.problems()]
        # The one check of a job where it enters (core.jobcheck, as `train` and `queue add` make it),
        # with the schema the form shows; the files a job names (model, dataset rows, the output
        # folder and another run's files in it) are looked at here only for a run on this machine:
        # a host's `train` refuses the run with the same words. A dataset is read up to a bound here
        # (this runs at each change); `train`, which Start runs, reads it whole.
        local = p.kind == "local"
        errors = errors + jobcheck.check(job, schema=self.form.schema, local=local,
                                         scan_limit=datafile.WINDOW_SCAN_BYTES)
        if p.kind == "slurm":
            errors = [*errors, *(("slurm." + f, m) for f, m in p.slurm_target().problems(job))]
        if p.kind in ("host", "hosts"):
            # Files named in the job are the host's: this machine cannot tell whether they exist
            # (the host's `train` checks them and refuses the run with the same message).
            errors = [(f, m) for f, m in errors if not m.startswith("file not found")]
        return job, errors

    def update_preview(self) -> None:
        """The command Start would run now: this form, at this placement, on the cards chosen now."""
        job, errors = self.current_job()
        preview = start_preview(job, self.placement.placement(), device=self.device,
                                device_env=self.training.device_env(), runs_root=self.store.root,
                                grace_s=self.training._grace(), address_of=self._main_address, errors=errors)
        self.command.setPlainText(preview.text)
        # Every host's command (or a dozen lines of a Slurm script) in view, without a scroll bar.
        self.command.setMaximumHeight(self.command.fontMetrics().lineSpacing() * preview.lines + 24
                                      if preview.lines else 90)
        self.form.set_hints([("cards", preview.cards_hint)] if preview.cards_hint else self._local_hints(job))
        self.form.show_errors(errors)

    def _local_hints(self, job: JobConfig) -> list[tuple[str, str]]:
        """What to know about a run on this machine: the device's own hints, and cards held by the
        runner or another run (a second owner of a Gaudi card fails to start)."""
        n = job.launch.num_processes * job.launch.num_machines
        shown = hints(self.device, launch_mod.worker_training_args(job, self.device)
                      if self.device != "cpu" else job.training_args, n)
        # Rows of the dataset that cannot train (no answer...): skipped by the worker, said here first.
        shown = [*shown, *(("dataset", note) for note in jobcheck.notes(job, datafile.WINDOW_SCAN_BYTES))]
        ignored = self._ignored_cards()
        if ignored:
            shown = [*shown, ("cards", ignored)]
        if self.device != "cpu" and not self.job.is_running():
            conflicts = getattr(self.services.selection, "conflicts", None)
            held = conflicts() if callable(conflicts) else {}
            shown = [*shown, *(("cards", f"card(s) {', '.join(map(str, ids))} are held by {owner}")
                               for owner, ids in held.items())]
        return shown

    def _ignored_cards(self) -> str:
        """Cards ticked in Devices on a machine whose runs go to the CPU: a sentence saying they are
        ignored and why ("" when nothing is ticked or the run uses the cards)."""
        selection = self.services.selection
        if self.device != "cpu" or selection.kind == "cpu" or not selection.selected:
            return ""
        why = selection.runtime_problem() or "this machine's jobs run on the cpu"
        return (f"the ticked {selection.kind} card(s) {visibility.format_ids(selection.selected)} are "
                f"ignored: the run uses the CPU ({why})")

    def _main_address(self, host: remote_mod.Host) -> str:
        """Host 0's address (``ssh -G``, asked once per host in the background); a placeholder meanwhile."""
        return self.hosts.address(host.name) or f"<{host.name}'s address>"

    def _on_resolved(self, _name: str, _address: str) -> None:
        if self.placement.multi_selected():
            self.update_preview()

    def _on_cards_changed(self, _ids: list[int]) -> None:
        if self._cards_nproc is not None:
            if self.form.num_processes.value() != self._cards_nproc:
                self._cards_nproc = None  # the person set it: theirs from now on
            else:
                self._cards_nproc = max(1, self.services.selection.card_count())
                self.form.num_processes.setValue(self._cards_nproc)
        self.update_preview()

    def _save_splitter(self, key: str, widget: QSplitter) -> None:
        if widget is self.splitter and widget.orientation() != Qt.Orientation.Horizontal:
            return  # the stacked columns of a narrow window are not the layout a person chose
        self.services.settings.set(key, widget.saveState())

    # -- a narrow window: the form above the live column ------------------------------------------

    def _side_by_side_width(self) -> int:
        """The narrowest width at which the form and the live column stand side by side."""
        m = self._outer.contentsMargins()
        return (self.form_scroll.minimumWidth() + self.live_scroll.minimumWidth()
                + self.splitter.handleWidth() + m.left() + m.right())

    def minimumSizeHint(self) -> QSize:
        """As narrow as the wider column: below two columns' width they stack (``resizeEvent``), so
        this tab never makes the window wider than a small screen (1024 px with the Serve dock open)."""
        hint = super().minimumSizeHint()
        m = self._outer.contentsMargins()
        stacked = max(self.form_scroll.minimumWidth(), self.live_scroll.minimumWidth()) + m.left() + m.right()
        return QSize(min(hint.width(), stacked), hint.height())

    def resizeEvent(self, event: QResizeEvent) -> None:
        self._fit_orientation(event.size().width())
        super().resizeEvent(event)

    def _fit_orientation(self, width: int) -> None:
        want = (Qt.Orientation.Horizontal if width >= self._side_by_side_width()
                else Qt.Orientation.Vertical)
        if self.splitter.orientation() == want:
            return
        self.splitter.setOrientation(want)
        if want == Qt.Orientation.Vertical:
            # Start, Stop and the chart keep the larger share; the form scrolls in its own pane.
            height = max(self.height(), 2)
            self.splitter.setSizes([height * 2 // 5, height - height * 2 // 5])
        else:
            state = self.services.settings.get("training/splitter")
            if state is not None and not state.isEmpty():
                self.splitter.restoreState(state)
            self.splitter.setOrientation(want)

    def _save_draft(self) -> None:
        job, _errors = self.form.job()
        with contextlib.suppress(ValueError, TypeError):
            self.services.settings.set("training/last_job", job.to_dict())

    def _dialog_folder(self) -> str:
        """File dialogs start in the folder used last, else the user's home (never the repository)."""
        last = self.services.settings.get("training/last_folder")
        return last if last and Path(last).is_dir() else str(Path.home())

    def _remember_folder(self, path: str) -> None:
        with contextlib.suppress(ValueError, TypeError):
            self.services.settings.set("training/last_folder", str(Path(path).parent))

    def copy_command(self) -> None:
        QGuiApplication.clipboard().setText(self.command.toPlainText())
        self.status.setText("command copied to the clipboard")

    # -- schema / validation ----------------------------------------------------------------------

    def _fit_form_column(self) -> None:
        """The form's column never narrower than the form (nothing clipped, no sideways scrolling):
        fitted whenever the form's layout changes (``eventFilter``), not only when the schema comes,
        so a fresh install's form, shown before its schema child answers, is not cut either."""
        bar = self.form_scroll.verticalScrollBar().sizeHint().width()
        width = self.form.minimumSizeHint().width() + bar + 4
        if width == self.form_scroll.minimumWidth():
            return
        self.form_scroll.setMinimumWidth(width)
        self.updateGeometry()
        self._fit_orientation(self.width())

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if watched is self.form and event.type() == QEvent.Type.LayoutRequest:
            QTimer.singleShot(0, self, self._fit_form_column)  # after the layout; not once the tab is gone
        return super().eventFilter(watched, event)

    def _on_schema(self, schema: Schema) -> None:
        if self.form.full_schema is None or self.form.full_schema.to_dict() != schema.to_dict():
            self.form.set_schema(schema)
        self._fit_form_column()
        self.update_preview()

    def _on_schema_failed(self, reason: str) -> None:
        self.form.schema_status.setText(f"⚠ {reason}")

    def validate(self) -> None:
        job, errors = self.current_job()
        if errors:
            self.form.show_errors(errors)
            self.status.setText("fix: " + "; ".join(f"{f}: {m}" for f, m in errors[:4]))
            return
        self.status.setText("validating TrainingArguments in a child process…")
        self.schema_loader.validate(launch_mod.worker_training_args(job, self.device), device=self.device,
                                    device_env=self.training.device_env(),
                                    num_processes=job.launch.num_processes * job.launch.num_machines,
                                    objective=job.objective)

    def _on_validated(self, errors: list) -> None:
        self.form.show_errors([(f"training_args.{f}", m) for f, m in errors])
        self.status.setText("valid: TrainingArguments builds" if not errors else
                            "invalid: " + "; ".join(f"{f or 'arguments'}: {m}" for f, m in errors))

    # -- save / load ------------------------------------------------------------------------------

    def save_job(self, path: str) -> None:
        job, _ = self.form.job()
        job.save(path)
        self.status.setText(f"saved {path}")

    def load_job(self, path: str) -> bool:
        try:
            job = JobConfig.load(path)
        except JobConfigError as exc:
            self.status.setText(f"cannot load: {exc}")
            return False
        self._cards_nproc = None
        self.form.set_job(job)
        self.update_preview()
        self.status.setText(f"loaded {path}")
        return True

    def save_job_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save job", str(Path(self._dialog_folder()) / "job.json"),
                                              "Job (*.json)")
        if path:
            self._remember_folder(path)
            self.save_job(path)

    def load_job_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Load job", self._dialog_folder(), "Job (*.json)")
        if path:
            self._remember_folder(path)
            self.load_job(path)

    # -- running ----------------------------------------------------------------------------------

    def start(self, job: JobConfig | None = None, *, resumed_from: Run | None = None) -> Run | None:
        if self.job.is_running():
            self.status.setText("a run is already going: stop it first")
            return None
        errors: list[tuple[str, str]] = []
        if job is None:
            job, errors = self.current_job()
        if errors:
            self.form.show_errors(errors)
            self.status.setText("cannot start: " + "; ".join(f"{f}: {m}" for f, m in errors[:4]))
            return None
        if resumed_from is None and not self._gate(job):
            return None  # the card check is under way (Start goes on when it passes) or refused
        p = self.placement.placement()
        if resumed_from is not None and p.kind in ("host", "hosts"):
            # A run picked in Runs is this machine's: it resumes here (a Slurm job resumes on Slurm:
            # its checkpoint is on the shared file system).
            p = Placement.local()
        # The gate ran here (a resumed run's did not: its place's `train` checks the cards once).
        return self._launch(job, p, resumed_from=resumed_from, gated=resumed_from is None)

    def _launch(self, job: JobConfig, p: Placement, *, resumed_from: Run | None = None,
                after: TrainingJob | None = None, gated: bool = False) -> Run | None:
        """The one way a run starts: ``job`` at ``p`` (or ``after`` resumed where it ran), then the
        live view follows the new current job. The run folder on this machine (None elsewhere)."""
        try:
            if after is not None:
                started = self.training.resume(after)
            else:
                main_ip = job.launch.main_process_ip.strip() or (
                    (self.hosts.address(p.hosts[0].name) or "") if p.kind == "hosts" else "")
                started = self.training.launch(job, p, main_ip=main_ip, gated=gated,
                                               resumed_from=str(resumed_from.folder) if resumed_from else "")
        except PrepareError as exc:
            self.form.show_errors(exc.problems)
            self.status.setText(f"cannot start: {exc}")
            return None
        except (ValueError, OSError, RuntimeError) as exc:
            self.status.setText(f"cannot start: {getattr(exc, 'strerror', None) or exc}")
            return None
        self._clear_run_view()
        if after is not None:
            # The resumed run continues its parent's curve, up to the checkpoint it resumes.
            upto = int(after.remote_status.get("step") or after.progress.step)
            self.chart.set_records([r for r in self._curve_of(after) if int(r.get("step", 0)) <= upto])
        elif resumed_from is not None:
            self.chart.set_records(self._curve_upto(str(resumed_from.folder)))
        ignored = self._ignored_cards() if p.kind == "local" else ""
        self.status.setText((started.summary or "starting…") + (f" — {ignored}" if ignored else ""))
        self.views.setCurrentWidget(self.live)
        self.runs.refresh()
        self._update_buttons()
        return started.run

    # -- the start gate ---------------------------------------------------------------------------

    def _gate_plan(self, job: JobConfig) -> preflight_mod.Plan:
        """What Start checks first: the chosen host(s) and their cards, or this machine's chosen cards
        (nothing where it has no hl-smi or the run uses no cards); Slurm's nodes check themselves in
        the batch script."""
        p = self.placement.placement()
        if p.kind == "slurm":
            return preflight_mod.Plan()

        def target(host: remote_mod.Host) -> preflight_mod.Target:
            return preflight_mod.Target(host.name, tuple(p.cards_of(host.name)) or None, host.remote_command)

        if p.kind == "hosts":
            return preflight_mod.hosts_plan([target(h) for h in p.hosts])
        several = job.launch.num_machines > 1
        if p.kind == "host":
            return preflight_mod.hosts_plan([target(p.host)], multi_node=several)
        selection = self.services.selection
        return preflight_mod.local_plan(selection.selected or None, uses_cards=selection.jobs_use_cards(),
                                        hl_smi=str(self.services.settings.get("devices/hl_smi") or ""),
                                        multi_node=several)

    def _gate(self, job: JobConfig) -> bool:
        """True: start now. False: the card check started (Start goes on by itself when it passes)."""
        passed, self._gate_passed = self._gate_passed is job, None
        self._show_gate("", "")
        plan = preflight_mod.Plan() if passed else self._gate_plan(job)
        if plan.empty:
            return True
        service = self.services.ensure_preflight(self.services.settings.parent())
        if not self._gate_connected:
            service.finished.connect(self._on_gate_finished)
            self._gate_connected = True
        self._gate_job = job
        service.run(plan, "training")
        where = ", ".join(t.label() for t in plan.targets)
        self.status.setText(f"checking the cards on {where} before the start…")
        self._update_buttons()
        return False

    def _on_gate_finished(self, verdict: preflight_mod.Verdict) -> None:
        if verdict.key != "training" or self._gate_job is None:
            return
        job, self._gate_job = self._gate_job, None
        self._update_buttons()
        if not verdict.ok:
            fix = f"<br><b>Fix:</b> {html.escape(verdict.suggestion)}" if verdict.suggestion else ""
            reasons = "<br>".join(map(html.escape, verdict.errors))
            self._show_gate("error", f"<b>Cannot start:</b> {reasons}{fix}")
            self.status.setText("cannot start: " + verdict.message())
            return
        warnings = "<br>".join(map(html.escape, verdict.warnings))
        if verdict.confirm:
            # A warning about a chosen card (slowdown, ports down...): the user decides.
            self._gate_warned = job
            self._show_gate("warning", f"<b>The card check found warnings:</b><br>{warnings}")
            self.status.setText("the card check found warnings: Start anyway goes on")
            return
        self._gate_passed = job
        self.start(job)
        if warnings:  # about the stack only: shown, not asked
            self._show_gate("info", f"<b>The card check passed, with warnings:</b><br>{warnings}")

    def queue_current(self) -> None:
        """Queue: the form's job goes into this machine's queue (issue 29) and starts by itself, through
        the same gate as Start, when its cards (those ticked in Devices; none for a CPU job) are free
        and healthy, whether this window is open or not."""
        job, errors = self.current_job()
        if errors:
            self.form.show_errors(errors)
            self.status.setText("cannot queue: " + "; ".join(f"{f}: {m}" for f, m in errors[:4]))
            return
        placement = self.placement.placement()
        if placement.kind not in ("local", "host"):
            self.status.setText("Queue takes a job for this machine or one host; several hosts and "
                                "Slurm (a queue of its own) are started with Start")
            return
        from gaudi_gui.core.queue import CardRequest
        if placement.kind == "host":
            # The host keeps its own queue: its queue add checks the job against its own files and
            # cards (the host's ticked cards are the host's selection, shown with its placement).
            where, ids, device = placement.host.name, tuple(self.placement.host_cards(placement.host)), "auto"
        else:
            selection = self.services.selection
            where, device = "local", self.device if self.device in ("hpu", "cuda", "cpu") else "auto"
            ids = tuple(selection.selected) if selection.jobs_use_cards() and selection.selected else ()
        cards, place = CardRequest(ids=ids), self.services.queue_for(where)
        client_id = ""
        if place.place == "local":
            # This machine's queue: when it starts this job, the tab follows the run as if started
            # here (log, charts, Stop). The add's own id finds the entry again.
            client_id = uuid.uuid4().hex
            self._queued_here.add(client_id)
            if not self._queue_followed:
                self._queue_followed = True
                place.entry_started.connect(self._on_queued_started)
        place.add(job, cards, device=device, on_answer=place.shown(self.status.setText, cards),
                  client_id=client_id)

    def _on_queued_started(self, entry: Entry) -> None:
        """A job this tab queued was started by the queue: follow its run."""
        if entry.client_id not in self._queued_here or not entry.run_folder:
            return
        self._queued_here.discard(entry.client_id)
        if self.training.follow_run(entry.run_folder) is None:
            self.status.setText(f"the queue started {entry.label()} as run {entry.run_name}, which has "
                                f"already ended (see the runs below)")

    def _start_anyway(self) -> None:
        job, self._gate_warned = self._gate_warned, None
        if job is not None:
            self._gate_passed = job
            self.start(job)

    def _show_gate(self, level: str, text: str) -> None:
        """The gate's answer under the Host field (and the Host field marked) or nothing."""
        if level != "warning":
            self._gate_warned = None
        color = {"error": "#b00020", "warning": "#8a5a00"}.get(level, "")
        self.gate_label.setText(text)
        self.gate_label.setStyleSheet(f"color: {color};" if color else "")
        self.gate_anyway.setVisible(level == "warning")
        self.gate_box.setVisible(bool(text))
        self.placement.mark(text if level == "error" else "")

    def _show_hosts(self) -> None:
        """Each host's state during a run on several hosts (hidden otherwise)."""
        job = self.job
        if len(job.hosts) < 2:
            self.hosts_line.setVisible(False)
            return
        self.hosts_line.setText("  ·  ".join(
            f"<b>{html.escape(name)}</b> (machine {rank}): {html.escape(word)}"
            for name, rank, word in job.host_states()))
        self.hosts_line.setVisible(True)

    def _curve_of(self, job: TrainingJob) -> list[dict[str, Any]]:
        """The records of ``job`` after those of the runs it resumed: read from their folders on this
        machine, else from the jobs this app still holds (a run elsewhere)."""
        start = job.progress.start_step or int(job.remote_status.get("step") or 0)
        if job.kind == "local":
            before = self._curve_upto(job.resumed_from)
        else:
            parent = next((o for o in self.training.jobs if o is not job and o.folder and
                           o.folder == job.resumed_from and o.host.name == job.host.name), None)
            before = self._curve_of(parent) if parent is not None else []
        return [r for r in before if not start or int(r.get("step", 0)) <= start] + list(job.records)

    def stop(self) -> None:
        """Stop with a checkpoint; pressed again while stopping: kill now."""
        if self.job.is_running():
            self.training.stop()
        self._update_buttons()

    def resume_current(self) -> None:
        """Resume the run picked in Runs (one of this machine's), else the current run where it ran,
        on its cards, from its latest complete checkpoint there."""
        selected = self.runs.selected_runs()
        if selected:
            self.resume_run(selected[0])
        elif self.job.folder:
            self._launch(JobConfig(), self.job.placement, after=self.job)
        else:
            self.status.setText("no run to resume: pick one in Runs")

    def resume_run(self, run: Run) -> Run | None:
        try:
            job = run.user_job()
        except JobConfigError as exc:
            self.status.setText(str(exc))
            return None
        checkpoint = own_checkpoint(run)
        if checkpoint is None:
            self.status.setText(f"{run.name} has no complete checkpoint of its own to resume from")
            return None
        # Its own checkpoint, in its own output folder: never a later run's that shares the folder.
        job.resume_from_checkpoint = str(checkpoint)
        job.training_args["output_dir"] = str(checkpoint.parent)
        started = self.start(job, resumed_from=run)
        if started is not None:
            self.status.setText(f"resuming {run.name} from {checkpoint.name}…")
        return started

    def _curve_upto(self, parent_folder: str) -> list[dict[str, Any]]:
        """The records of the run in ``parent_folder`` and of the runs it resumed, each up to where
        its child resumed (oldest first); [] for no folder."""
        chain: list[dict[str, Any]] = []
        seen: set[Path] = set()
        limit: int | None = None
        while parent_folder and Path(parent_folder) not in seen and len(seen) < 20:
            parent = Run(parent_folder)
            seen.add(parent.folder)
            checkpoint = parent.status().checkpoint
            records = parent.metrics()
            upto = limit
            if upto is None and checkpoint and Path(checkpoint).name.startswith("checkpoint-"):
                with contextlib.suppress(ValueError):
                    upto = int(Path(checkpoint).name.split("-", 1)[1])
            chain = [r for r in records if upto is None or int(r.get("step", 0)) <= upto] + chain
            limit = min((int(r.get("step", 0)) for r in records), default=None)
            parent_folder = parent.status().resumed_from
        return chain

    def _clear_run_view(self) -> None:
        if self.runs.scores_panel is not None:
            self.runs.scores_panel.hide()
        self.log.clear()
        self.log.set_progress("")
        self.chart.clear()
        self.chart.clear_overlays()
        self.progress.setValue(0)
        self.eta.setText("")
        self.eta.setToolTip("")
        self.meter_line.setText("")
        self.meter_line.setToolTip("")
        self.meter_line.setVisible(False)
        self.meter_strip.clear()

    def _rates(self) -> meter_work.Rates:
        p = self.job.progress
        return meter_work.rates(self.job.records, max_steps=p.max_steps, start_step=p.start_step)

    def _show_progress(self) -> None:
        p = self.job.progress
        self.progress.setValue(int(p.fraction * 100))
        last = self.job.records[-1] if self.job.records else {}
        loss = last.get("loss")
        if p.max_steps:
            # The ETA from the steps after warm-up only: the first steps compile graphs (on Gaudi
            # seconds to minutes each) and would make every ETA of a long run far too long.
            rates = self._rates()
            eta = (metrics_mod.format_duration(rates.eta_s) if self.job.is_running() and rates.eta_s
                   is not None else "–")
            self.eta.setText(f"step {p.step}/{p.max_steps}  ETA {eta}"
                             + (f"  loss {loss:.4f}" if isinstance(loss, (int, float)) else ""))
            self.eta.setToolTip(self._eta_tip(rates))

    @staticmethod
    def _eta_tip(rates: meter_work.Rates) -> str:
        first = f"the first {rates.warmup_steps} step{'' if rates.warmup_steps == 1 else 's'}"
        if rates.steady:
            return (f"ETA and rates from the steps after warm-up only (step {rates.from_step} on): "
                    f"{first} (graph compilation, warm-up) are left out of the rate")
        return (f"no ETA yet: it comes from the steps after warm-up only; {first} (graph compilation, "
                "warm-up) are left out of the rate")

    def _show_live_meter(self) -> None:
        """The pace while the run trains: steps/s with samples/s and tokens/s where the metrics have
        them (after warm-up once there are steps enough), and the ranks' true device memory."""
        rates = self._rates()
        parts = [meter_words.rates_text(rates)] if meter_words.rates_text(rates) else []
        if parts and not rates.steady:
            parts[0] += " (so far, warm-up included)"
        peak, limit = meter_work.true_memory_peak(self.job.records)
        if peak is not None:
            parts.append(f"true device memory peak {meter_words.memory_text(peak)}"
                         + (f" of {meter_words.memory_text(limit)}" if limit else ""))
        self.meter_line.setText(" · ".join(parts))
        self.meter_line.setToolTip(self._eta_tip(rates))
        self.meter_line.setVisible(bool(parts))
        job = self.job
        # A run here or on one host: its agent reads its meter (several hosts, Slurm: each part's meter
        # is summed once the job ended, in the meter line).
        if job.is_running() and job.name and job.kind in ("local", "host"):
            local = job.kind == "local"
            self.meter_strip.follow(job.name, host="" if local else job.host.name,
                                    runs_dir=str(job.store.root) if local else "")

    def _show_meter(self, run: Run) -> None:
        """What the ended run cost (its meter-summary.json), under its status; hidden for a run that
        has no meter summary (an older run, or one whose supervisor did not finish)."""
        from gaudi_gui.core import hpu_metrics
        summary = meter_files.read_summary(run.folder)
        # A Gaudi run's compile meter: this machine's or a host's folder, or each Slurm node's.
        gaudi = ((run.folder / hpu_metrics.FOLDER_NAME).is_dir()
                 or (run.folder / meter_files.NODES_DIR).is_dir())
        events = run.events() if summary is not None or gaudi else []
        self.meter_strip.stop()
        self.meter_strip.show_ended(run, events)
        compiled = meter_files.run_compile(run.folder, summary, events)
        if summary is None and compiled is None:
            self.meter_line.setVisible(False)
            return
        records = [r for r in (metrics_mod.metric_record(e) for e in events) if r is not None]
        peak, _limit = meter_work.true_memory_peak(records)
        if summary is not None:
            text = meter_words.meter_line(summary, true_peak_mib=peak, compiled=compiled)
        else:
            text = meter_words.compile_text(compiled)
        tip = [meter_words.describe(summary)] if summary is not None else []
        if peak is not None:
            tip.append(f"true device memory: the ranks' own allocator peak "
                       f"({meter_words.memory_text(peak)}); hl-smi's figure is the allocator's whole pool")
        if compiled is not None:
            tip.append("compile meter: " + hpu_metrics.describe(compiled))
            ops = meter_words.fallback_ops(compiled)
            tip.append("CPU-fallback ops: " + (", ".join(ops) if ops else "none"))
        self.meter_line.setText(redact(text))
        self.meter_line.setToolTip(redact("\n".join(tip)))
        self.meter_line.setVisible(True)

    def _on_metrics(self, record: dict) -> None:
        # Stamp live records with the wall time they arrived, to line card usage up with steps.
        self.chart.add_record({**record, "time": time.time()})
        if not self.job.is_remote:  # this machine's cards are not the host's
            self._update_device_usage()
        self._show_progress()
        self._show_live_meter()

    def _on_event(self, event: dict) -> None:
        if event.get("type") == EventType.TRAINING_STARTED:
            self._show_progress()

    def _on_summary(self, text: str) -> None:
        self.status.setText(text)

    def _on_state(self, state: str) -> None:
        self.job_state_changed.emit(state)
        self._update_buttons()

    def _on_finished(self, code: int, state: str, tail: list) -> None:
        job = self.job
        self.status.setText(job.summary or state)
        if state == "finished":
            self.progress.setValue(100)
        self._show_progress()
        if job.run is not None:  # a run elsewhere keeps its meter there (`gaudi-gui runs show`)
            self._show_meter(job.run)
        else:
            self.meter_line.setVisible(False)
        whole = job.job_meter()
        if whole is not None:  # several hosts: each part's meter, sent with its end, summed
            self.meter_line.setText(redact(meter_words.combined_line(whole)))
            self.meter_line.setToolTip(redact("\n".join(f"{p['name']}: {meter_words.short(p)}"
                                                         for p in whole["parts"])))
            self.meter_line.setVisible(True)
            if whole.get("compile_warning") and not self.meter_strip.warning.text():
                self.meter_strip.show_warning(whole["compile_warning"])  # another host's, named
        self.log.flush()
        self.log.set_progress("")
        self.runs.refresh()
        self._update_buttons()

    def _update_buttons(self) -> None:
        running = self.job.is_running()
        checking = self._gate_job is not None
        self.btn["Start"].setEnabled(not running and not checking)
        self.btn["Start"].setText("Checking cards…" if checking else "Start")
        self.btn["Stop"].setEnabled(running)
        self.btn["Stop"].setText("Kill now" if self.job.stopping else "Stop")
        stop_tip = "SIGKILL the run's processes now: no checkpoint" if self.job.stopping \
            else "save a checkpoint at the end of the current step, then end"
        self.btn["Stop"].setToolTip(with_keys(stop_tip, STOP_KEYS))
        self.btn["Resume"].setEnabled(not running)

    # -- history ----------------------------------------------------------------------------------

    @staticmethod
    def _clean_log(lines: list[str]) -> list[str]:
        # Logs of earlier versions carry raw protocol lines; none of them is for a person.
        return [redact(line) for line in lines if not line.lstrip().startswith("@gaudi-gui {")]

    def reopen(self, run: Run) -> None:
        self._clear_run_view()
        self.chart.set_records(self._curve_upto(run.status().resumed_from) + run.metrics())
        self.log.append_lines(self._clean_log(run.log_tail(5000)))
        self.log.flush()
        st = run.reconcile()
        self.status.setText(f"{run.name}: {st.summary or st.state}" + (f" ({st.error})" if st.error and
                                                                       st.error not in st.summary else ""))
        if st.max_steps:
            self.progress.setValue(int(min(1.0, st.step / st.max_steps) * 100))
            self.eta.setText(f"step {st.step}/{st.max_steps}")
        self._show_meter(run)
        self.views.setCurrentWidget(self.live)

    def clone(self, run: Run) -> None:
        try:
            self.form.set_job(self.store.clone(run))
            self._cards_nproc = None
        except JobConfigError as exc:
            self.status.setText(str(exc))
            return
        self.update_preview()
        self.status.setText(f"form filled from {run.name}")

    def align(self, run: Run) -> None:
        """"Align with preferences…": the form gets a DPO job that starts from this finished SFT run's
        final model or LoRA adapter (core.jobconfig.align_job)."""
        from gaudi_gui.core.jobconfig import align_job
        from gaudi_gui.core.sft import is_adapter_dir, runner_target
        try:
            sft_job = run.user_job()
        except JobConfigError as exc:
            self.status.setText(str(exc))
            return
        target = runner_target(run.output_dir()) if run.status().state == "finished" else None
        if sft_job.objective != "sft" or target is None:
            self.status.setText(f"Align with preferences starts from a finished SFT run with a saved model: "
                                f"{run.name} is {'not SFT' if sft_job.objective != 'sft' else 'not one'}")
            return
        schema = self.form.full_schema
        job = align_job(sft_job, str(target), adapter=is_adapter_dir(target),
                        sft_only=schema.sft_only if schema is not None else ())
        self.form.set_job(job)
        self._cards_nproc = None
        self.update_preview()
        what = "adapter" if is_adapter_dir(target) else "model"
        self.status.setText(f"form filled: DPO from {run.name}'s {what} ({target.name}/)"
                            + ("" if job.dataset.source else "; choose a preference dataset (prompt, "
                               "chosen, rejected)"))

    def compare(self, runs: list[Run]) -> None:
        """Compare: each run's loss, learning rate and its own cards' utilization (its meter), and the
        preference runs' rewards beside them (LossChart.rewards)."""
        self._clear_run_view()
        self.chart.compare([ComparedRun(run.name, run.metrics(), meter_utilization(run.folder))
                            for run in runs])
        self.views.setCurrentWidget(self.live)

    def _load_in_runner(self, run: Run) -> None:
        from gaudi_gui.core.sft import runner_target
        # final/, merged/, else a LoRA adapter/ (the runner loads it over its base, unmerged).
        target = runner_target(run.output_dir()) or run.latest_checkpoint()
        if target is None:
            self.status.setText(f"{run.name} has no saved model yet")
            return
        self.load_in_runner_requested.emit(str(target))

    def _update_device_usage(self) -> None:
        """Card utilization of the cards this run uses (all cards when none is checked; the host when
        the run is on the CPU, cards or not), from the Devices tab's poller history, over the run's
        time so far."""
        span = self.chart.time_range()
        store = self.services.poller.history_store
        if span is None:
            return
        selected = set(self.services.selection.selected)
        series = []
        keys: list[str] = store.keys()
        for key in keys:
            accelerator = not key.startswith("host")
            # Where the run really is: a CPU run beside idle (or busy) Gaudi cards plots the CPU.
            on_cards = self.device != "cpu" and self.services.selection.kind != "cpu"
            if accelerator != on_cards:
                continue
            if selected and key.startswith("hpu:m") and int(key[5:]) not in selected:
                continue
            t, v = store.series(key, "utilization", since=span[0] - 1)
            series.append((store.label(key), t, v))
        self.chart.set_device_series(series)

    def shutdown(self) -> None:
        """The view's own timers and helper children; the runs belong to the training service."""
        if self._draft_timer.isActive():
            self._draft_timer.stop()
            self._save_draft()
        self.log.shutdown()
        # Its meter subscription ends with the view (a run left running goes on; a new window follows it).
        self.meter_strip.stop()
        with contextlib.suppress(RuntimeError, TypeError):
            self.hosts.address_resolved.disconnect(self._on_resolved)
            self.hosts.changed.disconnect(self.placement.refresh_hosts)
        if self.services.preflight is not None:
            self.services.preflight.cancel("training")
        for signal, slot in ((self.schema_loader.schema_loaded, self._on_schema),
                             (self.schema_loader.schema_failed, self._on_schema_failed),
                             (self.schema_loader.validated, self._on_validated)):
            with contextlib.suppress(RuntimeError, TypeError):
                signal.disconnect(slot)
        self.schema_loader.shutdown()
        self.form.shutdown()
        self.runs.shutdown()

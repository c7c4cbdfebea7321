"""The Training tab: the job form, command preview, Start/Stop/Resume, live log and curves, history."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QGuiApplication
from PySide6.QtWidgets import (
    QFileDialog,
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

from gaudi_gui.core import launch as launch_mod
from gaudi_gui.core import metrics as metrics_mod
from gaudi_gui.core import paths
from gaudi_gui.core.jobconfig import JobConfig, JobConfigError
from gaudi_gui.core.runstore import Run, RunStore
from gaudi_gui.core.training_args import Schema, hints, latest_cached
from gaudi_gui.services.context import AppServices
from gaudi_gui.services.training_job import SchemaLoader, TrainingJob
from gaudi_gui.ui.log_view import LogView
from gaudi_gui.ui.loss_chart import LossChart
from gaudi_gui.ui.training_form import TrainingForm
from gaudi_gui.ui.training_runs import RunsTable


class TrainingTab(QWidget):
    #: The user wants a trained model opened in the Model runner: carries its folder.
    load_in_runner_requested = Signal(str)
    #: A run's state changed (for the window's status bar): carries the state.
    job_state_changed = Signal(str)

    def __init__(self, services: AppServices, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.services = services
        runs_dir = services.settings.get("training/runs_dir")
        self.store = RunStore(runs_dir or None)
        self.job = self._new_job()
        self.attached: list[TrainingJob] = []
        self.schema_loader = SchemaLoader(self)
        self.schema_loader.schema_loaded.connect(self._on_schema)
        self.schema_loader.schema_failed.connect(self._on_schema_failed)
        self.schema_loader.validated.connect(self._on_validated)

        self.form = TrainingForm(self)
        scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setWidget(self.form)

        self.command = QPlainTextEdit(self)
        self.command.setReadOnly(True)
        self.command.setMaximumHeight(90)
        self.command.setToolTip("exactly what Start runs: environment variables, then the argv")
        buttons = QHBoxLayout()
        self.btn: dict[str, QPushButton] = {}
        for name, handler in (("Copy command", self.copy_command), ("Validate", self.validate),
                              ("Save job…", self.save_job_dialog), ("Load job…", self.load_job_dialog),
                              ("Start", self.start), ("Stop", self.stop), ("Resume", self.resume_current)):
            b = QPushButton(name, self)
            b.clicked.connect(handler)
            buttons.addWidget(b)
            self.btn[name] = b
        self.btn["Start"].setDefault(True)
        self.status = QLabel("idle", self)
        self.status.setWordWrap(True)
        self.status.setSizePolicy(QSizePolicy.Policy.Ignored, QSizePolicy.Policy.Preferred)
        self.progress = QProgressBar(self)
        self.progress.setFormat("%p%")
        self.eta = QLabel("", self)
        prow = QHBoxLayout()
        prow.addWidget(self.progress, 1)
        prow.addWidget(self.eta)

        self.chart = LossChart(self)
        self.log = LogView(self)
        self.runs = RunsTable(self.store, self)
        self.views = QTabWidget(self)
        # Curves and log together: the log explains what the curve shows (a stall, a warning).
        live = QSplitter(Qt.Orientation.Vertical, self)
        live.addWidget(self.chart)
        live.addWidget(self.log)
        live.setStretchFactor(0, 3)
        live.setStretchFactor(1, 2)
        self.live = live
        self.views.addTab(live, "Run")
        self.views.addTab(self.runs, "Runs")

        right = QWidget(self)
        rl = QVBoxLayout(right)
        rl.setContentsMargins(0, 0, 0, 0)
        rl.addWidget(QLabel("Command", self))
        rl.addWidget(self.command)
        rl.addLayout(buttons)
        rl.addWidget(self.status)
        rl.addLayout(prow)
        rl.addWidget(self.views, 1)
        splitter = QSplitter(Qt.Orientation.Horizontal, self)
        splitter.addWidget(scroll)
        splitter.addWidget(right)
        splitter.setStretchFactor(0, 2)
        splitter.setStretchFactor(1, 3)
        QVBoxLayout(self).addWidget(splitter)

        self.form.changed.connect(self.update_preview)
        self.runs.reopen_requested.connect(self.reopen)
        self.runs.clone_requested.connect(self.clone)
        self.runs.compare_requested.connect(self.compare)
        self.runs.resume_requested.connect(self.resume_run)
        self.runs.load_in_runner_requested.connect(self._load_in_runner)

        # Start from the last job, with the card count of the Devices tab as the process count.
        last = services.settings.get("training/last_job")
        job = None
        if last:
            with contextlib.suppress(JobConfigError):
                job = JobConfig.from_dict(last)
        if job is None:
            job = JobConfig(training_args={"output_dir": str(paths.data_dir() / "outputs" / "demo"),
                                           "max_steps": 20, "per_device_train_batch_size": 2,
                                           "logging_steps": 1, "save_steps": 10})
            job.launch.num_processes = max(1, services.selection.card_count())
        self.form.set_job(job)
        cached = latest_cached()
        if cached is not None:
            self.form.set_schema(cached)
        probed = getattr(services.environment, "result", None)
        version = str(probed.get("transformers", "") or "") if isinstance(probed, dict) else ""
        self.schema_loader.load(version)
        self.update_preview()
        self._reattach()
        self._update_buttons()

    # -- helpers ----------------------------------------------------------------------------------

    def _new_job(self) -> TrainingJob:
        job = TrainingJob(self.store, stop_grace_s=float(self.services.settings.get("training/stop_grace_s")),
                          parent=self)
        job.log_line_received.connect(self.log.append_line if hasattr(self, "log") else self._late_log)
        return job

    def _late_log(self, line: str) -> None:
        self.log.append_line(line)

    def _wire(self, job: TrainingJob) -> None:
        job.progress_line.connect(self.log.set_progress)
        job.metrics_received.connect(self._on_metrics)
        job.event_received.connect(self._on_event)
        job.status_changed.connect(self._on_state)
        job.finished.connect(self._on_finished)

    @property
    def device(self) -> str:
        kind = getattr(self.services.environment, "device", None)
        return kind if kind in ("cpu", "cuda", "hpu") else "cpu"

    def current_job(self) -> tuple[JobConfig, list[tuple[str, str]]]:
        job, errors = self.form.job()
        errors = errors + job.validate()
        if self.form.schema is not None:
            errors += [(f"training_args.{f}", m) for f, m in self.form.schema.check(job.training_args)]
        return job, errors

    def update_preview(self) -> None:
        job, errors = self.current_job()
        preview = launch_mod.build(job, self.store.root / "<run>", device=self.device,
                                   device_env=self.services.selection.env(), port=29500)
        self.command.setPlainText(preview.shell_command())
        n = job.launch.num_processes * job.launch.num_machines
        self.form.set_hints(hints(self.device, launch_mod.worker_training_args(job, self.device)
                                  if self.device != "cpu" else job.training_args, n))
        self.form.show_errors(errors)
        self._preview = preview

    def copy_command(self) -> None:
        QGuiApplication.clipboard().setText(self.command.toPlainText())
        self.status.setText("command copied to the clipboard")

    # -- schema / validation ----------------------------------------------------------------------

    def _on_schema(self, schema: Schema) -> None:
        if self.form.schema is None or self.form.schema.to_dict() != schema.to_dict():
            self.form.set_schema(schema)
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
        self.schema_loader.validate(launch_mod.worker_training_args(job, self.device))

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
        self.form.set_job(job)
        self.update_preview()
        self.status.setText(f"loaded {path}")
        return True

    def save_job_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Save job", "job.json", "Job (*.json)")
        if path:
            self.save_job(path)

    def load_job_dialog(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Load job", "", "Job (*.json)")
        if path:
            self.load_job(path)

    # -- running ----------------------------------------------------------------------------------

    def start(self, job: JobConfig | None = None) -> Run | None:
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
        self.services.settings.set("training/last_job", job.to_dict())
        self.job = self._new_job()
        self._wire(self.job)
        self.log.clear()
        self.chart.clear()
        self.progress.setValue(0)
        self.eta.setText("")
        try:
            run = self.job.start(job, device=self.device, device_env=self.services.selection.env())
        except (ValueError, OSError) as exc:
            self.status.setText(f"cannot start: {exc}")
            return None
        self.services.selection.claim(f"training {run.name}")
        self.status.setText(f"starting {run.name}…")
        self.views.setCurrentWidget(self.live)
        self.runs.refresh()
        self._update_buttons()
        return run

    def stop(self) -> None:
        if self.job.is_running():
            self.job.stop()
            self.status.setText("stopping: checkpoint at the next step, then the processes end…")
        self._update_buttons()

    def resume_current(self) -> None:
        runs = self.runs.selected_runs() or ([self.job.run] if self.job.run else [])
        if runs:
            self.resume_run(runs[0])

    def resume_run(self, run: Run) -> Run | None:
        try:
            job = run.job()
        except JobConfigError as exc:
            self.status.setText(str(exc))
            return None
        if run.latest_checkpoint() is None:
            self.status.setText(f"{run.name} has no checkpoint to resume from")
            return None
        job.resume_from_checkpoint = "latest"
        return self.start(job)

    def _on_metrics(self, record: dict) -> None:
        # Stamp live records with the wall time they arrived, to line card usage up with steps.
        self.chart.add_record({**record, "time": time.time()})
        self._update_device_usage()
        p = self.job.progress
        self.progress.setValue(int(p.fraction * 100))
        loss = record.get("loss")
        self.eta.setText(f"step {p.step}/{p.max_steps}  ETA {metrics_mod.format_duration(p.eta)}"
                         + (f"  loss {loss:.4f}" if isinstance(loss, (int, float)) else ""))

    def _on_event(self, event: dict) -> None:
        kind = event.get("type")
        if kind == "phase":
            self.status.setText(str(event.get("message") or event.get("phase")))
        elif kind == "training_started":
            self.status.setText(f"training: {event.get('max_steps')} steps on "
                                f"{event.get('world_size')} process(es)")
        elif kind == "checkpoint_saved":
            self.status.setText(f"checkpoint saved: {event.get('path')}")
        elif kind == "error":
            self.status.setText(f"error ({event.get('kind')}): {event.get('message')}")

    def _on_state(self, state: str) -> None:
        self.job_state_changed.emit(state)
        self._update_buttons()

    def _on_finished(self, code: int, state: str, tail: list) -> None:
        sender = self.sender()
        job = sender if isinstance(sender, TrainingJob) else self.job
        if job.run is not None:
            self.services.selection.release(f"training {job.run.name}")
        if state == "finished":
            loss = metrics_mod.final_loss(job.records)
            self.status.setText(f"finished: final loss {loss:.4f}" if loss is not None else "finished")
            self.progress.setValue(100)
        elif job.error:
            self.status.setText(f"failed ({job.error.get('kind')}): {job.error.get('message')}")
        else:
            last = "\n".join(str(t) for t in tail[-5:])
            self.status.setText(f"{state}: {job.run.status().exit_description if job.run else code}\n{last}")
        if job.leftover_pids:
            self.status.setText(self.status.text() + f"\n⚠ processes left: {job.leftover_pids}")
        self.log.flush()
        self.log.set_progress("")
        self.runs.refresh()
        self._update_buttons()

    def _update_buttons(self) -> None:
        running = self.job.is_running()
        self.btn["Start"].setEnabled(not running)
        self.btn["Stop"].setEnabled(running)
        self.btn["Resume"].setEnabled(not running)

    # -- history ----------------------------------------------------------------------------------

    def reopen(self, run: Run) -> None:
        self.chart.set_records(run.metrics())
        self.log.clear()
        self.log.append_lines(run.log_tail(5000))
        self.log.flush()
        st = run.status()
        self.status.setText(f"{run.name}: {st.state}" + (f" ({st.error})" if st.error else ""))
        self.views.setCurrentWidget(self.live)

    def clone(self, run: Run) -> None:
        try:
            self.form.set_job(self.store.clone(run))
        except JobConfigError as exc:
            self.status.setText(str(exc))
            return
        self.update_preview()
        self.status.setText(f"form filled from {run.name}")

    def compare(self, runs: list[Run]) -> None:
        self.chart.clear_overlays()
        for run in runs:
            steps, losses = metrics_mod.series(run.metrics(), "loss")
            self.chart.add_overlay(run.name, steps, losses)
        self.views.setCurrentWidget(self.live)

    def _load_in_runner(self, run: Run) -> None:
        out = run.output_dir()
        final = out / "final" if out else None
        target = final if final and final.is_dir() else run.latest_checkpoint()
        if target is None:
            self.status.setText(f"{run.name} has no saved model yet")
            return
        self.load_in_runner_requested.emit(str(target))

    def _update_device_usage(self) -> None:
        """Card utilization of the cards this run uses (all cards when none is checked; the host on
        a CPU machine), from the Devices tab's poller history, over the run's time so far."""
        span = self.chart.time_range()
        store = self.services.poller.history_store
        if span is None:
            return
        selected = set(self.services.selection.selected)
        series = []
        keys: list[str] = store.keys()
        for key in keys:
            accelerator = not key.startswith("host")
            if self.services.selection.kind == "cpu" and accelerator:
                continue
            if self.services.selection.kind != "cpu" and not accelerator:
                continue
            if selected and key.startswith("hpu:m") and int(key[5:]) not in selected:
                continue
            t, v = store.series(key, "utilization", since=span[0] - 1)
            series.append((store.label(key), t, v))
        self.chart.set_device_series(series)

    # -- detached runs ----------------------------------------------------------------------------

    def _reattach(self) -> None:
        remaining = []
        for folder in self.services.settings.get("training/detached_runs"):
            run = Run(folder)
            if not Path(folder).is_dir():
                continue
            job = self._new_job()
            self._wire(job)
            if job.attach(run):
                self.job = job
                self.attached.append(job)
                remaining.append(folder)
                self.chart.set_records(job.records)
                self.status.setText(f"re-attached to {run.name} (still running)")
        self.services.settings.set("training/detached_runs", remaining)

    # -- JobOwner ---------------------------------------------------------------------------------

    def _running(self) -> list[TrainingJob]:
        jobs = [self.job, *self.attached]
        return [j for j in dict.fromkeys(jobs) if j.is_running()]

    def active_jobs(self) -> list[str]:
        return [j.describe() for j in self._running()]

    def stop_jobs(self) -> None:
        for job in self._running():
            job.stop()

    def detach_jobs(self) -> list[str]:
        running = [j for j in self._running() if j.run is not None]
        folders = [str(j.run.folder) for j in running if j.run is not None]
        for job in running:
            job.detach()
        self.services.settings.set("training/detached_runs", folders)
        return folders

    def shutdown(self) -> None:
        self.log.shutdown()
        self.schema_loader.shutdown()
        for job in {self.job, *self.attached}:
            job.shutdown()

    def _debug_state(self) -> dict[str, Any]:
        return {"state": self.job.state, "records": len(self.job.records)}

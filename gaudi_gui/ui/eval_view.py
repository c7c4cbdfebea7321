"""Evaluate a run: base vs tuned, side by side, and the scores. Reached from Runs (Evaluate button).

The view binds only: it reads the form into a ``core.evaluation.EvalSpec`` and hands it to
``services.evaluation.EvaluationService`` (the agent runs ``gaudi-gui eval … --detach`` for it), and
shows what comes back. Reading a references file's first rows for the column pickers is the one thing it
does itself (a small file read, like the training form's dataset preview).
"""

from __future__ import annotations

import html
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QKeyEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core import evaluation as ev
from gaudi_gui.core import meter_account, meter_files, meter_words, paths, textclean
from gaudi_gui.core.metrics import format_duration
from gaudi_gui.core.placement import Placement
from gaudi_gui.core.remote import Host
from gaudi_gui.core.runstore import Run
from gaudi_gui.services.downloads import ModelPlaces
from gaudi_gui.services.evaluation import EvaluationService
from gaudi_gui.services.queue import JobQueue
from gaudi_gui.ui.fp8_field import Fp8Field
from gaudi_gui.ui.model_field import ModelCacheState
from gaudi_gui.ui.shortcuts import start_stop_keys

ANSWER_COLUMNS = ("prompt", "reference", "base", "tuned", "base TTFT s", "base tok/s", "tuned TTFT s",
                  "tuned tok/s")
SCORE_COLUMNS = ("score", "base", "tuned")


def _cell(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.4g}"
    return textclean.clean(str(value))


def fill_scores(table: QTableWidget, items: list[tuple[str, float | None, float | None]]) -> None:
    table.setRowCount(len(items))
    for row, (name, tuned, base) in enumerate(items):
        for col, text in enumerate((name, _cell(base), _cell(tuned))):
            item = QTableWidgetItem(text)
            if col:
                item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            table.setItem(row, col, item)
    table.resizeColumnsToContents()


def _table(columns: tuple[str, ...], parent: QWidget) -> QTableWidget:
    table = QTableWidget(0, len(columns), parent)
    table.setHorizontalHeaderLabels(list(columns))
    table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
    table.verticalHeader().setVisible(False)
    table.horizontalHeader().setStretchLastSection(True)
    return table


def _app_models(parent: QWidget | None) -> ModelPlaces | None:
    """The app's ``ModelPlaces``, from the first parent that holds the app's services (the main
    window), or None (the view then names no cache state)."""
    widget = parent
    while widget is not None:
        services = getattr(widget, "services", None)
        if services is not None and hasattr(services, "ensure_models"):
            return cast("ModelPlaces", services.ensure_models(services.settings.parent()))
        widget = widget.parentWidget()
    return None


def _download_handler(parent: QWidget | None) -> Callable[[str, str], None] | None:
    """The main window's ``download_model`` (the first parent that opens the Download dialog)."""
    widget = parent
    while widget is not None:
        download = getattr(widget, "download_model", None)
        if callable(download):
            return cast("Callable[[str, str], None]", download)
        widget = widget.parentWidget()
    return None


def _full_model(run: Run | None, target: ev.Target) -> str:
    """The full model of a run that FP8 quantizes (what Calibrate FP8… measured of it): its saved
    model, or the merged copy of its adapter; "" when it has neither."""
    if not target.adapter:
        return target.tuned_model
    out = run.output_dir() if run is not None else None
    merged = out / "merged" if out is not None else None
    return str(merged) if merged is not None and (merged / "config.json").is_file() else ""


class EvalView(QWidget):
    """One run's evaluation form, progress and results (a window of its own, opened from Runs)."""

    #: Download… beside the base model: (its Hub id, the chosen host's name); the main window (found
    #: through the parents) opens the Models tab's Download dialog with them.
    download_requested = Signal(str, str)

    def __init__(self, run: Run | None, service: EvaluationService | None = None,
                 parent: QWidget | None = None, *, hosts: Callable[[], list[Host]] | None = None,
                 queue: Callable[[], JobQueue] | None = None,
                 cards: Callable[[], tuple[int, ...]] | None = None,
                 models: ModelPlaces | None = None,
                 machine: Callable[[], dict[str, str]] | None = None) -> None:
        """``queue`` gives this machine's queue service (the Queue button; without it, no button);
        ``cards``, the cards a queued evaluation waits for (those ticked in Devices; none: the CPU);
        ``models``, the Hub caches' listings (the base model's state and Download…; by default the
        main window's, found through the parents); ``machine``, this machine as an FP8 calibration
        records it (``AppServices.machine``: the FP8 field checks a calibration against it)."""
        super().__init__(parent)
        self.run = run
        self._queue = queue
        self._cards = cards or tuple
        #: The saved hosts (the app's host list in memory, ``AppServices.hosts.saved``).
        self._hosts = hosts or (lambda: [])
        self.service = service or EvaluationService(self)
        #: The run's models as resolved (None: no run, or one that cannot be evaluated).
        self._target: ev.Target | None = None
        self.setWindowTitle(f"Evaluate {run.name}" if run else "Evaluate")
        self._rows: dict[tuple[str, int], int] = {}
        self.errors: dict[str, QLabel] = {}
        self.inputs: dict[str, QWidget] = {}

        self.models = QLabel(self)
        self.models.setWordWrap(True)
        self.models.setTextFormat(Qt.TextFormat.RichText)
        self.host = QComboBox(self)
        self.host.addItem("this machine", "local")
        for saved in self._hosts():
            self.host.addItem(saved.name, saved.name)
        self.prompts = QPlainTextEdit(self)
        self.prompts.setPlaceholderText("one prompt a line")
        self.prompts.setMaximumHeight(90)
        self.prompts_file = QLineEdit(self)
        self.prompts_file.setPlaceholderText("JSONL (strings or objects with the prompt column) or text")
        self.data = QLineEdit(self)
        self.data.setPlaceholderText("references JSONL: a prompt and a reference column")
        self.data.editingFinished.connect(self.load_preview)
        self.prompt_column = QComboBox(self)
        self.prompt_column.setEditable(True)
        self.reference_column = QComboBox(self)
        self.reference_column.setEditable(True)
        self.preview = _table((), self)
        self.preview.setMaximumHeight(110)
        self.metric_boxes: dict[str, QCheckBox] = {}
        metrics_row = QHBoxLayout()
        for name, label in (("exact_match", "exact match"), ("rouge", "ROUGE-L"), ("bleu", "BLEU"),
                            ("perplexity", "perplexity")):
            box = QCheckBox(label, self)
            box.setChecked(name != "perplexity")
            self.metric_boxes[name] = box
            metrics_row.addWidget(box)
        metrics_row.addStretch(1)
        metrics = QWidget(self)
        metrics.setLayout(metrics_row)
        metrics_row.setContentsMargins(0, 0, 0, 0)
        self.tasks = QLineEdit(self)
        self.tasks.setPlaceholderText("lm-eval tasks, comma-separated (offline: local or cached data)")
        self.include_path = QLineEdit(self)
        self.include_path.setPlaceholderText("a folder of local lm-eval task YAMLs")
        self.max_rows = QSpinBox(self)
        self.max_rows.setRange(0, 1_000_000)
        self.max_rows.setSpecialValueText("all")
        self.max_new_tokens = QSpinBox(self)
        self.max_new_tokens.setRange(1, ev.MAX_NEW_TOKENS_LIMIT)
        self.max_new_tokens.setValue(32)
        self.chat = QComboBox(self)
        for mode, label in (("auto", "as the run trained"), ("on", "always"), ("off", "never")):
            self.chat.addItem(label, mode)
        # FP8 (issue 39): the run's full model quantized with a calibration of it, against the same
        # model in bf16; the threshold is eval --fp8-max-rise (what fp8_cost warns past).
        #: The full model FP8 quantizes (the run's final/ or merged/; "" for an adapter alone).
        self._fp8_model = ""
        self.fp8 = Fp8Field(self, machine=machine)
        self.fp8_max_rise = QDoubleSpinBox(self)
        self.fp8_max_rise.setObjectName("fp8_max_rise")
        self.fp8_max_rise.setRange(0.0, 1000.0)
        self.fp8_max_rise.setDecimals(1)
        self.fp8_max_rise.setSuffix(" %")
        self.fp8_max_rise.setValue(ev.FP8_MAX_RISE_PCT)
        self.fp8_max_rise.setEnabled(False)
        self.fp8_max_rise.setToolTip("with a calibration and perplexity ticked: the scores warn when FP8 "
                                     "raises perplexity over bf16 by more than this")
        self.fp8.changed.connect(self._fp8_changed)

        # The base model (a Hub id) in the chosen place's cache, and Download… when it is not there.
        self.base_model = QLineEdit(self)
        self.base_model.setReadOnly(True)
        self.base_model.setToolTip("the model the run was trained from: loaded where the evaluation runs")
        self.download_button = QPushButton("Download…", self)
        self.model_cache = ModelCacheState(self.base_model, models or _app_models(parent),
                                           lambda: self._host_of(self.placement()), self,
                                           button=self.download_button, action="Start")
        self.model_cache.download_requested.connect(self.download_requested)
        handler = _download_handler(parent)
        if handler is not None:
            self.download_requested.connect(handler)
        else:  # a view on its own (no main window): nothing to open the dialog, so no button
            self.download_button.hide()
        self.host.currentIndexChanged.connect(lambda _index: self.model_cache.place_changed())
        self.host.currentIndexChanged.connect(lambda _index: self.fp8.set_local(self.placement().is_local))
        base_row = QHBoxLayout()
        base_row.setContentsMargins(0, 0, 0, 0)
        base_row.addWidget(self.base_model, 1)
        base_row.addWidget(self.download_button)

        form = QFormLayout()
        form.addRow("Models", self.models)
        form.addRow("Runs on", self.host)
        form.addRow("Base model", base_row)
        form.addRow("", self.model_cache)
        self._row(form, "Prompts", "prompts", self.prompts)
        self._row(form, "Prompts file", "prompts_file", self._with_browse(self.prompts_file))
        self._row(form, "References", "data", self._with_browse(self.data, self.load_preview))
        self._row(form, "Prompt column", "prompt_column", self.prompt_column)
        self._row(form, "Reference column", "reference_column", self.reference_column)
        form.addRow("", self.preview)
        self._row(form, "Metrics", "metrics", metrics)
        self._row(form, "lm-eval tasks", "tasks", self.tasks)
        self._row(form, "Include path", "include_path", self._with_browse(self.include_path, folder=True))
        self._row(form, "Max rows", "max_rows", self.max_rows)
        self._row(form, "Max new tokens", "max_new_tokens", self.max_new_tokens)
        self._row(form, "Chat template", "chat", self.chat)
        form.addRow("FP8 calibration", self.fp8)
        self.errors["fp8"], self.inputs["fp8"] = self.fp8.error, self.fp8
        rise_row = QWidget(self)
        rise = QHBoxLayout(rise_row)
        rise.setContentsMargins(0, 0, 0, 0)
        rise.addWidget(QLabel("warn when perplexity rises more than", rise_row))
        rise.addWidget(self.fp8_max_rise)
        rise.addStretch(1)
        self._row(form, "", "fp8_max_rise", rise_row)
        self.run_error = QLabel(self)
        self.run_error.setWordWrap(True)
        self.run_error.setStyleSheet("color: #b00020")
        self.run_error.hide()
        for field in ("run", "model", "base", "adapter"):
            self.errors[field] = self.run_error

        self.start_button = QPushButton("Start", self)
        self.stop_button = QPushButton("Stop", self)
        self.stop_button.setEnabled(False)
        self.start_button.clicked.connect(lambda _c=False: self.start())
        self.queue_button = QPushButton("Queue", self)
        self.queue_button.setToolTip("put this evaluation in this machine's queue: it starts by itself "
                                     "when its cards (those ticked in Devices) are free, window open or not")
        self.queue_button.setVisible(queue is not None)
        self.queue_button.clicked.connect(lambda _c=False: self.queue_current())
        self.stop_button.clicked.connect(lambda _c=False: self.service.stop())
        # Ctrl+Return starts and Ctrl+. stops (Esc closes the window, as in a dialog).
        self.shortcuts = start_stop_keys(self, self.start_button, self.stop_button)
        self.progress = QProgressBar(self)
        self.progress.setRange(0, 1)
        self.progress.setValue(0)
        self.eta = QLabel(self)
        self.status = QLabel(self)
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        controls = QHBoxLayout()
        controls.addWidget(self.start_button)
        controls.addWidget(self.queue_button)
        controls.addWidget(self.stop_button)
        controls.addWidget(self.progress, 1)
        controls.addWidget(self.eta)
        # The window's own way out (a window of its own has no tab to switch away from); an
        # evaluation under way goes on, and the main window's close still asks about it.
        self.close_button = QPushButton("Close", self)
        self.close_button.setToolTip("close this window (Esc); a running evaluation goes on")
        self.close_button.clicked.connect(lambda _c=False: self.close())
        controls.addWidget(self.close_button)

        self.answers = _table(ANSWER_COLUMNS, self)
        self.answers.setWordWrap(True)
        self.scores = _table(SCORE_COLUMNS, self)
        self.scores_note = QLabel(self)
        self.scores_note.setWordWrap(True)
        self.scores_note.hide()
        scores_box = QWidget(self)
        scores_column = QVBoxLayout(scores_box)
        scores_column.setContentsMargins(0, 0, 0, 0)
        scores_column.addWidget(self.scores_note)
        scores_column.addWidget(self.scores, 1)
        split = QSplitter(Qt.Orientation.Horizontal, self)
        split.addWidget(self.answers)
        split.addWidget(scores_box)
        split.setStretchFactor(0, 3)
        split.setStretchFactor(1, 1)

        top = QWidget(self)
        top.setLayout(form)
        scroll = QScrollArea(self)
        scroll.setWidgetResizable(True)
        scroll.setWidget(top)
        bottom = QWidget(self)
        lower = QVBoxLayout(bottom)
        lower.setContentsMargins(0, 0, 0, 0)
        lower.addWidget(self.run_error)
        lower.addLayout(controls)
        lower.addWidget(self.status)
        lower.addWidget(split, 1)
        # The form scrolls; the answers and scores keep at least half the window.
        halves = QSplitter(Qt.Orientation.Vertical, self)
        halves.addWidget(scroll)
        halves.addWidget(bottom)
        halves.setStretchFactor(0, 1)
        halves.setStretchFactor(1, 1)
        layout = QVBoxLayout(self)
        layout.addWidget(halves)

        self.service.started.connect(self._on_started)
        self.service.progress.connect(self._on_progress)
        self.service.phase.connect(self.status.setText)
        self.service.answer.connect(self._on_answer)
        self.service.result.connect(self._on_result)
        self.service.failed.connect(self._on_failed)
        self.service.finished.connect(self._on_finished)
        self._describe_models()
        self._offer_demo_prompts()
        self._show_latest()

    # -- form ----------------------------------------------------------------------------------------

    def _row(self, form: QFormLayout, label: str, field: str, widget: QWidget) -> None:
        box = QWidget(self)
        inner = QVBoxLayout(box)
        inner.setContentsMargins(0, 0, 0, 0)
        inner.setSpacing(1)
        inner.addWidget(widget)
        error = QLabel(box)
        error.setWordWrap(True)
        error.setStyleSheet("color: #b00020")
        error.hide()
        inner.addWidget(error)
        self.errors[field] = error
        self.inputs[field] = widget
        form.addRow(label, box)

    def _with_browse(self, edit: QLineEdit, then: Any = None, folder: bool = False) -> QWidget:
        box = QWidget(self)
        row = QHBoxLayout(box)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(edit, 1)
        button = QPushButton("Browse…", box)

        def browse() -> None:
            chosen = QFileDialog.getExistingDirectory(self, "Choose a folder") if folder else \
                QFileDialog.getOpenFileName(self, "Choose a file", "", "JSONL (*.jsonl *.json);;All (*)")[0]
            if chosen:
                edit.setText(chosen)
                if then is not None:
                    then()

        button.clicked.connect(lambda _c=False: browse())
        row.addWidget(button)
        return box

    def _describe_models(self) -> None:
        self.fp8.set_unavailable("no run, or a run that cannot be evaluated")  # until its model is known
        if self.run is None:
            self.models.setText("no run chosen")
            return
        try:
            target = ev.resolve(ev.EvalSpec(run=str(self.run.folder)))
        except ev.EvalInputError as exc:
            self.models.setText(f"<b>{html.escape(self.run.name)}</b>")
            self._show_error(exc.field, str(exc))
            self.start_button.setEnabled(False)
            return
        self.base_model.setText(target.base_model)
        self._target = target
        self._fp8_model = _full_model(self.run, target)
        self.fp8.set_model(self._fp8_model)
        self.fp8.set_unavailable("" if self._fp8_model else
                                 "FP8 quantizes a full model: this run saved an adapter only; merge it first "
                                 "(Merge and save in Runs), then calibrate the merged model")
        self._say_models()

    def _say_models(self) -> None:
        """Which two models are compared: the run's tuned and base, or with FP8 its full model in FP8
        against the same model in bf16."""
        target = self._target
        if target is None:
            return
        if self.fp8.value():
            name = html.escape(self._fp8_model)
            self.models.setText(f"tuned: <b>{name}</b> in FP8 ({html.escape(Path(self.fp8.value()).name)})"
                                f"<br>base: <b>{name}</b> in bf16")
            return
        tuned = f"{target.adapter} (adapter over {target.tuned_model}, unmerged)" if target.adapter \
            else target.tuned_model
        self.models.setText(f"tuned: <b>{html.escape(tuned)}</b><br>base: <b>"
                            f"{html.escape(target.base_model)}</b>")

    def _fp8_changed(self, folder: str) -> None:
        self.fp8_max_rise.setEnabled(bool(folder))
        self._say_models()

    def _offer_demo_prompts(self) -> None:
        """A run trained on the demo dataset gets the demo's questions as its prompts: what a person
        trying the demo would otherwise have to invent (and a sentence of the corpus the base model
        recites would show base and tuned alike)."""
        if self.run is None or self.prompts.toPlainText().strip():
            return
        try:
            demo = paths.is_demo(self.run.job().dataset.source)
            text = paths.demo_prompts_path().read_text(encoding="utf-8") if demo else ""
        except (OSError, ValueError, paths.DataFileError):
            return  # a run whose job cannot be read, or an incomplete install: no prompts offered
        self.prompts.setPlainText(text.strip())

    def load_preview(self) -> None:
        """The references file's columns in the pickers and its first rows in the preview."""
        self._clear_error("data")
        path = self.data.text().strip()
        if not path:
            return
        try:
            columns, rows = ev.preview(path, 5)
        except ev.EvalInputError as exc:
            self._show_error("data", str(exc))
            return
        guessed = ev.guess_columns(columns, rows)
        for combo, guess in ((self.prompt_column, guessed[0]), (self.reference_column, guessed[1])):
            current = combo.currentText()
            combo.clear()
            combo.addItems(columns)
            combo.setCurrentText(current if current in columns else guess)
        self.preview.setColumnCount(len(columns))
        self.preview.setHorizontalHeaderLabels(columns)
        self.preview.setRowCount(len(rows))
        for r, row in enumerate(rows):
            for c, col in enumerate(columns):
                self.preview.setItem(r, c, QTableWidgetItem(_cell(row.get(col, ""))[:200]))

    def spec(self) -> ev.EvalSpec:
        """The form as the command takes it; with an FP8 calibration, ``--model`` (the run's full model,
        what was calibrated) ``--fp8 RUN --fp8-max-rise PCT`` instead of ``--run``."""
        prompts = [p for p in self.prompts.toPlainText().splitlines() if p.strip()]
        calibration = self.fp8.value()
        chat = str(self.chat.currentData() or "auto")
        if calibration and chat == "auto":  # "as the run trained", said outright: --model has no run
            chat = "on" if self._target is not None and self._target.chat_kind else "off"
        which: dict[str, Any] = {"model": self._fp8_model, "fp8": calibration,
                                 "fp8_max_rise": self.fp8_max_rise.value()} if calibration else \
            {"run": str(self.run.folder) if self.run else ""}
        return ev.EvalSpec(
            **which, prompts=prompts,
            prompts_file=self.prompts_file.text().strip(), data=self.data.text().strip(),
            prompt_column=self.prompt_column.currentText().strip() or "prompt",
            reference_column=self.reference_column.currentText().strip() or "reference",
            metrics=[m for m, box in self.metric_boxes.items() if box.isChecked()],
            tasks=[t.strip() for t in self.tasks.text().split(",") if t.strip()],
            include_path=self.include_path.text().strip(), max_rows=self.max_rows.value(),
            max_new_tokens=self.max_new_tokens.value(), chat=chat)

    def placement(self) -> Placement:
        name = self.host.currentData()
        if not name or name == "local":
            return Placement.local()
        chosen = next((h for h in self._hosts() if h.name == name), None)
        return Placement.on_host(chosen or Host.parse(str(name)))

    @staticmethod
    def _host_of(place: Placement) -> Host:
        return place.hosts[0] if place.hosts else Host.local()

    def _show_error(self, field: str, message: str) -> None:
        label = self.errors.get(field) or self.run_error
        label.setText(message)
        label.show()

    def _clear_error(self, field: str) -> None:
        if field in self.errors:
            self.errors[field].hide()

    def _clear_errors(self) -> None:
        for label in self.errors.values():
            label.hide()

    # -- running -------------------------------------------------------------------------------------

    def _fp8_refused(self) -> bool:
        """The chosen calibration refused at its field (``core.fp8.refusal``'s one line, checked when it
        was chosen); whether it was: nothing starts then."""
        line = self.fp8.problem()
        if line:
            self._show_error("fp8", line)
            self.status.setText("⚠ fix the marked fields")
        return bool(line)

    def start(self) -> None:
        self._clear_errors()
        if self._fp8_refused():
            return
        problems = self.service.start(self.spec(), self.placement())
        for field, message in problems:
            self._show_error(field, message)
        if problems:
            self.status.setText("⚠ fix the marked fields")

    def queue_current(self) -> None:
        """Queue: this evaluation goes into this machine's queue (issue 29) as an eval job (the words
        ``gaudi-gui eval --detach`` would take) and starts by itself when its cards are free."""
        if self._queue is None:
            return
        self._clear_errors()
        if self._fp8_refused():
            return
        if not self.placement().is_local:
            self.status.setText("Queue puts an evaluation in this machine's queue; a host keeps its own: "
                                "gaudi-gui queue add --host DEST --kind eval -- …")
            return
        from gaudi_gui.core.queue import CardRequest
        spec = self.spec()
        problems = ev.validate(spec, catalogue=False)
        for field, message in problems:
            self._show_error(field, message)
        if problems:
            self.status.setText("⚠ fix the marked fields")
            return
        cards, place = CardRequest(ids=tuple(sorted(set(self._cards())))), self._queue()
        place.add_kind("eval", spec.cli_args(), cards, on_answer=place.shown(
            self.status.setText, cards, tail="; its results land in the run's folder and in Runs"))

    def _on_started(self) -> None:
        self.start_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.answers.setRowCount(0)
        self._rows.clear()
        self.progress.setRange(0, 0)  # busy until the first count
        self.eta.setText("")
        self.status.setText("starting…")

    def _on_progress(self, done: int, total: int, eta: float) -> None:
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(done)
        # The count is of items over both models (answers, references, perplexity texts, tasks; the
        # base model's, then the tuned one's), not of the file's rows.
        per_model = total // 2
        self.progress.setFormat(f"{done}/{total} items ({per_model} per model: base, then tuned)")
        self.eta.setText(f"ETA {format_duration(eta)}" if eta >= 0 else "")

    def _on_answer(self, message: dict[str, Any]) -> None:
        key = (str(message.get("source")), int(message.get("i") or 0))
        row = self._rows.get(key)
        if row is None:
            row = self.answers.rowCount()
            self.answers.insertRow(row)
            self._rows[key] = row
            self.answers.setItem(row, 0, QTableWidgetItem(_cell(message.get("prompt"))))
            self.answers.setItem(row, 1, QTableWidgetItem(_cell(message.get("reference", ""))))
        name = message.get("model")
        base_col = 2 if name == "base" else 3
        timing_col = 4 if name == "base" else 6
        text = _cell(message.get("text"))
        # Line breaks are shown (an answer of only newlines is not an empty cell); the tooltip has it all.
        answer = QTableWidgetItem(text.replace("\n", "↵") or "∅")
        answer.setToolTip(text)
        self.answers.setItem(row, base_col, answer)
        for offset, key_name in enumerate(("ttft_s", "tokens_per_s")):
            item = QTableWidgetItem(_cell(message.get(key_name)))
            item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            self.answers.setItem(row, timing_col + offset, item)

    def _on_result(self, result: dict[str, Any]) -> None:
        self._fill_scores(result)
        self.status.setText(f"results saved in {result.get('path', '')}")

    def _fill_scores(self, result: dict[str, Any]) -> None:
        """The scores, or in the table's place why there are none (an empty table said nothing)."""
        fill_scores(self.scores, ev.score_items(result))
        # What FP8 cost (an FP8 comparison: this window's or the Calibrate window's Evaluate in FP8)
        # beside the scores, past the threshold the evaluation was asked with (the field's otherwise).
        asked = (result.get("spec") or {}).get("fp8_max_rise")
        threshold = float(asked) if isinstance(asked, (int, float)) and not isinstance(asked, bool) \
            else self.fp8_max_rise.value()
        why = "\n".join(t for t in (ev.no_scores_reason(result), ev.fp8_cost(result, threshold)) if t)
        self.scores_note.setText(why)
        self.scores_note.setVisible(bool(why))

    def _on_failed(self, field: str, message: str) -> None:
        if field:
            self._show_error(field, message)
        self.status.setText(f"⚠ {message}")

    def _on_finished(self, ok: bool, stopped: bool) -> None:
        self.start_button.setEnabled(True)
        self.stop_button.setEnabled(False)
        if self.progress.maximum() == 0:
            self.progress.setRange(0, 1)
        self.eta.setText("")
        if stopped and not ok:  # a Stop that came after the results were written leaves them shown
            self.status.setText("stopped: nothing was saved")

    def _show_latest(self) -> None:
        if self.run is not None:
            latest = ev.latest_result(self.run)
            if latest:
                self._fill_scores(latest)
                self.status.setText(f"latest results: {Path(str(latest.get('path', ''))).name}")

    def keyPressEvent(self, event: QKeyEvent) -> None:
        """Esc closes the window, as in a dialog (a field that uses Esc itself keeps it)."""
        if event.key() == Qt.Key.Key_Escape:
            self.close()
            return
        super().keyPressEvent(event)

    def shutdown(self) -> None:
        self.service.shutdown()

    def closeEvent(self, event: Any) -> None:
        self.service.stop()
        super().closeEvent(event)


#: The run meter's rows under the scores (core.meter's summary of each compared run).
METER_ROWS = ("card-hours", "energy", "mean power", "utilization", "throttled", "tokens/s", "wall time")


def meter_cells(summary: dict[str, Any] | None) -> dict[str, tuple[str, str]]:
    """The meter rows of one run: row name -> (text, tooltip); "–" without a summary, and the
    energy "not measured" (never 0) where nobody measured it."""
    if not summary:
        why = "no meter summary (an older run, or one that did not finish)"
        return {name: ("–", why) for name in METER_ROWS}
    mean, util, wall = (summary.get(k) for k in ("power_mean_w", "utilization_mean", "wall_s"))
    measured = meter_account.energy_measured(summary)
    return {"card-hours": (meter_words.card_hours_text(summary) or "–", "cards x wall time / 3600"),
            "energy": (meter_words.kwh_text(summary),
                       meter_words.energy_text(summary) if measured
                       else meter_words.not_measured_why(summary)),
            "mean power": (f"{mean:.0f} W" if isinstance(mean, (int, float)) and measured else "–", ""),
            "utilization": (f"{util:.0f} %" if isinstance(util, (int, float)) else "–", ""),
            "throttled": _throttled_cell(summary.get("throttle")),
            "tokens/s": _pace_cell(summary),
            "wall time": (format_duration(wall) if isinstance(wall, (int, float)) else "–", "")}


def _pace_cell(summary: dict[str, Any]) -> tuple[str, str]:
    """The run's steady tokens/s (the steps after warm-up), its steps/s and samples/s in the tooltip."""
    pace = summary.get("rates")
    tokens = pace.get("tokens_per_s") if isinstance(pace, dict) else None
    text = f"{tokens:.0f}" if isinstance(tokens, (int, float)) and tokens > 0 else "–"
    return text, meter_words.rates_of(summary) or "no pace recorded (a run without logged steps, or older)"


def _throttled_cell(throttle: dict[str, Any] | None) -> tuple[str, str]:
    """'12 s (40 %)' with the cards and reasons in the tooltip; '–' for a run without reads."""
    seconds = (throttle or {}).get("throttled_s")
    if not throttle or not isinstance(seconds, (int, float)):
        return "–", meter_words.throttle_text(throttle) or "no throttle reads (not a Gaudi run)"
    share = throttle.get("fraction")
    text = f"{seconds:.0f} s"
    if isinstance(share, (int, float)) and seconds > 0:
        text += f" ({100 * share:.0f} %)"
    return text, meter_words.throttle_text(throttle)


class ScoresPanel(QWidget):
    """The latest scores of compared runs, one column per run (Compare, beside the loss curves), and
    under them what each run cost (its meter: card-hours, energy, mean power, utilization)."""

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Scores of the compared runs")
        self.table = _table(("score / meter",), self)
        self.note = QLabel(self)
        self.note.setWordWrap(True)
        layout = QVBoxLayout(self)
        layout.addWidget(self.table)
        layout.addWidget(self.note)

    def show_runs(self, runs: list[Run], meters: dict[Path, dict[str, Any] | None] | None = None) -> bool:
        """Fill the table: the scores of the evaluated runs, then the meter of every run that has one
        (``meters``: the summaries by run folder where the caller has them, else read here); False
        when none of the runs was evaluated or metered."""
        results = [(run, ev.latest_result(run)) for run in runs]
        summaries = {run.folder: (meters[run.folder] if meters is not None and run.folder in meters
                                  else meter_files.read_summary(run.folder)) for run in runs}
        found = [(run, r) for run, r in results if r or summaries[run.folder]]
        names: list[str] = []
        values: dict[tuple[str, str], str] = {}
        for run, result in found:
            for name, tuned, base in ev.score_items(result or {}):
                if name not in names:
                    names.append(name)
                values[(run.name, name)] = f"{_cell(tuned)} (base {_cell(base)})"
        metered = any(summaries[run.folder] for run, _r in found)
        self.table.setColumnCount(1 + len(found))
        self.table.setHorizontalHeaderLabels(["score / meter", *(run.name for run, _r in found)])
        self.table.setRowCount(len(names) + (len(METER_ROWS) if metered else 0))
        for r, name in enumerate(names):
            self.table.setItem(r, 0, QTableWidgetItem(name))
            for c, (run, _r) in enumerate(found, 1):
                self.table.setItem(r, c, QTableWidgetItem(values.get((run.name, name), "–")))
        if metered:
            cells = {run.folder: meter_cells(summaries[run.folder]) for run, _r in found}
            for r, name in enumerate(METER_ROWS, len(names)):
                self.table.setItem(r, 0, QTableWidgetItem(name))
                for c, (run, _r) in enumerate(found, 1):
                    text, tip = cells[run.folder][name]
                    item = QTableWidgetItem(text)
                    item.setToolTip(tip)
                    self.table.setItem(r, c, item)
        self.table.resizeColumnsToContents()
        missing = [run.name for run, r in results if not r]
        self.note.setText("not evaluated: " + ", ".join(missing) if missing else "")
        return bool(found)

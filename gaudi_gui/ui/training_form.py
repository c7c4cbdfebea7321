"""The training job form: the objective (SFT, DPO, ORPO, KTO), model, dataset (with a preview, its SFT
kind and mapping or the preference columns it took, eval split and a render preview), method, launch
options and every field of the objective's config class (SFTConfig, DPOConfig, ORPOConfig, KTOConfig)
of the installed trl and transformers (built from the schema a child reported)."""

from __future__ import annotations

import copy
import csv
import json
from pathlib import Path
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core import datafile, jobcheck, paths, preference, sft
from gaudi_gui.core.jobconfig import (
    FORMATS,
    METHODS,
    MIXED_PRECISION,
    JobConfig,
    dataset_columns,
    dataset_rows,
    resolve_format,
)
from gaudi_gui.core.profile import PROFILE_SKIP_STEPS
from gaudi_gui.core.secrets import SECRET_TRAINING_ARGS
from gaudi_gui.core.training_args import FieldSpec, Schema
from gaudi_gui.services.sft_tools import RenderPreview
from gaudi_gui.ui.dataset_panel import DatasetPanel
from gaudi_gui.ui.wheel_guard import guard_wheel

ERROR_STYLE = "border: 1px solid #d62728; background: #fff0f0;"


def preview_rows(source: str, fmt: str, count: int = 5, objective: str = "sft") -> str:
    """The first rows of a local dataset file, read as plain text (no datasets import here); for a
    preference objective, first the columns it took (or what the file lacks)."""
    if paths.is_demo(source):
        source = str(paths.demo_dataset_path(objective))
    fmt = resolve_format(source, fmt)
    if fmt == "hub":
        return f"Hub dataset '{source}': loaded by the worker (no preview offline)."
    path = Path(source).expanduser()
    try:
        with open(path, encoding="utf-8-sig", errors="replace") as fh:
            if fmt == "csv":
                rows = [dict(r) for _, r in zip(range(count), csv.DictReader(fh), strict=False)]
                text = "\n".join(json.dumps(r, ensure_ascii=False)[:300] for r in rows)
            else:
                text = "\n".join(line.rstrip("\n")[:300] for _, line in zip(range(count), fh, strict=False))
    except OSError as exc:
        return f"cannot read {source}: {exc.strerror or exc}"
    columns = dataset_columns(str(path), fmt)
    if columns is not None:
        text = f"columns: {', '.join(columns) or '(none)'}\n{text}"
    if preference.is_preference(objective) and columns is not None:
        head = dataset_rows(str(path), fmt, count)
        problems = preference.check(objective, columns, head)
        found = preference.detect(objective, columns, head)
        said = f"⚠ {problems[0][1]}" if problems else \
            f"{preference.LABELS[objective]} {found.describe()}" if found else ""
        text = f"{said}\n{text}"
    return text


class _Unset:
    """The value of an editor left at "(default)": the job file does not store the field."""

    _instance: _Unset | None = None

    def __new__(cls) -> _Unset:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNSET"

    def __bool__(self) -> bool:
        return False


UNSET: Any = _Unset()


class FieldEditor(QWidget):
    """One TrainingArguments field with an editor fitting its kind; help as tooltip.

    Every editor can be "unset" (the field stays out of the job and TrainingArguments uses its own
    default): a blank text field, "(default …)" in a combo box, a check box at its default that the
    loaded job did not name. Anything else the user set — even a value equal to the default — is
    written, so a job read and saved again is the job that was read.
    """

    def __init__(self, spec: FieldSpec, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.spec = spec
        self._explicit = False
        self._setting = False
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.editor: QWidget
        default_text = spec.format(spec.default)
        unset_label = f"(default: {default_text})" if default_text else "(default)"
        if spec.kind == "bool" and (spec.optional or spec.default is None):
            # Tri-state: None means "transformers decides" (tf32, gradient_checkpointing, ...), which
            # neither true nor false says.
            combo = QComboBox(self)
            combo.addItem(unset_label, UNSET)
            combo.addItem("true", True)
            combo.addItem("false", False)
            self.editor = combo
        elif spec.kind == "bool":
            box = QCheckBox(self)
            box.toggled.connect(self._on_toggled)
            self.editor = box
        elif spec.kind == "enum" and spec.choices:
            combo = QComboBox(self)
            combo.addItem(unset_label, UNSET)
            for choice in spec.choices:
                combo.addItem(choice, choice)
            # Long choices must not widen the whole form past a small window's column.
            combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            combo.setMinimumContentsLength(10)
            self.editor = combo
        else:
            self.editor = QLineEdit(self)
            self.editor.setPlaceholderText(f"default: {default_text}" if default_text else "(none)")
        layout.addWidget(self.editor)
        self.setToolTip(f"{spec.name} ({spec.kind}, default {default_text or 'none'})\n\n{spec.help}")
        self.set_value(UNSET)

    def _on_toggled(self, _checked: bool) -> None:
        # The user changed the box: from now on it is written only when it differs from the default.
        if not self._setting:
            self._explicit = False

    def set_value(self, value: Any, explicit: bool = True) -> None:
        """Show ``value``; UNSET (or ``explicit=False``) shows the field at its default, unset."""
        if value is UNSET:
            value, explicit = self.spec.default, False
        self._setting = True
        try:
            self._explicit = explicit
            if isinstance(self.editor, QCheckBox):
                self.editor.setChecked(bool(value))
            elif isinstance(self.editor, QComboBox):
                self._set_combo(self.editor, value if explicit else UNSET)
            elif isinstance(self.editor, QLineEdit):
                self.editor.setText(self.spec.format(value) if explicit else "")
        finally:
            self._setting = False

    def _set_combo(self, combo: QComboBox, value: Any) -> None:
        if value is UNSET:
            combo.setCurrentIndex(0)
            return
        for index in range(1, combo.count()):
            data = combo.itemData(index)
            if data == value and type(data) is type(value):
                combo.setCurrentIndex(index)
                return
        if value is None:
            combo.setCurrentIndex(0)
            return
        # A value that is not a choice (a job from another transformers version, a typo): shown as
        # it is, so the check marks it instead of the form silently replacing it.
        combo.addItem(f"{value} (not a choice)", value)
        combo.setCurrentIndex(combo.count() - 1)

    def value(self) -> Any:
        """The typed value, or UNSET; raises ValueError for text that does not fit the field."""
        if isinstance(self.editor, QCheckBox):
            checked = self.editor.isChecked()
            return checked if (self._explicit or checked != bool(self.spec.default)) else UNSET
        if isinstance(self.editor, QComboBox):
            return self.editor.currentData()
        assert isinstance(self.editor, QLineEdit)
        text = self.editor.text()
        return UNSET if text.strip() == "" else self.spec.parse(text)

    def set_error(self, message: str) -> None:
        self.editor.setStyleSheet(ERROR_STYLE if message else "")
        self.editor.setToolTip(message or "")


class TrainingForm(QWidget):
    """The whole job as a form: ``set_job(job)`` shows one, ``job()`` reads it back (the same job when
    nothing was edited), ``check()`` also marks every problem the GUI can see without a child."""

    #: Any value changed (the tab refreshes the command preview).
    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.schema: Schema | None = None
        self.editors: dict[str, FieldEditor] = {}
        #: "overwrite" beside output_dir (made with that field's editor): the job's overwrite_output.
        self.overwrite_output: QCheckBox | None = None
        self._labels: dict[str, QLabel] = {}
        self._extra_args: dict[str, Any] = {}
        #: The job last shown: job() starts from it, so what the form has no editor for (name,
        #: resume_from_checkpoint, dataset.split) is kept.
        self._base = JobConfig()
        #: The whole schema (SFT's fields and each objective's own); ``schema`` is the objective's.
        self.full_schema: Schema | None = None
        root = QVBoxLayout(self)

        # -- objective -------------------------------------------------------------------------
        orow = QHBoxLayout()
        orow.addWidget(QLabel("Objective", self))
        self.objective = QComboBox(self)
        for name in preference.OBJECTIVES:
            self.objective.addItem(preference.LABELS[name], name)
        self.objective.setToolTip("SFT: learn the dataset's text or answers (SFTTrainer). DPO, ORPO, KTO: "
                                  "learn from preferences (TRL's DPOTrainer, ORPOTrainer, KTOTrainer): a "
                                  "file of prompt, chosen, rejected (or KTO's prompt, completion, label)")
        orow.addWidget(self.objective)
        orow.addStretch(1)
        root.addLayout(orow)

        # -- model and data --------------------------------------------------------------------
        data = QGroupBox("Model and data", self)
        form = QFormLayout(data)
        self.model = QComboBox(self)
        self.model.setEditable(True)
        self.model.addItem(paths.DEMO_MODEL_ID)
        self.model.setToolTip("Hub id, local folder, or builtin:demo (the bundled tiny model)")
        #: Download… under the model, at the start of its cache line: the Training tab binds it to
        #: the placement's Hub cache (``attach_model_state``); hidden until then.
        self.download_button = QPushButton("Download…", self)
        self.download_button.hide()
        form.addRow("Model", self.model)
        self._data_form = form
        self.dataset = QLineEdit(paths.DEMO_DATASET_ID, self)
        self.dataset.setToolTip("text / JSON lines / CSV file, a Hub dataset id, or builtin:demo")
        self.browse = QPushButton("…", self)
        self.browse.setToolTip("choose a local dataset file")
        self.browse.clicked.connect(self._browse_dataset)  # a no-argument slot: `checked` is dropped
        row = QHBoxLayout()
        row.addWidget(self.dataset, 1)
        row.addWidget(self.browse)
        form.addRow("Dataset", row)
        self.format = QComboBox(self)
        self.format.addItems(list(FORMATS))
        self.column = QLineEdit("text", self)
        self.max_length = QSpinBox(self)
        self.max_length.setRange(2, 1 << 16)
        self.max_length.setValue(32)
        # Rows of at most two pairs: the form must fit a 1024-pixel window's left column.
        line = QHBoxLayout()
        pairs: tuple[tuple[str, QWidget], ...] = (("format", self.format), ("column", self.column))
        for label, w in pairs:
            line.addWidget(QLabel(label, self))
            line.addWidget(w, 1 if w is self.column else 0)
        form.addRow("", line)
        form.addRow("max length", self.max_length)
        self.preview = QPlainTextEdit(self)
        self.preview.setReadOnly(True)
        self.preview.setMaximumHeight(90)
        self.preview.setToolTip("the first rows of the file and the columns the worker will see")
        form.addRow("Preview", self.preview)
        self.dataset_panel = DatasetPanel(self)
        self.dataset_panel.add_rows(form)
        self.dataset_panel.changed.connect(self.changed)
        self.dataset_panel.changed.connect(self._update_kind)
        self.dataset_panel.render_requested.connect(self._render)
        # The render preview's child (tokenizer + TRL's dataset preparation, no model).
        self.renderer = RenderPreview(self)
        self.renderer.finished.connect(self._rendered)
        self.method = QComboBox(self)
        self.method.addItems(list(METHODS))
        self.lora_r = QSpinBox(self)
        self.lora_r.setRange(1, 1024)
        self.lora_r.setValue(8)
        self.lora_alpha = QSpinBox(self)
        self.lora_alpha.setRange(1, 4096)
        self.lora_alpha.setValue(16)
        self.lora_dropout = QDoubleSpinBox(self)
        self.lora_dropout.setRange(0.0, 0.99)
        self.lora_dropout.setSingleStep(0.05)
        self.lora_dropout.setValue(0.05)
        self.lora_targets = QLineEdit(self)
        self.lora_targets.setPlaceholderText("target modules (empty: peft default)")
        mrow = QHBoxLayout()
        mrow.addWidget(self.method)
        for label, spin in (("r", self.lora_r), ("alpha", self.lora_alpha)):
            mrow.addWidget(QLabel(label, self))
            mrow.addWidget(spin)
        mrow.addStretch(1)
        form.addRow("Method", mrow)
        lrow2 = QHBoxLayout()
        lrow2.addWidget(QLabel("dropout", self))
        lrow2.addWidget(self.lora_dropout)
        lrow2.addWidget(self.lora_targets, 1)
        form.addRow("LoRA", lrow2)
        root.addWidget(data)

        # -- launch ----------------------------------------------------------------------------
        launch = QGroupBox("Launch", self)
        lform = QFormLayout(launch)
        self.num_processes = QSpinBox(self)
        self.num_processes.setRange(1, 1024)
        self.mixed_precision = QComboBox(self)
        self.mixed_precision.addItems(list(MIXED_PRECISION))
        self.accelerate_config = QLineEdit(self)
        self.accelerate_config.setPlaceholderText("accelerate config file (empty: generated per run)")
        lrow = QHBoxLayout()
        lrow.addWidget(QLabel("processes", self))
        lrow.addWidget(self.num_processes)
        lrow.addWidget(QLabel("mixed precision", self))
        lrow.addWidget(self.mixed_precision)
        lrow.addStretch(1)
        lform.addRow("", lrow)
        lform.addRow("config", self.accelerate_config)
        self.num_machines = QSpinBox(self)
        self.num_machines.setRange(1, 1024)
        self.machine_rank = QSpinBox(self)
        self.machine_rank.setRange(0, 1023)
        self.main_ip = QLineEdit(self)
        self.main_ip.setPlaceholderText("main machine IP")
        self.main_port = QSpinBox(self)
        self.main_port.setRange(1, 65535)
        self.main_port.setValue(29500)
        nrow = QHBoxLayout()
        spins: tuple[tuple[str, QWidget], ...] = (("machines", self.num_machines),
                                                  ("rank", self.machine_rank))
        for label, w in spins:
            nrow.addWidget(QLabel(label, self))
            nrow.addWidget(w)
        nrow.addStretch(1)
        lform.addRow("Multi-node", nrow)
        irow = QHBoxLayout()
        addr: tuple[tuple[str, QWidget], ...] = (("ip", self.main_ip), ("port", self.main_port))
        for label, w in addr:
            irow.addWidget(QLabel(label, self))
            irow.addWidget(w, 1 if w is self.main_ip else 0)
        lform.addRow("", irow)
        #: "Profile N steps" (issue 40): the job's profile_steps; 0 is off.
        self.profile_steps = QSpinBox(self)
        self.profile_steps.setRange(0, 100_000)
        self.profile_steps.setSpecialValueText("off")
        self.profile_steps.setSuffix(" steps")
        self.profile_steps.setToolTip(f"record this many training steps with torch.profiler after "
                                      f"{PROFILE_SKIP_STEPS} warm-up steps (rank 0): the run's Profile… page "
                                      f"shows the top operators and what to do; 0: off")
        lform.addRow("Profile", self.profile_steps)
        root.addWidget(launch)

        # -- training arguments ----------------------------------------------------------------
        self.args_box = QGroupBox("Training arguments", self)
        self.args_layout = QVBoxLayout(self.args_box)
        self.schema_status = QLabel("reading TrainingArguments from transformers…", self)
        self.schema_status.setWordWrap(True)
        self.args_layout.addWidget(self.schema_status)
        self.common_form = QFormLayout()
        self.args_layout.addLayout(self.common_form)
        self.search = QLineEdit(self)
        self.search.setPlaceholderText("search all arguments (name or help)…")
        self.search.textChanged.connect(self._filter)
        self.args_layout.addWidget(self.search)
        self.all_form = QFormLayout()
        self.args_layout.addLayout(self.all_form)
        self.hints = QLabel(self)
        self.hints.setWordWrap(True)
        self.hints.setStyleSheet("color: #8a5a00;")
        root.addWidget(self.args_box)
        root.addWidget(self.hints)
        root.addStretch(1)

        for w in (self.dataset, self.column, self.lora_targets, self.accelerate_config, self.main_ip):
            w.textChanged.connect(self.changed)
        for c in (self.format, self.method, self.mixed_precision):
            c.currentIndexChanged.connect(self.changed)
        self.model.currentTextChanged.connect(self.changed)
        for s in (self.max_length, self.lora_r, self.lora_alpha, self.num_processes, self.num_machines,
                  self.machine_rank, self.main_port, self.profile_steps):
            s.valueChanged.connect(self.changed)
        self.lora_dropout.valueChanged.connect(self.changed)
        self.dataset.textChanged.connect(self._update_preview)
        self.format.currentIndexChanged.connect(self._update_preview)
        self.method.currentIndexChanged.connect(self._update_method)
        self.objective.currentIndexChanged.connect(self._objective_changed)
        self._update_preview()
        self._update_method()
        guard_wheel(self)

    # -- schema -------------------------------------------------------------------------------

    def current_objective(self) -> str:
        return str(self.objective.currentData() or "sft")

    def _objective_changed(self) -> None:
        """Another objective: its config class's fields replace the last one's (values the new class
        also has are kept), the SFT dataset rows hide or show, and the preview says the columns."""
        objective = self.current_objective()
        if self.full_schema is not None:
            self.set_schema(self.full_schema, switched=True)
        self.dataset_panel.set_preference(preference.is_preference(objective))
        self._update_kind()
        self._update_preview()
        self.changed.emit()

    def set_schema(self, schema: Schema, *, switched: bool = False) -> None:
        """The installed schema (the whole of it); the editors are those of the objective chosen.
        ``switched``: the objective changed, and a value of a field that only another objective's class
        has (packing for DPO, beta for SFT) is dropped; a name no class knows stays, to be flagged."""
        self.full_schema = schema.root or schema
        schema = self.full_schema.for_objective(self.current_objective())
        current = self._current_args_lenient()
        if switched:
            known = set(self.full_schema.fields)
            for _cls, own in self.full_schema.objectives.values():
                known |= set(own)
            current = {k: v for k, v in current.items() if k in schema.fields or k not in known}
            self._extra_args = {k: v for k, v in self._extra_args.items()
                                if k in schema.fields or k not in known}
        if self.overwrite_output is not None:  # deleted with its row below: keep what it says
            self._base.overwrite_output = self.overwrite_output.isChecked()
            self.overwrite_output = None
        self.schema = schema
        for form in (self.common_form, self.all_form):
            while form.rowCount():
                form.removeRow(0)
        self.editors.clear()
        self._labels.clear()
        # The dataset panel edits the SFT fields it owns; a token never has an editor (job files
        # never hold one).
        skip = {*sft.PANEL_FIELDS, *SECRET_TRAINING_ARGS}
        for spec in schema.common():
            if spec.name not in skip:
                self._add_editor(self.common_form, spec)
        for spec in schema.others():
            if spec.name not in skip:
                self._add_editor(self.all_form, spec)
        self.schema_status.setText(f"{schema.describe()}: {len(schema.fields)} "
                                   "arguments (common ones first; hover for help)")
        self.set_training_args({**current, **self._extra_args})
        self._filter(self.search.text())
        guard_wheel(self)

    def _add_editor(self, form: QFormLayout, spec: FieldSpec) -> None:
        editor = FieldEditor(spec, self)
        label = QLabel(spec.name, self)
        label.setToolTip(spec.help)
        form.addRow(label, editor)
        self.editors[spec.name] = editor
        self._labels[spec.name] = label
        w = editor.editor
        if spec.name == "output_dir" and isinstance(w, QLineEdit):
            # Empty is the default now: each run its own folder (core/outputs.py).
            w.setPlaceholderText("empty: a folder of its own per run (outputs/<run name>)")
            box = QCheckBox("overwrite", editor)
            box.setToolTip("let this run write into a folder that holds another run's checkpoints, final "
                           "model or adapter (refused otherwise)")
            box.setChecked(self._base.overwrite_output)
            box.toggled.connect(lambda _on: self.changed.emit())
            layout = editor.layout()
            assert layout is not None
            layout.addWidget(box)
            self.overwrite_output = box
        if isinstance(w, QCheckBox):
            w.toggled.connect(lambda _on: self.changed.emit())
        elif isinstance(w, QComboBox):
            w.currentIndexChanged.connect(lambda _i: self.changed.emit())
        elif isinstance(w, QLineEdit):
            w.textChanged.connect(lambda _t: self.changed.emit())

    def _filter(self, text: str) -> None:
        if self.schema is None:
            return
        # The "all arguments" section stays folded until the user searches: 100 rows are noise.
        visible = {s.name for s in self.schema.search(text)} if text.strip() else set()
        for spec in self.schema.others():
            if spec.name in self._labels:
                self.all_form.setRowVisible(self._labels[spec.name], spec.name in visible)

    # -- values -------------------------------------------------------------------------------

    def _current_args_lenient(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, editor in self.editors.items():
            try:
                value = editor.value()
            except ValueError:
                continue
            if value is not UNSET:
                out[name] = value
        return out

    def training_args(self) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        """What the user set (fields left at "(default)" are absent), and text that does not parse."""
        values: dict[str, Any] = dict(self._extra_args)
        errors: list[tuple[str, str]] = []
        for name, editor in self.editors.items():
            try:
                value = editor.value()
            except ValueError as exc:
                errors.append((name, str(exc)))
                continue
            if value is not UNSET:
                values[name] = value
        return values, errors

    def set_training_args(self, args: dict[str, Any]) -> None:
        """Show ``args``: the fields it names as set (even at their default), all others unset."""
        self._extra_args = {k: v for k, v in args.items() if k not in self.editors}
        for name, editor in self.editors.items():
            editor.set_value(args.get(name, UNSET))

    def job(self) -> tuple[JobConfig, list[tuple[str, str]]]:
        args, errors = self.training_args()
        job = copy.deepcopy(self._base)
        job.objective = self.current_objective()
        job.model = self.model.currentText().strip()
        job.method = self.method.currentText()
        owned = ("chat_template_path", "completion_only_loss", "assistant_only_loss")
        job.training_args = {**{k: v for k, v in args.items() if k not in owned},
                             **self.dataset_panel.training_args()}
        job.dataset.kind = self.dataset_panel.kind.currentText()
        job.dataset.columns = self.dataset_panel.columns()
        if preference.is_preference(job.objective):
            # The preference file's own columns; the SFT panel's values are not this job's.
            job.dataset.kind, job.dataset.columns = "text", {}
            job.training_args = {k: v for k, v in job.training_args.items() if k not in owned}
        job.dataset.eval = self.dataset_panel.eval_spec()
        job.dataset.source = self.dataset.text().strip()
        job.dataset.format = self.format.currentText()
        job.dataset.text_column = self.column.text().strip()
        job.dataset.max_length = self.max_length.value()
        job.lora.r = self.lora_r.value()
        job.lora.alpha = self.lora_alpha.value()
        job.lora.dropout = round(self.lora_dropout.value(), 4)
        job.lora.target_modules = [t.strip() for t in self.lora_targets.text().split(",") if t.strip()]
        job.launch.num_processes = self.num_processes.value()
        job.launch.mixed_precision = self.mixed_precision.currentText()
        job.launch.accelerate_config = self.accelerate_config.text().strip()
        job.launch.num_machines = self.num_machines.value()
        job.launch.machine_rank = self.machine_rank.value()
        job.launch.main_process_ip = self.main_ip.text().strip()
        job.launch.main_process_port = self.main_port.value()
        job.profile_steps = self.profile_steps.value()
        if self.overwrite_output is not None:
            job.overwrite_output = self.overwrite_output.isChecked()
        return job, errors

    def set_job(self, job: JobConfig) -> None:
        self._base = copy.deepcopy(job)
        index = self.objective.findData(job.objective)
        if index != self.objective.currentIndex():
            self.objective.blockSignals(True)
            self.objective.setCurrentIndex(max(0, index))
            self.objective.blockSignals(False)
            if self.full_schema is not None:
                self.set_schema(self.full_schema, switched=True)
            self.dataset_panel.set_preference(preference.is_preference(job.objective))
        self.model.setCurrentText(job.model)
        self.dataset.setText(job.dataset.source)
        self.format.setCurrentText(job.dataset.format)
        self.column.setText(job.dataset.text_column)
        self.max_length.setValue(job.dataset.max_length)
        self.method.setCurrentText(job.method)
        self.lora_r.setValue(job.lora.r)
        self.lora_alpha.setValue(round(job.lora.alpha))
        self.lora_dropout.setValue(job.lora.dropout)
        self.lora_targets.setText(",".join(job.lora.target_modules))
        self.num_processes.setValue(job.launch.num_processes)
        self.mixed_precision.setCurrentText(job.launch.mixed_precision)
        self.accelerate_config.setText(job.launch.accelerate_config)
        self.num_machines.setValue(job.launch.num_machines)
        self.machine_rank.setValue(job.launch.machine_rank)
        self.main_ip.setText(job.launch.main_process_ip)
        self.main_port.setValue(job.launch.main_process_port)
        self.profile_steps.setValue(job.profile_steps)
        self.set_training_args(job.training_args)
        if self.overwrite_output is not None:
            self.overwrite_output.setChecked(job.overwrite_output)
        self.dataset_panel.set_values(job.dataset.kind, dict(job.dataset.columns), dict(job.dataset.eval),
                                      job.training_args)
        self._update_kind()

    def check(self) -> tuple[JobConfig, list[tuple[str, str]]]:
        """The job and every problem found without a child (text that does not parse, JobConfig.validate,
        the schema's type/range checks), marked at their fields. Field names as in JobConfig.validate."""
        job, parse_errors = self.job()
        # The one check of a job where it enters (core.jobcheck): the render preview runs here, on
        # this machine's files.
        errors = [(f"training_args.{f}", m) for f, m in parse_errors] + \
            jobcheck.check(job, schema=self.schema, scan_limit=datafile.WINDOW_SCAN_BYTES)
        self.show_errors(errors)
        return job, errors

    def show_errors(self, errors: list[tuple[str, str]]) -> None:
        """Mark the fields that have a problem (field names as in JobConfig.validate or bare args)."""
        by_field: dict[str, str] = {}
        for field, message in errors:
            by_field.setdefault(field.removeprefix("training_args."), message)
        for name, editor in self.editors.items():
            editor.set_error(by_field.get(name, ""))
        for key, widget in self._plain_widgets().items():
            self._mark(widget, by_field.get(key, ""))
        # An error in a folded "all arguments" row must be visible: show those rows.
        if self.schema:
            for spec in self.schema.others():
                if spec.name in by_field and spec.name in self._labels:
                    self.all_form.setRowVisible(self._labels[spec.name], True)

    def _plain_widgets(self) -> dict[str, QWidget]:
        """Job keys (as JobConfig.validate names them) -> the editor outside the arguments list."""
        return {
            "model": self.model, "dataset.source": self.dataset, "dataset.text_column": self.column,
            "dataset.max_length": self.max_length, "method": self.method, "lora.r": self.lora_r,
            "lora.alpha": self.lora_alpha, "lora.dropout": self.lora_dropout,
            "launch.num_processes": self.num_processes, "launch.accelerate_config": self.accelerate_config,
            "launch.num_machines": self.num_machines, "launch.machine_rank": self.machine_rank,
            "launch.main_process_ip": self.main_ip, "launch.main_process_port": self.main_port,
            "profile_steps": self.profile_steps,
            **self.dataset_panel.widgets_by_field()}

    @staticmethod
    def _mark(widget: QWidget, message: str) -> None:
        if widget.property("help") is None:
            widget.setProperty("help", widget.toolTip())  # the tooltip to restore once fixed
        widget.setStyleSheet(ERROR_STYLE if message else "")
        widget.setToolTip(message or str(widget.property("help") or ""))

    def _rendered(self, result: dict[str, Any]) -> None:
        """The preview child's answer; a problem only the data could show (a Hub dataset's columns, a
        prompt longer than max length) is marked at its field too."""
        self.dataset_panel.show_rendering(result)
        field = str(result.get("field") or "")
        if not result.get("ok") and field:
            widget = self._plain_widgets().get(field)
            if widget is None and field.removeprefix("training_args.") in self.editors:
                widget = self.editors[field.removeprefix("training_args.")].editor
            if widget is not None:
                self._mark(widget, str(result.get("message", "")))

    def set_hints(self, hints: list[tuple[str, str]]) -> None:
        self.hints.setText("\n".join(f"⚠ {field}: {text}" for field, text in hints))

    # -- helpers ------------------------------------------------------------------------------

    def attach_model_state(self, state: QWidget) -> None:
        """The model's cache line (``ui.model_field.ModelCacheState``) under the model field, and
        Download… shown beside it."""
        self._data_form.insertRow(1, "", state)
        self.download_button.show()

    def _browse_dataset(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Dataset file", "",
                                              "Datasets (*.jsonl *.json *.csv *.txt);;All files (*)")
        if path:
            self.dataset.setText(path)

    def _update_preview(self) -> None:
        source = self.dataset.text().strip()
        objective = self.current_objective()
        count = preference.PREVIEW_ROWS if preference.is_preference(objective) else 5
        self.preview.setPlainText(preview_rows(source, self.format.currentText(), count, objective)
                                  if source else "")
        local = str(paths.demo_dataset_path(objective)) if paths.is_demo(source) else source
        fmt = resolve_format(local, self.format.currentText()) if source else "hub"
        self.dataset_panel.set_columns(dataset_columns(local, fmt) if fmt != "hub" else None)

    def _update_kind(self) -> None:
        # The text column is for the text kind; the others map their columns in the panel; a preference
        # objective reads its own columns.
        self.column.setEnabled(self.dataset_panel.kind.currentText() == "text"
                               and not preference.is_preference(self.current_objective()))

    def _render(self) -> None:
        """The render preview of the job as the form holds it (problems are marked instead)."""
        job, errors = self.check()
        dataset_errors = [(f, m) for f, m in errors if f.startswith(("dataset", "model"))]
        if dataset_errors:
            self.dataset_panel.show_rendering({"ok": False, "message": dataset_errors[0][1]})
            return
        if self.renderer.render(job):
            self.dataset_panel.set_rendering()

    def shutdown(self) -> None:
        """The render preview's child, if one runs."""
        self.renderer.shutdown()

    def _update_method(self) -> None:
        lora = self.method.currentText() in ("lora", "qlora")
        for w in (self.lora_r, self.lora_alpha, self.lora_dropout, self.lora_targets):
            w.setEnabled(lora)

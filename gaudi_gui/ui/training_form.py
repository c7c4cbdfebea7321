"""The training job form: model, dataset (with a preview), method, launch options and every
TrainingArguments field of the installed transformers (built from the schema a child reported)."""

from __future__ import annotations

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

from gaudi_gui.core import paths
from gaudi_gui.core.jobconfig import FORMATS, METHODS, MIXED_PRECISION, JobConfig, resolve_format
from gaudi_gui.core.training_args import FieldSpec, Schema

ERROR_STYLE = "border: 1px solid #d62728; background: #fff0f0;"


def preview_rows(source: str, fmt: str, count: int = 5) -> str:
    """The first rows of a local dataset file, read as plain text (no datasets import here)."""
    if paths.is_demo(source):
        source = str(paths.demo_dataset_path())
    fmt = resolve_format(source, fmt)
    if fmt == "hub":
        return f"Hub dataset '{source}': loaded by the worker (no preview offline)."
    path = Path(source).expanduser()
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            if fmt == "csv":
                rows = [dict(r) for _, r in zip(range(count), csv.DictReader(fh), strict=False)]
                return "\n".join(json.dumps(r, ensure_ascii=False)[:300] for r in rows)
            lines = [line.rstrip("\n")[:300] for _, line in zip(range(count), fh, strict=False)]
    except OSError as exc:
        return f"cannot read {source}: {exc.strerror or exc}"
    return "\n".join(lines)


class FieldEditor(QWidget):
    """One TrainingArguments field with an editor fitting its kind; help as tooltip."""

    def __init__(self, spec: FieldSpec, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.spec = spec
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.editor: QWidget
        if spec.kind == "bool":
            self.editor = QCheckBox(self)
        elif spec.kind == "enum" and spec.choices:
            combo = QComboBox(self)
            if spec.optional or spec.default is None:
                combo.addItem("")
            combo.addItems(list(spec.choices))
            self.editor = combo
        else:
            self.editor = QLineEdit(self)
            self.editor.setPlaceholderText(spec.format(spec.default) or "(none)")
        layout.addWidget(self.editor)
        self.setToolTip(f"{spec.name} ({spec.kind}, default {spec.format(spec.default) or 'none'})\n\n"
                        f"{spec.help}")
        self.set_value(spec.default)

    def set_value(self, value: Any) -> None:
        if isinstance(self.editor, QCheckBox):
            self.editor.setChecked(bool(value))
        elif isinstance(self.editor, QComboBox):
            index = self.editor.findText(self.spec.format(value))
            self.editor.setCurrentIndex(max(0, index))
        elif isinstance(self.editor, QLineEdit):
            self.editor.setText("" if value == self.spec.default else self.spec.format(value))

    def value(self) -> Any:
        """The typed value; raises ValueError for text that does not fit the field."""
        if isinstance(self.editor, QCheckBox):
            return self.editor.isChecked()
        if isinstance(self.editor, QComboBox):
            text = self.editor.currentText()
            return None if text == "" else text
        assert isinstance(self.editor, QLineEdit)
        text = self.editor.text()
        return self.spec.default if text.strip() == "" else self.spec.parse(text)

    def set_error(self, message: str) -> None:
        self.editor.setStyleSheet(ERROR_STYLE if message else "")
        self.editor.setToolTip(message or "")


class TrainingForm(QWidget):
    #: Any value changed (the tab refreshes the command preview).
    changed = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.schema: Schema | None = None
        self.editors: dict[str, FieldEditor] = {}
        self._labels: dict[str, QLabel] = {}
        self._extra_args: dict[str, Any] = {}
        root = QVBoxLayout(self)

        # -- model and data --------------------------------------------------------------------
        data = QGroupBox("Model and data", self)
        form = QFormLayout(data)
        self.model = QComboBox(self)
        self.model.setEditable(True)
        self.model.addItem(paths.DEMO_MODEL_ID)
        self.model.setToolTip("Hub id, local folder, or builtin:demo (the bundled tiny model)")
        form.addRow("Model", self.model)
        self.dataset = QLineEdit(paths.DEMO_DATASET_ID, self)
        self.dataset.setToolTip("text / JSON lines / CSV file, a Hub dataset id, or builtin:demo")
        browse = QPushButton("…", self)
        browse.clicked.connect(self._browse_dataset)
        row = QHBoxLayout()
        row.addWidget(self.dataset, 1)
        row.addWidget(browse)
        form.addRow("Dataset", row)
        self.format = QComboBox(self)
        self.format.addItems(list(FORMATS))
        self.column = QLineEdit("text", self)
        self.max_length = QSpinBox(self)
        self.max_length.setRange(2, 1 << 16)
        self.max_length.setValue(32)
        line = QHBoxLayout()
        for label, w in (("format", self.format), ("column", self.column), ("max length", self.max_length)):
            line.addWidget(QLabel(label, self))
            line.addWidget(w)
        form.addRow("", line)
        self.preview = QPlainTextEdit(self)
        self.preview.setReadOnly(True)
        self.preview.setMaximumHeight(70)
        form.addRow("Preview", self.preview)
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
        for label, spin in (("r", self.lora_r), ("alpha", self.lora_alpha), ("dropout", self.lora_dropout)):
            mrow.addWidget(QLabel(label, self))
            mrow.addWidget(spin)
        mrow.addWidget(self.lora_targets, 1)
        form.addRow("Method", mrow)
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
        lrow.addWidget(self.accelerate_config, 1)
        lform.addRow("", lrow)
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
        for label, w in (("machines", self.num_machines), ("rank", self.machine_rank),
                         ("ip", self.main_ip), ("port", self.main_port)):
            nrow.addWidget(QLabel(label, self))
            nrow.addWidget(w)
        lform.addRow("Multi-node", nrow)
        root.addWidget(launch)

        # -- training arguments ----------------------------------------------------------------
        self.args_box = QGroupBox("Training arguments", self)
        self.args_layout = QVBoxLayout(self.args_box)
        self.schema_status = QLabel("reading TrainingArguments from transformers…", self)
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
                  self.machine_rank, self.main_port):
            s.valueChanged.connect(self.changed)
        self.lora_dropout.valueChanged.connect(self.changed)
        self.dataset.textChanged.connect(self._update_preview)
        self.format.currentIndexChanged.connect(self._update_preview)
        self.method.currentIndexChanged.connect(self._update_method)
        self._update_preview()
        self._update_method()

    # -- schema -------------------------------------------------------------------------------

    def set_schema(self, schema: Schema) -> None:
        current = self._current_args_lenient()
        self.schema = schema
        for form in (self.common_form, self.all_form):
            while form.rowCount():
                form.removeRow(0)
        self.editors.clear()
        self._labels.clear()
        for spec in schema.common():
            self._add_editor(self.common_form, spec)
        for spec in schema.others():
            self._add_editor(self.all_form, spec)
        self.schema_status.setText(f"transformers {schema.transformers_version}: {len(schema.fields)} "
                                   "arguments (common ones first; hover for help)")
        self.set_training_args({**current, **self._extra_args})
        self._filter(self.search.text())

    def _add_editor(self, form: QFormLayout, spec: FieldSpec) -> None:
        editor = FieldEditor(spec, self)
        label = QLabel(spec.name, self)
        label.setToolTip(spec.help)
        form.addRow(label, editor)
        self.editors[spec.name] = editor
        self._labels[spec.name] = label
        w = editor.editor
        if isinstance(w, QCheckBox):
            w.toggled.connect(self.changed)
        elif isinstance(w, QComboBox):
            w.currentIndexChanged.connect(self.changed)
        elif isinstance(w, QLineEdit):
            w.textChanged.connect(self.changed)

    def _filter(self, text: str) -> None:
        if self.schema is None:
            return
        # The "all arguments" section stays folded until the user searches: 100 rows are noise.
        visible = {s.name for s in self.schema.search(text)} if text.strip() else set()
        for spec in self.schema.others():
            self.all_form.setRowVisible(self._labels[spec.name], spec.name in visible)

    # -- values -------------------------------------------------------------------------------

    def _current_args_lenient(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name, editor in self.editors.items():
            try:
                out[name] = editor.value()
            except ValueError:
                continue
        return self.schema.non_default(out) if self.schema else out

    def training_args(self) -> tuple[dict[str, Any], list[tuple[str, str]]]:
        values: dict[str, Any] = dict(self._extra_args)
        errors: list[tuple[str, str]] = []
        for name, editor in self.editors.items():
            try:
                values[name] = editor.value()
            except ValueError as exc:
                errors.append((name, str(exc)))
        if self.schema:
            values = self.schema.non_default(values)
            values = {k: v for k, v in values.items() if v is not None or k in self._extra_args}
        return values, errors

    def set_training_args(self, args: dict[str, Any]) -> None:
        self._extra_args = {k: v for k, v in args.items() if k not in self.editors}
        for name, editor in self.editors.items():
            editor.set_value(args.get(name, editor.spec.default))

    def job(self) -> tuple[JobConfig, list[tuple[str, str]]]:
        args, errors = self.training_args()
        job = JobConfig(model=self.model.currentText().strip(), method=self.method.currentText(),
                        training_args=args)
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
        return job, errors

    def set_job(self, job: JobConfig) -> None:
        self.model.setCurrentText(job.model)
        self.dataset.setText(job.dataset.source)
        self.format.setCurrentText(job.dataset.format)
        self.column.setText(job.dataset.text_column)
        self.max_length.setValue(job.dataset.max_length)
        self.method.setCurrentText(job.method)
        self.lora_r.setValue(job.lora.r)
        self.lora_alpha.setValue(int(job.lora.alpha))
        self.lora_dropout.setValue(job.lora.dropout)
        self.lora_targets.setText(",".join(job.lora.target_modules))
        self.num_processes.setValue(job.launch.num_processes)
        self.mixed_precision.setCurrentText(job.launch.mixed_precision)
        self.accelerate_config.setText(job.launch.accelerate_config)
        self.num_machines.setValue(job.launch.num_machines)
        self.machine_rank.setValue(job.launch.machine_rank)
        self.main_ip.setText(job.launch.main_process_ip)
        self.main_port.setValue(job.launch.main_process_port)
        self.set_training_args(job.training_args)

    def show_errors(self, errors: list[tuple[str, str]]) -> None:
        """Mark the fields that have a problem (field names as in JobConfig.validate or bare args)."""
        by_field: dict[str, str] = {}
        for field, message in errors:
            by_field.setdefault(field.removeprefix("training_args."), message)
        for name, editor in self.editors.items():
            editor.set_error(by_field.get(name, ""))
        plain = {"model": self.model, "dataset.source": self.dataset, "dataset.text_column": self.column,
                 "launch.accelerate_config": self.accelerate_config, "launch.main_process_ip": self.main_ip}
        for key, widget in plain.items():
            widget.setStyleSheet(ERROR_STYLE if key in by_field else "")
            widget.setToolTip(by_field.get(key, widget.toolTip() if key not in by_field else ""))
        # An error in a folded "all arguments" row must be visible: show those rows.
        if self.schema:
            for spec in self.schema.others():
                if spec.name in by_field:
                    self.all_form.setRowVisible(self._labels[spec.name], True)

    def set_hints(self, hints: list[tuple[str, str]]) -> None:
        self.hints.setText("\n".join(f"⚠ {field}: {text}" for field, text in hints))

    # -- helpers ------------------------------------------------------------------------------

    def _browse_dataset(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Dataset file", "",
                                              "Datasets (*.jsonl *.json *.csv *.txt);;All files (*)")
        if path:
            self.dataset.setText(path)

    def _update_preview(self) -> None:
        source = self.dataset.text().strip()
        self.preview.setPlainText(preview_rows(source, self.format.currentText()) if source else "")

    def _update_method(self) -> None:
        lora = self.method.currentText() in ("lora", "qlora")
        for w in (self.lora_r, self.lora_alpha, self.lora_dropout, self.lora_targets):
            w.setEnabled(lora)

"""What the dataset is for SFT: its kind, which columns feed which field, the chat template, the loss
mask, the eval split, and a render preview that shows the exact training text with the tokens that
carry the loss highlighted (computed by TRL in a child, ``gaudi_gui.workers.sft_data``)."""

from __future__ import annotations

import html
from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QTextEdit,
    QWidget,
)

from gaudi_gui.core import sft

ERROR_STYLE = "border: 1px solid #d62728; background: #fff0f0;"
MODEL_TEMPLATE = "(the model's chat template)"
EVAL_MODES = ("none", "fraction", "file", "Hub split")
LOSS_STYLE = "background: #c9f2c9; color: #0b4d0b;"
CONTEXT_STYLE = "color: #777;"


class DatasetPanel(QWidget):
    """Rows of a QFormLayout added to the form's "Model and data" box (``add_rows``)."""

    #: A value changed (the form re-checks and refreshes the command preview).
    changed = Signal()
    #: The user asked for the render preview (the form starts the child).
    render_requested = Signal()

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.kind = QComboBox(self)
        self.kind.addItems(list(sft.KINDS))
        self.kind.setToolTip("text: one text column; prompt_completion: prompt and answer columns (alpaca: "
                             "instruction + input -> output); conversational: a column of role/content "
                             "messages (sharegpt's from/value is mapped)")
        self.column_boxes: dict[str, QComboBox] = {}
        for field in ("prompt", "completion", "messages"):
            box = QComboBox(self)
            box.setEditable(True)
            box.setToolTip(f"the column for {field}, or a template over several columns: "
                           "{instruction}\\n\\n{input}")
            box.setMinimumContentsLength(8)
            box.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            self.column_boxes[field] = box
        self.template = QComboBox(self)
        self.template.setEditable(True)
        self.template.addItem(MODEL_TEMPLATE, "")
        for label, path in sft.chat_template_choices():
            self.template.addItem(label, path)
        self.template.setMinimumContentsLength(12)
        self.template.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.template.setToolTip("chat template (SFTConfig.chat_template_path): the model's own, one of "
                                 "TRL's training templates, a .jinja file or a tokenizer folder")
        self.answers_only = QCheckBox("loss on answers only", self)
        self.answers_only.setChecked(True)
        self.answers_only.setToolTip("completion_only_loss (prompt_completion) / assistant_only_loss "
                                     "(conversational): only the answer tokens are labelled")
        self.eval_mode = QComboBox(self)
        self.eval_mode.addItems(list(EVAL_MODES))
        self.eval_fraction = QDoubleSpinBox(self)
        self.eval_fraction.setRange(0.01, 0.9)
        self.eval_fraction.setSingleStep(0.05)
        self.eval_fraction.setValue(0.1)
        self.eval_source = QLineEdit(self)
        self.eval_source.setPlaceholderText("eval file, or a Hub split name")
        self.render_button = QPushButton("Render preview", self)
        self.render_button.setToolTip("the first rows exactly as training sees them; highlighted tokens "
                                      "carry the loss")
        self.render_button.clicked.connect(lambda _checked=False: self.render_requested.emit())
        self.rendered = QTextEdit(self)
        self.rendered.setReadOnly(True)
        self.rendered.setMaximumHeight(120)
        self.rendered.setPlaceholderText("Render preview: the training text, loss tokens highlighted")
        self.render_status = QLabel(self)
        self.render_status.setWordWrap(True)
        self._columns: list[str] = []
        #: The panel's fields as the job last shown named them: what the job says explicitly stays
        #: said (a job read and saved back is the same job), a field of another kind stays to be flagged.
        self._loaded: dict[str, Any] = {}
        for w in (self.kind, self.eval_mode):
            w.currentIndexChanged.connect(self._update_visible)
        for box in (*self.column_boxes.values(), self.template):
            box.currentTextChanged.connect(lambda _t: self.changed.emit())
        self.kind.currentIndexChanged.connect(self._kind_changed)
        self.eval_mode.currentIndexChanged.connect(lambda _i: self.changed.emit())
        self.answers_only.toggled.connect(lambda _on: self.changed.emit())
        self.eval_fraction.valueChanged.connect(lambda _v: self.changed.emit())
        self.eval_source.textChanged.connect(lambda _t: self.changed.emit())

    def add_rows(self, form: QFormLayout) -> None:
        # One row per value: the form's column must stay as narrow as it was for a text dataset (the
        # Training tab sizes it once; a wider row would be clipped there).
        kind_row = QHBoxLayout()
        kind_row.addWidget(self.kind)
        kind_row.addStretch(1)
        form.addRow("Kind", kind_row)
        self._col_labels: dict[str, QLabel] = {}
        for field, box in self.column_boxes.items():
            label = QLabel(field, self)
            label.setToolTip(box.toolTip())
            self._col_labels[field] = label
            form.addRow(label, box)
        self._loss_label = QLabel("Loss", self)
        loss_row = QHBoxLayout()
        loss_row.addWidget(self.answers_only)
        loss_row.addStretch(1)  # the box as wide as its text: a click beside it is not a click on it
        form.addRow(self._loss_label, loss_row)
        form.addRow("Chat template", self.template)
        ev = QHBoxLayout()
        ev.addWidget(self.eval_mode)
        ev.addWidget(self.eval_fraction)
        ev.addWidget(self.eval_source, 1)
        form.addRow("Eval split", ev)
        rrow = QHBoxLayout()
        rrow.addWidget(self.render_button)
        rrow.addWidget(self.render_status, 1)
        form.addRow("", rrow)
        form.addRow("Rendered", self.rendered)
        self._form = form
        #: A preference objective (DPO, ORPO, KTO) reads its own columns: the SFT rows are hidden.
        self.preference = False
        # The rows now belong to the form's widget; this one holds no pixels and must not sit over
        # the form's top-left corner catching clicks.
        self.hide()
        self._update_visible()

    # -- values -------------------------------------------------------------------------------------

    def set_columns(self, columns: Sequence[str] | None) -> None:
        """The file's columns (from its first rows) as choices; typed text is kept."""
        self._columns = list(columns or [])
        for field, box in self.column_boxes.items():
            text = box.currentText()
            box.blockSignals(True)
            box.clear()
            box.addItems(self._columns)
            if field == "prompt" and {"instruction", "input"} <= set(self._columns):
                box.addItem("{instruction}\n\n{input}")
            box.setCurrentText(text)
            box.blockSignals(False)

    def _kind_changed(self) -> None:
        """A new kind starts from the mapping the file's columns suggest (alpaca, sharegpt, ...)."""
        kind = self.kind.currentText()
        if kind != "text" and self._columns:
            for field, spec in sft.default_columns(kind, self._columns).items():
                if not self.column_boxes[field].currentText().strip() or \
                        self.column_boxes[field].currentText() not in (*self._columns, spec):
                    self.column_boxes[field].setCurrentText(spec)
        self.changed.emit()

    def set_preference(self, on: bool) -> None:
        """A preference objective: its file's columns say what it holds (prompt, chosen, rejected), so
        the SFT kind, mapping, loss mask, chat template and render preview rows are hidden."""
        self.preference = on
        self._update_visible()

    def _update_visible(self) -> None:
        kind = self.kind.currentText()
        fields = sft.FIELDS.get(kind, ())
        if hasattr(self, "_form"):
            sft_rows = not getattr(self, "preference", False)
            for field, label in self._col_labels.items():
                self._form.setRowVisible(label, field in fields and kind != "text" and sft_rows)
            self._form.setRowVisible(self._loss_label, kind != "text" and sft_rows)
            for widget in (self.kind, self.template, self.render_button, self.rendered):
                self._form.setRowVisible(self._row_of(widget), sft_rows)
        mode = self.eval_mode.currentText()
        self.eval_fraction.setVisible(mode == "fraction")
        self.eval_source.setVisible(mode in ("file", "Hub split"))

    def _row_of(self, widget: QWidget) -> int:
        position: Any = self._form.getWidgetPosition(widget)
        row = int(position[0])
        if row < 0:
            # A widget inside a row's layout (Kind, the render button): the row that holds it.
            for index in range(self._form.rowCount()):
                item = self._form.itemAt(index, QFormLayout.ItemRole.FieldRole)
                layout = item.layout() if item is not None else None
                if layout is not None and layout.indexOf(widget) >= 0:
                    return index
        return row

    def columns(self) -> dict[str, str]:
        kind = self.kind.currentText()
        if kind == "text":
            return {}
        return {f: self.column_boxes[f].currentText().strip() for f in sft.FIELDS[kind]}

    def eval_spec(self) -> dict[str, Any]:
        mode = self.eval_mode.currentText()
        if mode == "fraction":
            return {"fraction": round(self.eval_fraction.value(), 4)}
        text = self.eval_source.text().strip()
        if mode == "file":
            return {"source": text}
        if mode == "Hub split":
            return {"split": text}
        return {}

    def training_args(self) -> dict[str, Any]:
        """The SFTConfig fields this panel owns (sft.PANEL_FIELDS), as the job stores them."""
        out: dict[str, Any] = {}
        data = self.template.currentData()
        text = self.template.currentText()
        if text.strip() and text != MODEL_TEMPLATE:
            # A listed TRL template stores its path; typed text is a path itself.
            index = self.template.findText(text)
            out["chat_template_path"] = str(self.template.itemData(index) or text) if index >= 0 \
                else text
        elif data:
            out["chat_template_path"] = str(data)
        kind = self.kind.currentText()
        checked = self.answers_only.isChecked()
        # Answers only is the default of both kinds (TRL's for prompt/completion, the worker's for
        # conversations): written when unticked, or when the job named it.
        for field, its_kind in (("completion_only_loss", "prompt_completion"),
                                ("assistant_only_loss", "conversational")):
            if kind == its_kind:
                if not checked:
                    out[field] = False
                elif self._loaded.get(field) is True:
                    out[field] = True
            elif field in self._loaded:
                out[field] = self._loaded[field]
        return out

    def set_values(self, kind: str, columns: dict[str, str], eval_spec: dict[str, Any],
                   args: dict[str, Any]) -> None:
        self._loaded = {k: args[k] for k in ("completion_only_loss", "assistant_only_loss") if k in args}
        self.kind.blockSignals(True)
        self.kind.setCurrentText(kind if kind in sft.KINDS else "text")
        self.kind.blockSignals(False)
        for field, box in self.column_boxes.items():
            box.setCurrentText(str(columns.get(field, "")))
        path = str(args.get("chat_template_path") or "")
        index = self.template.findData(path) if path else 0
        if index >= 0:
            self.template.setCurrentIndex(index)
        else:
            self.template.setCurrentText(path)
        if kind == "conversational":
            self.answers_only.setChecked(bool(args.get("assistant_only_loss", True)))
        else:
            self.answers_only.setChecked(args.get("completion_only_loss") is not False)
        if eval_spec.get("fraction"):
            self.eval_mode.setCurrentText("fraction")
            self.eval_fraction.setValue(float(eval_spec["fraction"]))
        elif eval_spec.get("source"):
            self.eval_mode.setCurrentText("file")
            self.eval_source.setText(str(eval_spec["source"]))
        elif eval_spec.get("split"):
            self.eval_mode.setCurrentText("Hub split")
            self.eval_source.setText(str(eval_spec["split"]))
        else:
            self.eval_mode.setCurrentText("none")
        self._update_visible()

    def widgets_by_field(self) -> dict[str, QWidget]:
        """Job keys (as JobConfig.validate names them) -> the widget that shows the problem."""
        out: dict[str, QWidget] = {"dataset.kind": self.kind, "dataset.eval": self.eval_mode,
                                   "dataset.eval.fraction": self.eval_fraction,
                                   "dataset.eval.source": self.eval_source,
                                   "dataset.eval.split": self.eval_source,
                                   "training_args.chat_template_path": self.template,
                                   "training_args.completion_only_loss": self.answers_only,
                                   "training_args.assistant_only_loss": self.answers_only,
                                   "dataset.columns": self.column_boxes["prompt"]}
        for field, box in self.column_boxes.items():
            out[f"dataset.columns.{field}"] = box
        return out

    # -- render preview -------------------------------------------------------------------------------

    def show_rendering(self, result: dict[str, Any]) -> None:
        """The child's answer (or a problem found before starting it); the button works again."""
        self.render_button.setEnabled(True)
        if not result.get("ok"):
            self.rendered.clear()
            self.render_status.setText(f"⚠ {result.get('message', 'the preview failed')}")
            self.render_status.setStyleSheet("color: #d62728;")
            return
        parts: list[str] = []
        rows = result.get("rows") or []
        for n, row in enumerate(rows):
            if n:
                parts.append("<hr/>")
            for text, labelled in row.get("segments", []):
                style = LOSS_STYLE if labelled else CONTEXT_STYLE
                parts.append(f'<span style="{style}">{html.escape(str(text))}</span>')
        body = "".join(parts).replace("\n", "<br/>")
        self.rendered.setHtml(f'<div style="font-family: monospace; white-space: pre-wrap;">{body}</div>')
        labelled = sum(int(r.get("labelled", 0)) for r in rows)
        tokens = sum(int(r.get("tokens", 0)) for r in rows)
        template = result.get("template", "")
        extra = " (TRL's training version)" if result.get("training_template") else ""
        split = f"train {result['train_rows']} rows" if "train_rows" in result else ""
        if result.get("eval_rows"):
            split += f", eval {result['eval_rows']} rows"
        dropped = int(result.get("dropped") or 0)
        # TRL drops a row that truncation left without an answer token: say it before training does.
        warning = (f"⚠ {dropped} of {len(rows) + dropped} rows shown have no answer left after truncation "
                   f"to max length {result.get('max_length')}: training drops them · ") if dropped else ""
        self.render_status.setStyleSheet("color: #8a5a00;" if dropped else "")
        self.render_status.setText(warning + f"{len(rows)} rows shown · loss on {result.get('loss', '')}: "
                                   f"{labelled} of {tokens} tokens (highlighted) · template: "
                                   f"{template}{extra}" + (f" · {split}" if split else ""))

    def set_rendering(self) -> None:
        """A preview child started: one at a time."""
        self.render_button.setEnabled(False)
        self.render_status.setStyleSheet("")
        self.render_status.setText("rendering with the tokenizer…")

"""The Training form on its own: a job read and saved back is the same job for every TrainingArguments
field of the installed transformers, tri-state booleans, checks at the field, the dataset preview and
its columns, the wheel guard, and the browse button clicked for real."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
from PySide6.QtCore import QPoint, QPointF, Qt
from PySide6.QtGui import QWheelEvent
from PySide6.QtWidgets import QApplication, QCheckBox, QComboBox, QFileDialog, QScrollArea, QSpinBox, QWidget

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.training_args import FieldSpec, Schema
from gaudi_gui.ui.training_form import UNSET, TrainingForm
from gaudi_gui.ui.wheel_guard import guard_wheel


@pytest.fixture
def form(qtbot, real_schema: Schema) -> TrainingForm:
    w = TrainingForm()
    qtbot.addWidget(w)
    w.set_schema(real_schema)
    return w


def samples(spec: FieldSpec) -> list[Any]:
    """Values to store for ``spec``: non-default ones of each type it takes, and its default set
    explicitly (a job names it)."""
    default = spec.default
    out: list[Any] = []
    if spec.kind == "bool":
        out = [True, False] if default is None else [not default]
    elif spec.kind == "int":
        out = [7 if default is None else default + 5, -3]
    elif spec.kind == "float":
        out = [0.125, 3, 1e-7]
    elif spec.kind == "enum":
        out = [c for c in spec.choices if c != default] + ["not-a-choice"]
    elif spec.kind == "list":
        out = [["a", "b"], ["one, two"]] if default == [] else [["a", "b"], []]
    elif spec.kind == "dict":
        out = [{"k": True}, {}]
    else:
        out = ["some text", "with spaces inside"]
        accepts = spec.accepts or ()
        if "dict" in accepts:
            out += [{"power": 2}, '{"power": 2}']
        if "list" in accepts:
            out += [["x", "y"], "[1]"]
        if "bool" in accepts:
            out += [True, False, "true"]
        if spec.mixed:
            out += [" padded", '"quoted"']
    out = [v for v in out if not (v == default and type(v) is type(default))]
    if default is not None:
        out.append(default)
    return out


def round_trip(form: TrainingForm, job: JobConfig) -> dict[str, Any]:
    form.set_job(job)
    again, errors = form.job()
    assert errors == []
    return again.to_dict()


def test_every_field_round_trips(form: TrainingForm, real_schema: Schema, tmp_path: Path) -> None:
    # Another test of the same session may have imported them; the form itself must not.
    already = {m for m in ("transformers", "torch") if m in sys.modules}
    base = {"output_dir": str(tmp_path / "out")}
    count = 0
    everything: dict[str, Any] = {}
    for spec in real_schema.fields.values():
        for value in samples(spec):
            job = JobConfig(training_args={**base, spec.name: value})
            assert round_trip(form, job) == job.to_dict(), (spec.name, value)
            count += 1
        everything[spec.name] = samples(spec)[0]
    assert count > 300
    # All fields at once, and fields the form has no editor for (name, split, a removed argument).
    job = JobConfig(name="mine", resume_from_checkpoint="latest", method="lora",
                    training_args={**everything, "warmup_ratio": 0.1})
    job.dataset.split = "validation"
    job.lora.target_modules = ["q_proj", "v_proj"]
    job.launch.num_processes = 4
    assert round_trip(form, job) == job.to_dict()
    # An empty job stays empty: nothing is written for fields the user never touched.
    assert round_trip(form, JobConfig()) == JobConfig().to_dict()
    assert {m for m in ("transformers", "torch") if m in sys.modules} == already


def test_optional_bools_are_tri_state(qtbot, form: TrainingForm, real_schema: Schema) -> None:
    optional = [s.name for s in real_schema.fields.values() if s.kind == "bool" and s.default is None]
    assert {"tf32", "greater_is_better", "gradient_checkpointing", "ddp_find_unused_parameters",
            "disable_tqdm"} <= set(optional)
    form.set_job(JobConfig(training_args={"output_dir": "o"}))
    assert form.job()[0].training_args == {"output_dir": "o"}
    combo = form.editors["tf32"].editor
    assert isinstance(combo, QComboBox)
    assert [combo.itemText(i) for i in range(combo.count())] == ["(default)", "true", "false"]
    with qtbot.waitSignal(form.changed, timeout=1000):
        combo.setCurrentIndex(combo.findText("false"))
    assert form.job()[0].training_args == {"output_dir": "o", "tf32": False}
    combo.setCurrentIndex(0)
    assert "tf32" not in form.job()[0].training_args
    # A plain bool is a check box: written when it differs from the default, or the job named it.
    box = form.editors["bf16"].editor
    assert isinstance(box, QCheckBox)
    box.setChecked(True)
    assert form.job()[0].training_args["bf16"] is True
    box.setChecked(False)
    assert "bf16" not in form.job()[0].training_args
    form.set_job(JobConfig(training_args={"output_dir": "o", "use_cpu": False}))
    assert form.job()[0].training_args == {"output_dir": "o", "use_cpu": False}
    assert form.editors["use_cpu"].value() is False and form.editors["bf16"].value() is UNSET


def test_enum_default_choice_and_text_defaults(form: TrainingForm) -> None:
    form.set_job(JobConfig(training_args={"output_dir": "o"}))
    combo = form.editors["save_strategy"].editor
    assert isinstance(combo, QComboBox)
    assert combo.currentText() == "(default: steps)"
    combo.setCurrentIndex(combo.findText("steps"))
    assert form.job()[0].training_args["save_strategy"] == "steps"  # set explicitly: written
    line = form.editors["logging_steps"].editor
    assert line.placeholderText() == "default: 500"  # type: ignore[attr-defined]
    assert "logging_steps" not in form.job()[0].training_args


def check_fields(form: TrainingForm) -> dict[str, str]:
    return dict(form.check()[1])


def test_negative_steps_and_nothing_to_train_are_flagged(form: TrainingForm, tmp_path: Path) -> None:
    form.set_job(JobConfig(training_args={"output_dir": str(tmp_path)}))
    assert check_fields(form) == {}
    for name in ("save_steps", "logging_steps", "eval_steps"):
        form.editors[name].editor.setText("-1")  # type: ignore[attr-defined]
    form.editors["max_steps"].editor.setText("-5")  # type: ignore[attr-defined]
    form.editors["num_train_epochs"].editor.setText("0")  # type: ignore[attr-defined]
    problems = check_fields(form)
    for name in ("save_steps", "logging_steps", "eval_steps", "max_steps", "num_train_epochs"):
        assert f"training_args.{name}" in problems, name
        assert "background" in form.editors[name].editor.styleSheet()
        assert form.editors[name].editor.toolTip() == problems[f"training_args.{name}"]
    assert "nothing to train" in problems["training_args.num_train_epochs"]
    form.editors["max_steps"].editor.setText("-1")  # type: ignore[attr-defined]
    assert "training_args.num_train_epochs" in check_fields(form)
    form.editors["max_steps"].editor.setText("10")  # type: ignore[attr-defined]
    for name in ("save_steps", "logging_steps", "eval_steps"):
        form.editors[name].editor.setText("0")  # type: ignore[attr-defined]
    assert check_fields(form) == {}
    assert form.editors["max_steps"].editor.styleSheet() == ""


def test_valid_combinations_are_not_flagged_in_the_gui(form: TrainingForm, tmp_path: Path) -> None:
    for args in ({"bf16": True, "use_cpu": True},
                 {"load_best_model_at_end": True, "eval_strategy": "steps", "save_strategy": "steps"},
                 {"warmup_steps": 0.1, "max_steps": 0, "num_train_epochs": 1}):
        job = JobConfig(training_args={"output_dir": str(tmp_path), **args})
        job.dataset.eval = {"fraction": 0.1}  # eval_strategy needs an eval split (flagged without one)
        form.set_job(job)
        assert check_fields(form) == {}, args


def test_eval_strategy_without_an_eval_split_is_flagged_at_the_field(form: TrainingForm,
                                                                       tmp_path: Path) -> None:
    form.set_job(JobConfig(training_args={"output_dir": str(tmp_path), "eval_strategy": "steps"}))
    problems = check_fields(form)
    assert "needs an eval split" in problems["training_args.eval_strategy"]
    assert "background" in form.editors["eval_strategy"].editor.styleSheet()


def test_text_column_checked_against_the_preview(qtbot, form: TrainingForm, tmp_path: Path) -> None:
    data = tmp_path / "rows.jsonl"
    data.write_text('{"prompt": "a", "completion": "b"}\n{"prompt": "c", "completion": "d", "id": 2}\n')
    form.set_job(JobConfig(training_args={"output_dir": str(tmp_path)}))
    form.dataset.setText(str(data))
    assert form.preview.toPlainText().splitlines()[0] == "columns: prompt, completion, id"
    assert '"prompt": "a"' in form.preview.toPlainText()
    problems = check_fields(form)
    assert "no column 'text'" in problems["dataset.text_column"]
    assert "background" in form.column.styleSheet()
    assert form.column.toolTip() == problems["dataset.text_column"]
    form.column.setText("prompt")
    assert check_fields(form) == {}
    assert form.column.styleSheet() == ""
    table = tmp_path / "rows.csv"
    table.write_text("\ufefftext,label\nhello,1\n")
    form.dataset.setText(str(table))
    assert form.preview.toPlainText().startswith("columns: text, label")
    assert "dataset.text_column" in check_fields(form)
    form.column.setText("text")
    assert check_fields(form) == {}
    array = tmp_path / "rows.json"
    array.write_text(json.dumps([{"body": "x"}, {"body": "y"}]))
    form.dataset.setText(str(array))
    assert "'text'" in check_fields(form)["dataset.text_column"]
    # A plain text file has the one column "text"; a Hub id is not checked offline.
    plain = tmp_path / "corpus.txt"
    plain.write_text("line one\nline two\n")
    form.dataset.setText(str(plain))
    form.column.setText("body")
    assert "dataset.text_column" in check_fields(form)
    form.dataset.setText("someone/some-dataset")
    assert "dataset.text_column" not in check_fields(form)


def test_browse_button_fills_dataset_and_preview(qtbot, form: TrainingForm, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "picked.jsonl"
    data.write_text('{"text": "picked row"}\n')
    asked: list[str] = []

    def fake_dialog(parent: QWidget, caption: str, folder: str, filters: str) -> tuple[str, str]:
        asked.append(caption)
        return str(data), filters

    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(fake_dialog))
    form.show()
    qtbot.mouseClick(form.browse, Qt.MouseButton.LeftButton)
    assert asked == ["Dataset file"]
    assert form.dataset.text() == str(data)
    assert form.preview.toPlainText() == 'columns: text\n{"text": "picked row"}'
    # Cancel leaves the field as it was.
    monkeypatch.setattr(QFileDialog, "getOpenFileName", staticmethod(lambda *a: ("", "")))
    qtbot.mouseClick(form.browse, Qt.MouseButton.LeftButton)
    assert form.dataset.text() == str(data)


def wheel(widget: QWidget, steps: int = -1) -> None:
    """A real wheel event at the widget's centre (one notch = 120; negative scrolls down)."""
    pos = QPointF(widget.rect().center())
    event = QWheelEvent(pos, QPointF(widget.mapToGlobal(pos.toPoint())), QPoint(0, 0),
                        QPoint(0, 120 * steps), Qt.MouseButton.NoButton, Qt.KeyboardModifier.NoModifier,
                        Qt.ScrollPhase.NoScrollPhase, False)
    QApplication.sendEvent(widget, event)


def test_wheel_changes_only_focused_combos_and_spins(qtbot, real_schema: Schema) -> None:
    scroll = QScrollArea()
    qtbot.addWidget(scroll)  # owns the form, as the Training tab's scroll area does
    form = TrainingForm()
    form.set_schema(real_schema)
    scroll.setWidgetResizable(True)
    scroll.setWidget(form)
    scroll.resize(700, 400)
    scroll.show()
    qtbot.waitExposed(scroll)
    combo = form.editors["save_strategy"].editor
    assert isinstance(combo, QComboBox)
    combo.setCurrentIndex(combo.findText("steps"))
    bar = scroll.verticalScrollBar()
    bar.setValue(0)
    scroll.ensureWidgetVisible(combo)
    before = bar.value()
    assert before > 0  # the form scrolled down to the combo: a wheel up can scroll it back
    assert combo.focusPolicy() == Qt.FocusPolicy.StrongFocus and not combo.hasFocus()
    wheel(combo, steps=1)
    assert combo.currentText() == "steps"
    assert bar.value() < before  # the scroll area scrolled instead
    spin = form.max_length
    assert isinstance(spin, QSpinBox) and spin.focusPolicy() == Qt.FocusPolicy.StrongFocus
    value = spin.value()
    wheel(spin, steps=1)
    assert spin.value() == value
    # Focused (clicked or tabbed into): the wheel changes the value as usual.
    combo.setFocus()
    qtbot.waitUntil(combo.hasFocus, timeout=2000)
    wheel(combo)
    assert combo.currentText() != "steps"
    spin.setFocus()
    qtbot.waitUntil(spin.hasFocus, timeout=2000)
    wheel(spin, steps=1)
    assert spin.value() == value + 1


def test_guard_wheel_is_reusable_and_idempotent(qtbot) -> None:
    root = QWidget()
    qtbot.addWidget(root)
    combo = QComboBox(root)
    combo.addItems(["a", "b", "c"])
    first = guard_wheel(root)
    late = QSpinBox(root)  # added after the first call
    assert guard_wheel(root) is first
    assert late.focusPolicy() == Qt.FocusPolicy.StrongFocus
    root.show()
    qtbot.waitExposed(root)
    wheel(combo)
    wheel(late, steps=1)
    assert combo.currentText() == "a" and late.value() == 0

"""The dataset part of the Training form (kind, column mapping, chat template, answers-only loss, eval
split, render preview) driven the way a user drives it: combo items chosen by clicking their popup's
rows, text typed with keys, buttons clicked. The render preview runs the real child (tokenizer + TRL's
dataset preparation) on the tiny model with Qwen2.5's chat template."""
# mypy: disable-error-code="union-attr"

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt
from PySide6.QtWidgets import QAbstractButton, QComboBox, QWidget

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.training_args import Schema
from gaudi_gui.ui.dataset_panel import LOSS_STYLE, MODEL_TEMPLATE
from gaudi_gui.ui.training_form import TrainingForm
from tests.helpers import ALPACA, click, write_jsonl

SHAREGPT = [
    {"conversations": [{"from": "human", "value": "Sky?"}, {"from": "gpt", "value": "Blue."}]},
    {"conversations": [{"from": "human", "value": "Grass?"}, {"from": "gpt", "value": "Green."}]},
    {"conversations": [{"from": "human", "value": "Snow?"}, {"from": "gpt", "value": "White."}]},
]
RENDER_TIMEOUT_MS = 180000


def choose(qtbot, combo: QComboBox, text: str) -> None:
    """Open the combo's popup with a click (on the arrow of an editable one), walk to the row with the
    arrow keys and press Return. (A click on a row right after the popup opened is ignored by Qt,
    which blocks releases for a double-click interval: keys are the reliable way in a test.)"""
    index = combo.findText(text)
    assert index >= 0, (text, [combo.itemText(i) for i in range(combo.count())])
    view = combo.view()
    arrow = QPoint(combo.width() - 6, combo.height() // 2) if combo.isEditable() else None
    click(qtbot, combo, arrow)
    qtbot.waitUntil(view.isVisible, timeout=5000)
    row = view.currentIndex().row()
    key = Qt.Key.Key_Down if index > row else Qt.Key.Key_Up
    for _ in range(abs(index - max(row, 0)) + (1 if row < 0 else 0)):
        qtbot.keyClick(view, key)
    assert view.currentIndex().row() == index
    qtbot.keyClick(view, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: not view.isVisible(), timeout=5000)
    assert combo.currentText() == text


def type_into(qtbot, widget: QWidget, text: str) -> None:
    """Click into a line edit (or an editable combo's), select what it holds and type ``text``."""
    edit = widget.lineEdit() if isinstance(widget, QComboBox) else widget
    assert edit is not None
    click(qtbot, edit)
    qtbot.keyClick(edit, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClick(edit, Qt.Key.Key_Delete)
    qtbot.keyClicks(edit, text)


def flagged(widget: QWidget) -> bool:
    return "background" in widget.styleSheet()


@pytest.fixture
def form(qtbot, real_schema: Schema, tmp_path: Path) -> Iterator[TrainingForm]:
    w = TrainingForm()
    qtbot.addWidget(w)
    w.set_schema(real_schema)
    w.set_job(JobConfig(training_args={"output_dir": str(tmp_path / "out"), "use_cpu": True}))
    w.resize(900, w.sizeHint().height())
    w.show()
    qtbot.waitExposed(w)
    yield w
    w.shutdown()


def test_prompt_completion_mapped_from_the_file_and_checked_at_the_fields(qtbot, form: TrainingForm,
                                                                           tmp_path: Path) -> None:
    panel = form.dataset_panel
    data = write_jsonl(tmp_path / "alpaca.jsonl", ALPACA)
    type_into(qtbot, form.dataset, str(data))
    assert form.preview.toPlainText().splitlines()[0] == "columns: instruction, input, output"
    # The text kind has no mapping rows; prompt_completion shows prompt and completion only.
    assert not panel.column_boxes["prompt"].isVisible() and form.column.isEnabled()
    choose(qtbot, panel.kind, "prompt_completion")
    prompt, completion = panel.column_boxes["prompt"], panel.column_boxes["completion"]
    assert prompt.isVisible() and completion.isVisible() and not panel.column_boxes["messages"].isVisible()
    assert not form.column.isEnabled()  # the text column is for the text kind
    # The file's columns are the choices; alpaca's shape is the starting mapping.
    assert [prompt.itemText(i) for i in range(prompt.count())] == ["instruction", "input", "output",
                                                                  "{instruction}\n\n{input}"]
    assert panel.columns() == {"prompt": "{instruction}\n\n{input}", "completion": "output"}
    choose(qtbot, prompt, "instruction")
    assert form.job()[0].dataset.columns == {"prompt": "instruction", "completion": "output"}
    # Answers-only loss is the default of the kind (TRL's completion_only_loss); unticked, it is written.
    assert panel.answers_only.isChecked() and "completion_only_loss" not in form.job()[0].training_args
    click(qtbot, panel.answers_only)
    assert form.job()[0].training_args["completion_only_loss"] is False
    click(qtbot, panel.answers_only)
    assert "completion_only_loss" not in form.job()[0].training_args

    # A column the file lacks: marked at its field, naming the columns there are; no child starts.
    type_into(qtbot, prompt, "question")
    click(qtbot, panel.render_button)
    assert flagged(prompt) and not flagged(completion)
    assert "'question'" in prompt.toolTip() and "instruction, input, output" in prompt.toolTip()
    assert "instruction, input, output" in panel.render_status.text()
    assert not form.renderer.is_running() and panel.render_button.isEnabled()
    choose(qtbot, prompt, "instruction")

    # eval_strategy without an eval split is refused at its field; an eval fraction clears it.
    strategy = form.editors["eval_strategy"].editor
    assert isinstance(strategy, QComboBox)
    choose(qtbot, strategy, "steps")
    form.check()
    assert flagged(strategy) and "needs an eval split" in strategy.toolTip()
    assert not panel.eval_fraction.isVisible()
    choose(qtbot, panel.eval_mode, "fraction")
    assert panel.eval_fraction.isVisible() and not panel.eval_source.isVisible()
    type_into(qtbot, panel.eval_fraction, "0.25")
    job, problems = form.check()
    assert problems == [] and not flagged(strategy) and not flagged(prompt)
    assert job.dataset.kind == "prompt_completion" and job.dataset.eval == {"fraction": 0.25}
    # A Hub split is for a Hub dataset: marked at the field for a file.
    choose(qtbot, panel.eval_mode, "Hub split")
    type_into(qtbot, panel.eval_source, "test")
    assert form.job()[0].dataset.eval == {"split": "test"}
    assert "for a Hub dataset" in dict(form.check()[1])["dataset.eval.split"]
    assert flagged(panel.eval_source)
    # The job reads back into the same form.
    choose(qtbot, panel.eval_mode, "fraction")
    job = form.job()[0]
    form.set_job(JobConfig())
    assert panel.kind.currentText() == "text"
    form.set_job(job)
    assert form.job()[0].to_dict() == job.to_dict()


def test_render_preview_highlights_the_answer_tokens(qtbot, form: TrainingForm, tmp_path: Path,
                                                     chat_model_dir: Path) -> None:
    panel = form.dataset_panel
    data = write_jsonl(tmp_path / "alpaca.jsonl", ALPACA)
    type_into(qtbot, form.model, str(chat_model_dir))
    type_into(qtbot, form.dataset, str(data))
    choose(qtbot, panel.kind, "prompt_completion")
    choose(qtbot, panel.eval_mode, "fraction")
    type_into(qtbot, panel.eval_fraction, "0.25")
    assert panel.template.currentText() == MODEL_TEMPLATE
    # Qwen2.5's template adds a system prompt: at the form's first max length (32) no answer token is
    # left after truncation, and TRL would drop every row. The preview says so.
    assert form.max_length.value() == 32
    with qtbot.waitSignal(form.renderer.finished, timeout=RENDER_TIMEOUT_MS) as answered:
        click(qtbot, panel.render_button)
        assert not panel.render_button.isEnabled()  # one preview at a time
    assert not answered.args[0]["ok"] and answered.args[0]["field"] == "dataset.max_length"
    assert "raise the max length" in panel.render_status.text()
    assert panel.render_status.text().startswith("⚠") and panel.render_button.isEnabled()
    assert flagged(form.max_length) and "raise the max length" in form.max_length.toolTip()
    type_into(qtbot, form.max_length, "128")
    assert form.job()[0].dataset.max_length == 128
    with qtbot.waitSignal(form.renderer.finished, timeout=RENDER_TIMEOUT_MS) as answered:
        click(qtbot, panel.render_button)
    result = answered.args[0]
    assert result["ok"], result
    qtbot.waitUntil(lambda: "loss on" in panel.render_status.text(), timeout=5000)
    status = panel.render_status.text()
    assert "loss on completion tokens only" in status and "train 6 rows, eval 2 rows" in status, status
    assert panel.render_button.isEnabled() and not flagged(form.max_length)
    html = panel.rendered.toHtml()
    text = panel.rendered.toPlainText()
    assert "<|im_start|>user" in text and "<|im_start|>assistant" in text
    # The answer, and only the answer, is drawn in the loss colour.
    loss_colour = LOSS_STYLE.split("background:")[1].split(";")[0].strip()
    assert loss_colour in html
    marked = [t for row in result["rows"] for t, on in row["segments"] if on]
    answers = {r["output"] for r in ALPACA}
    assert marked and all(t.removesuffix("<|im_end|>\n") in answers for t in marked)
    for row in result["rows"]:
        assert not any(r["instruction"] in t for t, on in row["segments"] if on for r in ALPACA)
    assert all(t.removesuffix("<|im_end|>\n") in text for t in marked)


def test_sharegpt_conversation_with_an_eval_file_renders_assistant_turns(
        qtbot, form: TrainingForm, tmp_path: Path, chat_model_dir: Path) -> None:
    panel = form.dataset_panel
    share = write_jsonl(tmp_path / "sharegpt.jsonl", SHAREGPT)
    held_out = write_jsonl(tmp_path / "held-out.jsonl", SHAREGPT[:1])
    type_into(qtbot, form.model, str(chat_model_dir))
    type_into(qtbot, form.dataset, str(share))
    choose(qtbot, panel.kind, "conversational")
    type_into(qtbot, form.max_length, "128")
    assert panel.column_boxes["messages"].currentText() == "conversations"  # sharegpt's shape
    assert panel.answers_only.isChecked()
    assert "assistant_only_loss" not in form.job()[0].training_args  # the default: answers only
    choose(qtbot, panel.eval_mode, "file")
    type_into(qtbot, panel.eval_source, str(held_out))
    # TRL's training version of Qwen2.5's template, chosen from the list.
    label = next(panel.template.itemText(i) for i in range(panel.template.count())
                 if panel.template.itemText(i).startswith("qwen2_5 "))
    choose(qtbot, panel.template, label)
    assert form.job()[0].training_args["chat_template_path"].endswith("qwen2_5_training.jinja")
    with qtbot.waitSignal(form.renderer.finished, timeout=RENDER_TIMEOUT_MS) as answered:
        click(qtbot, panel.render_button)
    result = answered.args[0]
    assert result["ok"], result
    status = panel.render_status.text()
    assert "loss on assistant tokens only" in status and "eval 1 rows" in status, status
    labelled = ["".join(t for t, on in row["segments"] if on) for row in result["rows"]]
    for row, said in zip(labelled, SHAREGPT, strict=False):
        assert said["conversations"][1]["value"] in row and said["conversations"][0]["value"] not in row
    assert "Blue." in panel.rendered.toPlainText()


def test_render_preview_failure_is_said_in_the_panel(qtbot, form: TrainingForm, tmp_path: Path,
                                                     demo_model: Path) -> None:
    """The demo model's chat template has no {% generation %} markers and TRL has no training version
    of it: assistant-only loss cannot find the answers; the panel says what to choose instead (the
    child's answer, not a traceback)."""
    panel = form.dataset_panel
    share = write_jsonl(tmp_path / "sharegpt.jsonl", SHAREGPT)
    type_into(qtbot, form.dataset, str(share))
    choose(qtbot, panel.kind, "conversational")
    with qtbot.waitSignal(form.renderer.finished, timeout=RENDER_TIMEOUT_MS) as answered:
        click(qtbot, panel.render_button)
    assert not answered.args[0]["ok"]
    assert panel.render_status.text().startswith("⚠")
    assert "chat template" in panel.render_status.text() and "Traceback" not in panel.render_status.text()
    assert panel.rendered.toPlainText() == "" and panel.render_button.isEnabled()


def test_every_panel_button_is_a_real_button(form: TrainingForm) -> None:
    """The buttons this file clicks are all the panel has (a new one needs a test that clicks it)."""
    panel = form.dataset_panel
    buttons = {b.text() for b in form.findChildren(QAbstractButton)
               if any(b is w for w in vars(panel).values())}
    assert buttons == {"Render preview", "loss on answers only"}


def test_a_template_that_does_not_render_every_preview_row_is_refused_at_its_field(
        qtbot, form: TrainingForm, tmp_path: Path) -> None:
    """The preview rows are rendered with the worker's own function as the user types: a nested format
    field naming a column the file lacks, or a format code the text does not take, is marked at the
    prompt field with the reason, and the render child never starts."""
    panel = form.dataset_panel
    type_into(qtbot, form.dataset, str(write_jsonl(tmp_path / "alpaca.jsonl", ALPACA)))
    choose(qtbot, panel.kind, "prompt_completion")
    prompt = panel.column_boxes["prompt"]
    for template, reason in (("{instruction!r:>{width}}", "no column 'width'"),
                             ("{instruction:d}", "Unknown format code 'd'"),
                             ("{instruction.upper}", "is not a column name")):
        type_into(qtbot, prompt, template)
        click(qtbot, panel.render_button)
        qtbot.waitUntil(lambda: flagged(prompt))
        assert reason in prompt.toolTip() and reason in panel.render_status.text(), prompt.toolTip()
        assert not form.renderer.is_running() and panel.render_button.isEnabled()
    # Every preview row renders: the field is clear again.
    type_into(qtbot, prompt, "Q: {instruction!r:>12} {input}")
    _job, problems = form.check()
    assert problems == [] and not flagged(prompt)

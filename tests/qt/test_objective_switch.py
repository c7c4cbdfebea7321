"""The Training form's objective switch (issue 41), clicked: DPO/ORPO/KTO show their config class's own
fields (from the installed trl) and hide SFT's, the dataset preview says which columns the objective
took, a file without what it needs is marked at the dataset field, and the job keeps the objective."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt

from gaudi_gui.core.training_args import Schema
from gaudi_gui.ui.training_form import TrainingForm
from tests.helpers import choose, click, write_jsonl


def test_the_objective_switch_shows_the_objectives_fields(qtbot, real_schema: Schema, tmp_path: Path) -> None:
    form = TrainingForm()
    qtbot.addWidget(form)
    form.set_schema(real_schema)
    form.resize(900, 1400)
    with qtbot.waitActive(form, timeout=20000):  # a field clicked takes the focus
        form.show()
    assert "packing" in form.editors and "beta" not in form.editors
    assert form.dataset_panel.kind.isVisible()

    choose(qtbot, form.objective, "dpo")
    qtbot.waitUntil(lambda: "beta" in form.editors and form.editors["beta"].isVisible(), timeout=5000)
    assert "packing" not in form.editors and "completion_only_loss" not in form.editors
    assert form.editors["beta"].spec.default == 0.1 and "loss_type" in form.editors
    assert "DPOConfig" in form.schema_status.text()
    # The SFT dataset rows (kind, mapping, chat template, render preview) are not a DPO job's.
    qtbot.waitUntil(lambda: not form.dataset_panel.kind.isVisible(), timeout=5000)
    assert not form.dataset_panel.render_button.isVisible() and not form.column.isEnabled()
    preview = form.preview.toPlainText().splitlines()
    assert preview[0] == "DPO took columns prompt, chosen, rejected (plain text)"
    assert len(preview) == 2 + 3  # what it took, the columns, three rows
    job, errors = form.check()
    assert job.objective == "dpo" and job.to_dict()["objective"] == "dpo" and not errors, errors

    # A file without a rejected column: refused at the dataset field, naming the objective.
    pairs = write_jsonl(tmp_path / "pairs.jsonl", [{"prompt": "Q?", "chosen": "A."}] * 4)
    click(qtbot, form.dataset)
    qtbot.keyClick(form.dataset, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClicks(form.dataset, str(pairs))
    message = "DPO needs a 'rejected' column; this file has prompt, chosen"
    qtbot.waitUntil(lambda: message in form.preview.toPlainText(), timeout=5000)
    _job, errors = form.check()
    assert ("dataset.source", message) in errors and form.dataset.toolTip() == message

    choose(qtbot, form.objective, "kto")
    qtbot.waitUntil(lambda: "desirable_weight" in form.editors, timeout=5000)
    assert "KTO needs a 'rejected' column" in form.preview.toPlainText()
    assert form.editors["train_sampling_strategy"].spec.default == "sequential"

    choose(qtbot, form.objective, "sft")
    qtbot.waitUntil(lambda: "packing" in form.editors and form.dataset_panel.kind.isVisible(), timeout=5000)
    assert "beta" not in form.editors and form.column.isEnabled()
    assert "objective" not in form.job()[0].to_dict()  # absent means SFT, as an SFT job file always was


def test_align_with_preferences_on_a_finished_sft_run_fills_the_form_with_dpo(qtbot, tmp_path: Path) -> None:
    """Runs → a finished SFT run → "Align with preferences…" (clicked): the form is a DPO job that
    starts from that run's final model; a run that is not one says so at the tab."""
    from tests.helpers import close_training_tab, run_history, training_tab

    root = tmp_path / "runs"
    newest = run_history(root, 3)[0]  # their job's output folder: runs/out
    final = root / "out" / "final"
    final.mkdir(parents=True)
    (final / "config.json").write_text("{}")
    services, tab = training_tab(qtbot, tmp_path)
    try:
        click(qtbot, tab.views.tabBar(), tab.views.tabBar().tabRect(1).center())
        qtbot.waitUntil(lambda: tab.views.currentWidget() is tab.runs)
        click(qtbot, tab.runs.buttons["Refresh"])
        table = tab.runs.table
        qtbot.waitUntil(lambda: table.rowCount() >= 3)
        rows = {table.item(r, 0).text(): r for r in range(table.rowCount())}  # type: ignore[union-attr]
        table.selectRow(rows[newest])
        click(qtbot, tab.runs.buttons["Align with preferences…"])
        qtbot.waitUntil(lambda: tab.form.objective.currentData() == "dpo", timeout=10000)
        assert "form filled: DPO from" in tab.status.text() and "(final/)" in tab.status.text()
        job, _errors = tab.form.check()
        assert job.objective == "dpo" and job.model == str(final) and job.method == "full"
    finally:
        close_training_tab(services, tab)

"""The Runs list keeps its selection by run, shows new runs and moving steps by itself (issue 25,
item 3), and the Training form says at the output folder that it holds another run's files (item 1)."""
# mypy: disable-error-code="union-attr"

from __future__ import annotations

import json
from pathlib import Path

from gaudi_gui.core import outputs
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import RunStore
from gaudi_gui.ui.training_runs import RunsTable
from tests.helpers import click


def _row_of(table: RunsTable, name: str) -> int:
    return next(r for r in range(table.table.rowCount()) if table.table.item(r, 0).text().startswith(name))


def _click_row(qtbot, table: RunsTable, row: int) -> None:
    rect = table.table.visualRect(table.table.model().index(row, 0))
    click(qtbot, table.table.viewport(), rect.center())


def test_selection_follows_the_run_when_a_new_one_appears_on_top(qtbot, tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    first = store.create(JobConfig(name="first", training_args={"output_dir": str(tmp_path / "a")}))
    second = store.create(JobConfig(name="second", training_args={"output_dir": str(tmp_path / "b")}))
    table = RunsTable(store)
    qtbot.addWidget(table)
    table.resize(900, 500)
    table.show()
    qtbot.waitExposed(table)
    assert table.table.rowCount() == 2
    _click_row(qtbot, table, _row_of(table, first.name))
    assert table.selected_runs() == [first]

    # A run started elsewhere (the CLI, another window): it appears on top without Refresh, and the
    # highlight stays on the run the user picked.
    third = store.create(JobConfig(name="third", training_args={"output_dir": str(tmp_path / "c")}))
    qtbot.waitUntil(lambda: table.table.rowCount() == 3, timeout=10000)
    assert table.selected_runs() == [first]
    selected_rows = {i.row() for i in table.table.selectedIndexes()}
    assert selected_rows == {_row_of(table, first.name)}
    # Resume (clicked) acts on that run, not on whatever now sits in its old row.
    with qtbot.waitSignal(table.resume_requested, timeout=2000) as resumed:
        click(qtbot, table.buttons["Resume"])
    assert resumed.args[0] == first
    # A running run's step moves on its own.
    third.update_status(state="running", step=7, max_steps=40)
    qtbot.waitUntil(lambda: table.table.item(_row_of(table, third.name), 4).text() == "7/40", timeout=10000)
    assert table.selected_runs() == [first]
    assert second in [table._runs[r] for r in range(3)]
    table.hide()
    assert not table._watch.isActive()  # a hidden list does not poll


def test_the_form_says_at_the_output_folder_that_it_holds_another_run(qtbot, tmp_path: Path) -> None:
    from gaudi_gui.app import create_services
    from gaudi_gui.ui.training_tab import TrainingTab
    from tests.helpers import set_arg

    store = RunStore(tmp_path / "runs")
    out = tmp_path / "out"
    owner = store.create(JobConfig(name="owner", training_args={"output_dir": str(out)}))
    outputs.claim(out, owner)
    ck = out / "checkpoint-10"
    ck.mkdir()
    (ck / "trainer_state.json").write_text(json.dumps({"global_step": 10}))

    services = create_services()
    services.training.store = store
    tab = TrainingTab(services)
    qtbot.addWidget(tab)
    tab.resize(1400, 900)
    tab.show()
    qtbot.waitExposed(tab)
    qtbot.waitUntil(lambda: tab.form.schema is not None, timeout=60000)
    editor = tab.form.editors["output_dir"].editor
    assert "folder of its own" in editor.placeholderText()  # empty is the default
    set_arg(tab, "output_dir", str(out))
    click(qtbot, tab.btn["Start"])
    assert tab.status.text().startswith("cannot start")
    assert owner.name in editor.toolTip() and str(out) in editor.toolTip()
    assert tab.job.run is None and len(store.runs()) == 1
    # Ticked "overwrite" (clicked): no problem at the field any more.
    box = tab.form.overwrite_output
    assert box is not None and not box.isChecked()
    click(qtbot, box)
    assert box.isChecked()
    job, errors = tab.current_job()
    assert job.overwrite_output and not [e for e in errors if e[0] == "training_args.output_dir"]
    assert editor.toolTip() == ""
    tab.shutdown()
    services.training.shutdown()

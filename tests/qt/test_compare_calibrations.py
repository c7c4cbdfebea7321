"""Compare of FP8 calibrations (issue 39: "comparable in Compare"), clicked in Training → Runs: two
calibrations of one model on this CPU with other prompts and rows are the same model measured
differently (the rows that differ marked, and the sentence says to evaluate each); one measured on
Gaudi 2 is not interchangeable with them; a calibration with a training run cannot be compared. No INC
runs: the run folders are written as a calibration leaves them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from gaudi_gui.core import jobkind
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, RunStore
from gaudi_gui.ui.fp8_compare import DIFFERS, CalibrationCompare
from gaudi_gui.ui.training_runs import RunsTable
from tests.helpers import click, model_folder, write_calibration


def _calibration(root: Path, name: str, model: Path, started: float, **manifest: Any) -> Run:
    run = jobkind.create("calibrate", name, ["calibrate"], runs_dir=str(root)).run
    write_calibration(run.folder, model, **manifest)
    run.update_status(state="finished", exit_code=0, started_at=started)
    return run


def test_compare_calibrations_by_clicks(qtbot: QtBot, tmp_path: Path) -> None:
    model = model_folder(tmp_path / "model")
    store = RunStore(tmp_path / "runs")
    first = _calibration(store.root, "calibrate-a", model, 1_000_000.0)
    other = _calibration(store.root, "calibrate-b", model, 1_000_001.0, rows=64,
                         prompts_sha256="sha256:" + "ab" * 32)
    gaudi2 = _calibration(store.root, "calibrate-g2", model, 1_000_002.0, device="hpu", generation="gaudi2")
    trained = store.create(JobConfig(training_args={"output_dir": str(tmp_path / "out")}))
    trained.update_status(state="finished", started_at=1_000_003.0)

    table = RunsTable(store)
    qtbot.addWidget(table)
    table.resize(1024, 600)
    with qtbot.waitExposed(table):
        table.show()
    try:
        rows = {found.name: r for r in range(table.table.rowCount())
                if (found := table._run_at(r)) is not None}

        def select(*names: str) -> None:
            view = table.table
            for k, name in enumerate(names):
                at = view.visualRect(view.model().index(rows[name], 0)).center()
                modifier = Qt.KeyboardModifier.ControlModifier if k else Qt.KeyboardModifier.NoModifier
                qtbot.mouseClick(view.viewport(), Qt.MouseButton.LeftButton, modifier, at)
            assert sorted(r.name for r in table.selected_runs()) == sorted(names)

        # The same model on this CPU, other prompts and rows: oldest first, the differences marked.
        select(other.name, first.name)
        assert table.buttons["Compare"].isEnabled()
        click(qtbot, table.buttons["Compare"])
        view = table.fp8_compare
        assert isinstance(view, CalibrationCompare)
        qtbot.waitUntil(view.isVisible)
        shown = view.rows()
        assert shown["Model"] == [str(model)] * 2 and shown["Measured on"] == ["cpu", "cpu"]
        assert shown["Rows"] == ["2", "64"] and shown["Prompts (sha256)"][1] == "ab" * 6
        items = [item for r in range(view.table.rowCount()) if (item := view.table.item(r, 0)) is not None]
        differs = {item.text() for item in items if item.background().color().name() == DIFFERS}
        assert differs == {"Rows", "Prompts (sha256)"}
        assert view.verdict.text().startswith("The same model on the same kind of card, measured "
                                              "differently: other prompts")
        assert "gaudi-gui eval --fp8" in view.verdict.text()
        assert table.status.text().startswith("comparing 2 calibrations")

        # Measured on Gaudi 2: its scales do not fit this CPU's calibration's cards.
        select(first.name, gaudi2.name)
        click(qtbot, table.buttons["Compare"])
        assert view.rows()["Measured on"] == ["cpu", "hpu (gaudi2)"]
        assert view.verdict.text() == ("Not interchangeable: another device or card generation: its scales "
                                       "do not fit the other's cards.")

        # A calibration and a training run: said, nothing opened anew.
        select(first.name, trained.name)
        click(qtbot, table.buttons["Compare"])
        assert "a calibration run and a training run cannot be compared" in table.status.text()
    finally:
        table.shutdown()

"""The Calibrate window as a person uses it (issue 39): opened from the Models tab on a model of this
machine's Hub cache, refused in one line without prompts, a dataset chosen with Browse…, Calibrate
clicked (a real agent, the real INC MEASURE on the tiny model), the manifest read in the window with the
cache's commit as the revision; a long calibration stopped with Stop. Then from a finished training run
in the Runs list."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from PySide6.QtWidgets import QFileDialog
from pytestqt.qtbot import QtBot

from gaudi_gui.core import fp8
from gaudi_gui.core.runstore import Run
from gaudi_gui.ui.models_tab import ModelsTab
from tests.helpers import click, models_tab

pytestmark = [pytest.mark.slow]

COMMIT = "0123456789abcdef0123456789abcdef01234567"


@pytest.fixture
def cached_model(tiny_model_dir: Path) -> str:
    """The tiny model in this test's Hub cache as ``test/tiny`` at ``COMMIT`` (as a download leaves it)."""
    repo = Path(os.environ["HF_HOME"]) / "hub" / "models--test--tiny"
    shutil.copytree(tiny_model_dir, repo / "snapshots" / COMMIT)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(COMMIT)
    return "test/tiny"


@pytest.fixture
def tab(qtbot: QtBot) -> Iterator[ModelsTab]:
    yield from models_tab(qtbot)


def test_calibrate_a_cached_model_from_the_models_tab(qtbot: QtBot, cached_model: str, tab: ModelsTab,
                                                      tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    qtbot.waitUntil(lambda: tab.table.rowCount() == 1, timeout=60000)
    assert not tab.calibrate_button.isEnabled()  # nothing chosen yet
    item = tab.table.item(0, 0)
    assert item is not None
    qtbot.mouseClick(tab.table.viewport(), Qt.MouseButton.LeftButton,
                     pos=tab.table.visualItemRect(item).center())
    qtbot.waitUntil(tab.calibrate_button.isEnabled, timeout=5000)
    click(qtbot, tab.calibrate_button)
    dialog = tab.calibrate_dialog
    assert dialog is not None
    qtbot.waitUntil(dialog.isVisible)
    view = dialog.view
    assert view.model.text() == cached_model
    # No prompts: the command refuses, in one line, and nothing runs.
    click(qtbot, view.run_button)
    qtbot.waitUntil(lambda: view.run_button.isEnabled() and "no calibration prompts" in view.status.text(),
                    timeout=60000)
    assert "\n" not in view.status.text()
    # A dataset in Training's format, chosen with Browse… (the file dialog answers as a person would).
    data = tmp_path / "calib.jsonl"
    data.write_text("\n".join(json.dumps({"text": f"row {i}: the cat sat on the mat"}) for i in range(6)))
    monkeypatch.setattr(QFileDialog, "getOpenFileName", lambda *_a, **_k: (str(data), ""))
    click(qtbot, view.browse_button)
    assert view.dataset.text() == str(data)
    view.rows.selectAll()
    qtbot.keyClicks(view.rows, "4")
    # The Cards field reaches the command, which refuses a malformed one at once, in one line.
    qtbot.keyClicks(view.cards, "0,x")
    click(qtbot, view.run_button)
    qtbot.waitUntil(lambda: view.run_button.isEnabled() and "--cards" in view.status.text(), timeout=60000)
    assert "\n" not in view.status.text() and view.job.folder == ""
    view.cards.selectAll()
    qtbot.keyClick(view.cards, Qt.Key.Key_Delete)
    click(qtbot, view.run_button)
    assert not view.run_button.isEnabled() and view.stop_button.isEnabled()
    qtbot.waitUntil(view.run_button.isEnabled, timeout=120000)
    said = view.status.text()
    assert said.startswith(f"Finished: 4 rows measured, {cached_model} on cpu (3 files)"), said
    assert f"Model: {cached_model} @ {COMMIT}" in view.result.text()
    assert "Measured on: cpu (cpu), 4 rows, observer maxabs, scale method maxabs_pow2" in view.result.text()
    assert f"--fp8 {view.job.folder}" in view.result.text()
    # The run is the agent's, in the runs store, with INC's files and the manifest.
    folder = Path(view.job.folder)
    assert Run(folder).status().state == "finished"
    assert fp8.read_manifest(folder)["model"]["revision"] == COMMIT
    assert fp8.measurement_files(folder) == list(fp8.required_files())

    # The calibration checked: the model quantized with it against the model itself, on the dataset's
    # first prompts (gaudi-gui eval --fp8 through the agent).
    qtbot.waitUntil(view.check_button.isEnabled, timeout=10000)
    click(qtbot, view.check_button)
    qtbot.waitUntil(lambda: view.check_status.text().startswith("FP8 check:"), timeout=120000)
    checked = view.check_status.text()
    assert checked.startswith("FP8 check: 14 modules quantized (PatchedLinear; maxabs_pow2, Q/DQ)"), checked
    assert " of 4 answers the same as the model's own" in checked
    assert "Note: FP8 Q/DQ on the CPU checks the flow and the answers, not speed" in checked
    qtbot.waitUntil(lambda: not view.check_job.running, timeout=30000)
    assert Run(Path(view.check_job.folder)).status().kind == "eval"

    # A long calibration, stopped while it measures.
    big = tmp_path / "big.txt"
    big.write_text("\n".join(f"prompt number {i} about cats and mats and fp8 scales" for i in range(5000)))
    view.dataset.clear()
    qtbot.keyClicks(view.dataset, str(big))
    view.rows.selectAll()
    qtbot.keyClicks(view.rows, "5000")
    click(qtbot, view.run_button)
    qtbot.waitUntil(lambda: view.status.text().startswith("Measuring:"), timeout=120000)
    click(qtbot, view.stop_button)
    qtbot.waitUntil(view.run_button.isEnabled, timeout=60000)
    assert view.status.text().startswith("Stopped"), view.status.text()
    assert not (Path(view.job.folder) / fp8.MANIFEST_NAME).exists()


def test_calibrate_a_finished_run_from_the_runs_list(qtbot: QtBot, tiny_model_dir: Path,
                                                     tmp_path: Path) -> None:
    from gaudi_gui.core.jobconfig import JobConfig
    from gaudi_gui.core.runstore import RunStore
    from gaudi_gui.ui.training_runs import RunsTable

    store = RunStore(tmp_path / "runs")
    out = tmp_path / "out"
    shutil.copytree(tiny_model_dir, out / "final")
    held_out = tmp_path / "held-out.jsonl"
    held_out.write_text(json.dumps({"text": "a row the run was evaluated on"}) + "\n")
    tuned = JobConfig(name="tuned", training_args={"output_dir": str(out)})
    tuned.dataset.eval = {"source": str(held_out)}
    run = store.create(tuned)
    unfinished = store.create(JobConfig(name="unfinished",
                                        training_args={"output_dir": str(tmp_path / "o2")}))
    run.update_status(state="finished", exit_code=0)
    table = RunsTable(store)
    qtbot.addWidget(table)
    table.resize(1000, 600)
    table.show()
    qtbot.waitExposed(table)

    def choose(name: str) -> None:
        row = next(r for r in range(table.table.rowCount())
                   if (item := table.table.item(r, 0)) is not None and item.text().startswith(name))
        rect = table.table.visualRect(table.table.model().index(row, 0))
        click(qtbot, table.table.viewport(), rect.center())
        qtbot.waitUntil(lambda: [r.name for r in table.selected_runs()] == [name], timeout=5000)

    try:
        # A run without a saved model is said, no window opens.
        choose(unfinished.name)
        click(qtbot, table.buttons["Calibrate FP8…"])
        assert table.calibrate_dialog is None and "calibrate a finished run" in table.status.text()
        choose(run.name)
        click(qtbot, table.buttons["Calibrate FP8…"])
        dialog = table.calibrate_dialog
        assert dialog is not None
        qtbot.waitUntil(dialog.isVisible)
        view = dialog.view
        assert view.model.text() == str(run.folder)
        # Its prompts: the run's own eval split (a file), said under the form.
        assert view.dataset.text() == str(held_out)
        assert view.status.text().startswith("Calibration prompts: the run's eval split")
        qtbot.keyClicks(view.prompts, "the cat sat on the mat")
        click(qtbot, view.run_button)
        qtbot.waitUntil(view.run_button.isEnabled, timeout=120000)
        said = view.status.text()
        assert said.startswith(f"Finished: 2 rows measured, {out / 'final'} on cpu"), said
        manifest = fp8.read_manifest(view.job.folder)
        assert manifest["model"]["path"] == str((out / "final").resolve())
        assert manifest["model"]["revision"] == fp8.config_digest(out / "final")
    finally:
        table.shutdown()

"""The Training form refuses at the field what `train` would refuse (issue 37, items 8 and 9): a
dataset file that cannot be read, named with its line; an output folder that cannot be written; a
model folder that is not there. Typed and clicked as a person does; nothing starts."""

from __future__ import annotations

import json
from pathlib import Path

from pytestqt.qtbot import QtBot

from tests.helpers import click, close_training_tab, training_tab, type_over


def test_start_marks_bad_files_at_their_fields_and_starts_nothing(qtbot: QtBot, tmp_path: Path) -> None:
    services, tab = training_tab(qtbot, tmp_path)
    try:
        data = tmp_path / "cut.jsonl"
        data.write_text("".join(json.dumps({"text": f"row {i}"}) + "\n" for i in range(5)) + '{"text": "cu')
        type_over(qtbot, tab.form.dataset, str(data))
        model = tab.form.model.lineEdit()
        assert model is not None
        type_over(qtbot, model, str(tmp_path / "no-model"))
        type_over(qtbot, tab.form.editors["output_dir"].editor, "/sys/gaudi-gui-test-out")
        click(qtbot, tab.btn["Start"])
        qtbot.waitUntil(lambda: tab.status.text().startswith("cannot start"), timeout=10000)
        said = tab.form.dataset.toolTip()
        assert "line 6: not valid JSON" in said and str(data) in said
        assert "model folder not found" in tab.form.model.toolTip()
        assert "not writable" in tab.form.editors["output_dir"].editor.toolTip()
        runs = tmp_path / "runs"
        assert tab.job.run is None and (not runs.exists() or not list(runs.iterdir()))
    finally:
        close_training_tab(services, tab)

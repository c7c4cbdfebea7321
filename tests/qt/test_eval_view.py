"""The Evaluate window, clicked from Runs, on a real LoRA SFT run of the tiny model (trained once for the
module): the form filled by typing and clicking, base and tuned answers side by side with their timings,
the scores, the results in the run folder, the Runs list's latest scores and Compare's scores; Stop; a
wrong column refused at its field before any child starts."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from PySide6.QtCore import Qt
from pytestqt.qtbot import QtBot

from gaudi_gui.core import evaluation as ev
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, RunStore
from gaudi_gui.ui.eval_view import EvalView, ScoresPanel
from gaudi_gui.ui.training_runs import COLUMNS, RunsTable
from tests import helpers

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("eval_view_run")]

TASKS = Path(__file__).resolve().parents[1] / "data" / "lmeval_task"


@pytest.fixture(scope="module")
def trained(tiny_model_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[Run, Path]:
    """A finished 6-step LoRA SFT run (high learning rate: the answers change) and a references file."""
    root = tmp_path_factory.mktemp("eval-view")
    alpaca = helpers.write_jsonl(root / "alpaca.jsonl", helpers.ALPACA)
    job = JobConfig(model=str(tiny_model_dir), method="lora", name="eval-view")
    job.dataset.source, job.dataset.kind, job.dataset.max_length = str(alpaca), "prompt_completion", 64
    job.dataset.columns = {"prompt": "{instruction}", "completion": "output"}
    job.training_args = {"use_cpu": True, "max_steps": 6, "logging_steps": 1, "save_strategy": "no",
                         "per_device_train_batch_size": 4, "learning_rate": 5e-2,
                         "output_dir": str(root / "out")}
    run = RunStore(root / "runs").create(job)
    env = {**os.environ, "GAUDI_GUI_HOME": str(root / "home"), "HF_DATASETS_DISABLE_PROGRESS_BARS": "1"}
    res = subprocess.run([sys.executable, "-m", "gaudi_gui.workers.train", "--config", str(run.config_path)],
                         capture_output=True, text=True, timeout=300, env=env)
    assert res.returncode == 0, res.stderr[-3000:]
    run.update_status(state="finished")  # what the supervisor (not started here) writes at the end
    refs = helpers.write_jsonl(root / "refs.jsonl", [{"question": r["instruction"], "answer": r["output"]}
                                                     for r in helpers.ALPACA[:3]])
    return run, refs


def _runs_table(qtbot: QtBot, run: Run) -> RunsTable:
    table = RunsTable(RunStore(run.folder.parent))
    qtbot.addWidget(table)
    table.show()
    return table


def _click_row(qtbot: QtBot, table: RunsTable, row: int = 0) -> None:
    item = table.table.item(row, 0)
    assert item is not None
    qtbot.mouseClick(table.table.viewport(), Qt.MouseButton.LeftButton,
                     pos=table.table.visualItemRect(item).center())


def _open_eval(qtbot: QtBot, table: RunsTable, run: Run) -> EvalView:
    _click_row(qtbot, table)
    helpers.click(qtbot, table.buttons["Evaluate"])
    view = table.eval_views[run.folder]
    assert isinstance(view, EvalView)
    qtbot.waitUntil(view.isVisible, timeout=5000)
    return view


def _type(qtbot: QtBot, widget: object, text: str) -> None:
    qtbot.keyClicks(widget, text)


def test_evaluate_clicked_from_runs_shows_base_vs_tuned_and_keeps_the_scores(
        qtbot: QtBot, trained: tuple[Run, Path]) -> None:
    run, refs = trained
    table = _runs_table(qtbot, run)
    assert table.table.item(0, COLUMNS.index("latest scores")).text() == "–"  # type: ignore[union-attr]
    view = _open_eval(qtbot, table, run)
    assert "adapter over" in view.models.text() and "unmerged" in view.models.text()

    _type(qtbot, view.prompts, "Say bye.")
    _type(qtbot, view.data, str(refs))
    qtbot.keyClick(view.data, Qt.Key.Key_Return)  # the preview reads the file's columns
    offered = [view.prompt_column.itemText(i) for i in range(view.prompt_column.count())]
    assert offered == ["question", "answer"]
    assert (view.prompt_column.currentText(), view.reference_column.currentText()) == ("question", "answer")
    assert view.preview.rowCount() == 3
    helpers.click(qtbot, view.metric_boxes["perplexity"])
    _type(qtbot, view.tasks, "gaudi_gui_tiny_mc")
    _type(qtbot, view.include_path, str(TASKS))
    view.max_new_tokens.lineEdit().selectAll()
    _type(qtbot, view.max_new_tokens, "8")
    assert view.max_new_tokens.value() == 8

    helpers.click(qtbot, view.start_button)
    qtbot.waitUntil(lambda: not view.start_button.isEnabled(), timeout=5000)
    assert view.stop_button.isEnabled()
    qtbot.waitUntil(view.start_button.isEnabled, timeout=240_000)
    assert "results saved in" in view.status.text(), view.status.text()

    # The answers side by side: 1 prompt + 3 references, both models, timings.
    answers = view.answers
    assert answers.rowCount() == 4
    texts = [[answers.item(r, c).text() for c in range(answers.columnCount())]  # type: ignore[union-attr]
             for r in range(answers.rowCount())]
    assert texts[0][0] == "Say bye." and texts[1][1] == "Blue."
    assert sum(row[2] != row[3] for row in texts) >= 2, texts
    assert all(float(row[4]) > 0 and float(row[5]) > 0 and float(row[6]) > 0 and float(row[7]) > 0
               for row in texts)
    assert view.progress.value() == view.progress.maximum() > 0

    # The scores are the ones written in the run folder.
    result = ev.latest_result(run)
    assert result is not None and Path(result["path"]).parent == run.folder / "eval"
    shown = {view.scores.item(r, 0).text(): (view.scores.item(r, 1).text(), view.scores.item(r, 2).text())  # type: ignore[union-attr]
             for r in range(view.scores.rowCount())}
    assert set(shown) == {"exact_match", "rougeL", "bleu", "perplexity", "gaudi_gui_tiny_mc"}
    assert shown["perplexity"] == (f"{result['base']['metrics']['perplexity']:.4g}",
                                   f"{result['tuned']['metrics']['perplexity']:.4g}")

    # The Runs list shows the latest scores; Compare shows them beside the curves.
    qtbot.waitUntil(lambda: "rougeL" in table.table.item(0, COLUMNS.index("latest scores")).text(),  # type: ignore[union-attr]
                    timeout=5000)
    _click_row(qtbot, table)
    helpers.click(qtbot, table.buttons["Compare"])
    panel = table.scores_panel
    assert isinstance(panel, ScoresPanel)
    qtbot.waitUntil(panel.isVisible, timeout=5000)
    header = panel.table.horizontalHeaderItem(1)
    assert header is not None and header.text() == run.name
    names = [panel.table.item(r, 0).text() for r in range(panel.table.rowCount())]  # type: ignore[union-attr]
    assert "perplexity" in names and "gaudi_gui_tiny_mc" in names


def test_stop_ends_the_evaluation_and_saves_nothing(qtbot: QtBot, trained: tuple[Run, Path]) -> None:
    run, _refs = trained
    before = ev.results_of(run)
    table = _runs_table(qtbot, run)
    view = _open_eval(qtbot, table, run)
    for prompt in ["Say bye.", "Name a fruit.", "Say hello."] * 2:
        _type(qtbot, view.prompts, prompt)
        qtbot.keyClick(view.prompts, Qt.Key.Key_Return)
    view.max_new_tokens.lineEdit().selectAll()
    _type(qtbot, view.max_new_tokens, "400")
    helpers.click(qtbot, view.start_button)
    qtbot.waitUntil(lambda: view.answers.rowCount() >= 1, timeout=120_000)
    assert view.progress.maximum() == 12
    helpers.click(qtbot, view.stop_button)
    qtbot.waitUntil(view.start_button.isEnabled, timeout=30_000)
    assert view.status.text() == "stopped: nothing was saved"
    assert ev.results_of(run) == before


def test_a_wrong_column_is_refused_at_its_field(qtbot: QtBot, trained: tuple[Run, Path]) -> None:
    run, refs = trained
    table = _runs_table(qtbot, run)
    view = _open_eval(qtbot, table, run)
    _type(qtbot, view.data, str(refs))
    qtbot.keyClick(view.data, Qt.Key.Key_Return)
    view.reference_column.lineEdit().selectAll()  # type: ignore[union-attr]
    _type(qtbot, view.reference_column, "gold")
    helpers.click(qtbot, view.start_button)
    error = view.errors["reference_column"]
    assert error.isVisible()
    assert error.text() == "'gold' is not a column of refs.jsonl (its columns: question, answer)"
    assert not view.service.is_running() and view.start_button.isEnabled()


def test_the_column_guess_skips_an_integer_id(qtbot: QtBot, trained: tuple[Run, Path],
                                              tmp_path: Path) -> None:
    """Issue 25, item 17: a file whose first column is an integer `qid` had it taken as the prompt."""
    run, _refs = trained
    rows = [{"qid": i, "body": r["instruction"], "gold": r["output"]}
            for i, r in enumerate(helpers.ALPACA[:3])]
    refs = helpers.write_jsonl(tmp_path / "qid.jsonl", rows)
    table = _runs_table(qtbot, run)
    view = _open_eval(qtbot, table, run)
    _type(qtbot, view.data, str(refs))
    qtbot.keyClick(view.data, Qt.Key.Key_Return)
    offered = [view.prompt_column.itemText(i) for i in range(view.prompt_column.count())]
    assert offered == ["qid", "body", "gold"]
    assert (view.prompt_column.currentText(), view.reference_column.currentText()) == ("body", "gold")


def test_the_evaluate_window_fits_the_screen_and_closes_by_click_and_esc(
        qtbot: QtBot, trained: tuple[Run, Path]) -> None:
    """Issue 25, item 16: the Evaluate window was 760 px tall (off a 700-px screen) with no Close."""
    run, _refs = trained
    table = _runs_table(qtbot, run)
    view = _open_eval(qtbot, table, run)
    screen = view.screen().availableGeometry()
    assert view.frameGeometry().height() <= screen.height() and view.width() <= screen.width()
    helpers.click(qtbot, view.close_button)
    qtbot.waitUntil(lambda: not view.isVisible(), timeout=5000)
    view = _open_eval(qtbot, table, run)
    view.activateWindow()
    qtbot.keyClick(view, Qt.Key.Key_Escape)
    qtbot.waitUntil(lambda: not view.isVisible(), timeout=5000)


def test_queue_puts_the_evaluation_in_this_machines_queue(qtbot: QtBot, trained: tuple[Run, Path]) -> None:
    """Issue 29: the Evaluate window's Queue, clicked: an eval job (the words `eval --detach` takes)
    in this machine's queue, waiting for the cards ticked in Devices. The real agent's queue, paused."""
    from gaudi_gui.core.agentwire import Connection
    from gaudi_gui.services.agent_child import shared_client
    from gaudi_gui.services.queue import QueueService

    run, _refs = trained
    with Connection.open(client="test") as conn:
        conn.request("queue.pause")
    service = QueueService(shared_client())
    service.start()
    try:
        table = _runs_table(qtbot, run)
        table.queue, table.queue_cards = (lambda: service), (lambda: (3,))
        view = _open_eval(qtbot, table, run)
        assert view.queue_button.isVisible()
        _type(qtbot, view.prompts, "Name a color.")
        helpers.click(qtbot, view.queue_button)
        qtbot.waitUntil(lambda: view.status.text().startswith("queued: it starts by itself when module 3"),
                        timeout=30000)
        qtbot.waitUntil(lambda: len(service.state.pending()) == 1, timeout=60000)
        (entry,) = service.state.pending()
        assert (entry.kind, entry.card_ids, entry.name) == ("eval", [3], f"eval-{run.name}")
        assert f"--run={run.folder}" in entry.job["words"] and "--prompt=Name a color." in entry.job["words"]
        assert not view.service.is_running()  # queued, not started
    finally:
        service.shutdown()

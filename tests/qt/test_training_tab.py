"""The Training tab end to end: schema form, validation in a child, a real demo run, history."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gaudi_gui.app import create_services
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.ui.log_view import LogView
from gaudi_gui.ui.training_tab import TrainingTab


@pytest.fixture
def tab(qtbot, tmp_path: Path):
    services = create_services()
    services.settings.set("training/runs_dir", str(tmp_path / "runs"))
    w = TrainingTab(services)
    qtbot.addWidget(w)
    w.resize(1400, 900)
    qtbot.waitUntil(lambda: w.form.schema is not None, timeout=60000)
    yield w
    w.stop_jobs()
    qtbot.waitUntil(lambda: not w.active_jobs(), timeout=60000)
    w.shutdown()


def set_arg(tab: TrainingTab, name: str, text: str) -> None:
    tab.form.editors[name].editor.setText(text)  # type: ignore[attr-defined]


def test_form_from_schema_validation_and_save_load(qtbot, tab: TrainingTab, tmp_path: Path) -> None:
    assert len(tab.form.editors) > 100
    assert tab.form.editors["lr_scheduler_type"].editor.count() > 3  # type: ignore[attr-defined]
    assert "learning rate" in tab.form.editors["learning_rate"].toolTip().lower()
    assert "accelerate" in tab.command.toPlainText() and "--config_file" in tab.command.toPlainText()
    # Search reveals a field of the "all arguments" section.
    tab.form.search.setText("optim")
    assert tab.form.all_form.isRowVisible(tab.form._labels["optim"])
    # A type error is shown at the field without a child.
    set_arg(tab, "max_steps", "lots")
    tab.update_preview()
    assert "background" in tab.form.editors["max_steps"].editor.styleSheet()
    set_arg(tab, "max_steps", "5")
    tab.update_preview()
    # A value only TrainingArguments rejects: checked in a child, shown at the field.
    tab.form.editors["bf16"].editor.setChecked(True)  # type: ignore[attr-defined]
    tab.form.editors["use_cpu"].editor.setChecked(False)  # type: ignore[attr-defined]
    tab.job.training_args = {}  # type: ignore[attr-defined]
    job, _ = tab.form.job()
    job.training_args["use_cpu"] = False
    with qtbot.waitSignal(tab.schema_loader.validated, timeout=60000) as blocker:
        tab.schema_loader.validate(job.training_args)
    fields = {f for f, _ in blocker.args[0]}
    assert "bf16" in fields
    assert "bf16" in tab.form.hints.text()
    tab.form.editors["bf16"].editor.setChecked(False)  # type: ignore[attr-defined]
    path = tmp_path / "job.json"
    tab.save_job(str(path))
    saved = JobConfig.load(path)
    assert saved.training_args["max_steps"] == 5 and "learning_rate" not in saved.training_args
    set_arg(tab, "max_steps", "99")
    assert tab.load_job(str(path))
    assert tab.form.job()[0].training_args["max_steps"] == 5
    path.write_text("{oops")
    assert not tab.load_job(str(path)) and "cannot load" in tab.status.text()


@pytest.mark.usefixtures("demo_model")
def test_demo_run_end_to_end(qtbot, tab: TrainingTab, tmp_path: Path) -> None:
    set_arg(tab, "output_dir", str(tmp_path / "out"))
    set_arg(tab, "max_steps", "8")
    set_arg(tab, "save_steps", "4")
    set_arg(tab, "logging_steps", "1")
    run = tab.start()
    assert run is not None, tab.status.text()
    assert not tab.btn["Start"].isEnabled() and tab.btn["Stop"].isEnabled()
    with qtbot.waitSignal(tab.job.finished, timeout=120000) as blocker:
        pass
    assert blocker.args[1] == "finished", tab.status.text()
    assert tab.chart.point_count() == 8
    assert tab.progress.value() == 100 and "final loss" in tab.status.text()
    qtbot.waitUntil(lambda: "[rank 0/1] done" in tab.log.plain_text(), timeout=5000)
    assert tab.runs.table.rowCount() == 1
    status_item = tab.runs.table.item(0, 1)
    assert status_item is not None and status_item.text() == "finished"
    # History: reopen, compare, clone and load-in-runner.
    tab.chart.clear()
    tab.runs.select_row(0)
    tab.runs.buttons["Reopen"].click()
    assert tab.chart.point_count() == 8
    tab.runs.buttons["Compare"].click()
    assert len(tab.chart._overlays) == 1
    with qtbot.waitSignal(tab.load_in_runner_requested, timeout=2000) as loaded:
        tab.runs.buttons["Load in runner"].click()
    assert Path(loaded.args[0]).name == "final"
    set_arg(tab, "max_steps", "3")
    tab.runs.buttons["Clone"].click()
    assert tab.form.job()[0].training_args["max_steps"] == 8
    saved = json.loads((run.folder / "status.json").read_text())
    assert saved["state"] == "finished"


def test_log_view_collapses_bounds_and_filters(qtbot) -> None:
    view = LogView(max_lines=100)
    qtbot.addWidget(view)
    for i in range(250):
        view.append_line(f"[rank {i % 2}/2] line {i}")
    view.append_line("shared line")
    view.set_progress(" 40%|####      | 4/10")
    view.flush()
    assert view.line_count() == 100
    assert view.text.blockCount() <= 100
    assert view.progress.text().startswith("40%")
    view.rank.setCurrentIndex(view.rank.findData(1))
    text = view.plain_text()
    assert "[rank 0/2]" not in text and "[rank 1/2] line 249" in text and "shared line" in text
    view.search.setText("line 249")
    assert view.find_next()
    view.shutdown()


@pytest.mark.usefixtures("demo_model")
def test_detach_then_reattach_and_stop(qtbot, tab: TrainingTab, tmp_path: Path) -> None:
    set_arg(tab, "output_dir", str(tmp_path / "out"))
    set_arg(tab, "max_steps", "100000")
    set_arg(tab, "save_steps", "100000")
    set_arg(tab, "logging_steps", "5")
    run = tab.start()
    assert run is not None
    qtbot.waitUntil(lambda: len(tab.job.records) > 0, timeout=120000)
    assert tab.active_jobs() and "training run" in tab.active_jobs()[0]
    assert tab.detach_jobs() == [str(run.folder)]
    # A second window (next start of the app) re-attaches from the settings and follows the files.
    second = TrainingTab(tab.services)
    qtbot.addWidget(second)
    assert second.job.attached and second.job.run is not None
    assert second.job.run.folder == run.folder
    seen = len(second.job.records)
    qtbot.waitUntil(lambda: len(second.job.records) > seen, timeout=60000)
    with qtbot.waitSignal(second.job.finished, timeout=60000) as blocker:
        second.stop()
    assert blocker.args[1] == "stopped", second.status.text()
    qtbot.waitUntil(lambda: not tab.active_jobs(), timeout=30000)
    assert run.latest_checkpoint() is not None
    second.shutdown()


def test_card_usage_lines_up_with_steps(qtbot) -> None:
    from gaudi_gui.ui.loss_chart import LossChart

    chart = LossChart()
    qtbot.addWidget(chart)
    for step in range(1, 11):  # one step per second, from t=100 to t=109
        chart.add_record({"step": step, "loss": 1.0 / step, "time": 99.0 + step})
    times = [95.0 + i for i in range(20)]  # samples from before the run to after it
    chart.set_device_series([("card 0", times, [50.0] * 20)])
    curve = chart._device_curves["card 0"]
    assert list(curve.xData) == [float(s) for s in range(1, 11)]  # only the run's span, as steps
    assert chart.device_point_count() == 10
    chart.clear()
    assert chart.device_point_count() == 0

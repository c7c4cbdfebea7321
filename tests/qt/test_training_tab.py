"""The Training tab driven by clicks: form, Validate, Stop on a real model whose checkpoint takes >10 s
to write, history, Stop before the launcher starts. (Start → Stop → Resume at every placement, this
machine included, is one scenario: tests/scenarios/test_training_scenario.py. Leave running → restart
→ re-attach goes through the window's close dialog: tests/qt/test_main_window.py.)"""
# mypy: disable-error-code="union-attr"

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gaudi_gui.app import create_services
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.placement import Placement
from gaudi_gui.core.proctree import ProcessRef
from gaudi_gui.core.runstore import Run, RunStore, checkpoint_complete
from gaudi_gui.core.training_args import latest_cached
from gaudi_gui.services.training_job import TrainingJob
from gaudi_gui.ui.log_view import LogView
from gaudi_gui.ui.training_tab import TrainingTab
from tests.helpers import click, form_ready, set_arg, slow_disk_env


def _end_all(qtbot, services) -> None:
    training = services.training
    training.stop_jobs()
    try:
        qtbot.waitUntil(lambda: not training.active_jobs(), timeout=60000)
    except AssertionError:
        for job in training.running():
            job.kill()
        qtbot.waitUntil(lambda: not training.active_jobs(), timeout=30000)
    training.shutdown()


@pytest.fixture
def tab(qtbot, tmp_path: Path):
    services = create_services()
    services.settings.set("training/runs_dir", str(tmp_path / "runs"))
    services.settings.set("training/stop_grace_s", 120.0)
    services.training.store = RunStore(tmp_path / "runs")
    w = TrainingTab(services)
    qtbot.addWidget(w)
    w.resize(1400, 900)
    # Shown, as a person sees it: its pages are laid out, so a click lands on a button of real size.
    w.show()
    qtbot.waitExposed(w)
    qtbot.waitUntil(lambda: form_ready(w), timeout=60000)
    yield w
    _end_all(qtbot, services)
    w.shutdown()


def click_history(qtbot, tab: TrainingTab, name: str) -> None:
    """Click the Runs page's title (the history sits behind the live Run page), then its button."""
    if tab.views.currentWidget() is not tab.runs:
        bar = tab.views.tabBar()
        click(qtbot, bar, bar.tabRect(tab.views.indexOf(tab.runs)).center())
        qtbot.waitUntil(lambda: tab.views.currentWidget() is tab.runs, timeout=5000)
    click(qtbot, tab.runs.buttons[name])


def test_form_validate_by_click_and_save_load(qtbot, tab: TrainingTab, tmp_path: Path) -> None:
    assert len(tab.form.editors) > 100
    assert "accelerate" in tab.command.toPlainText() and "--config_file" in tab.command.toPlainText()
    set_arg(tab, "max_steps", "lots")
    tab.update_preview()
    assert "background" in tab.form.editors["max_steps"].editor.styleSheet()
    set_arg(tab, "max_steps", "5")
    # bf16 with use_cpu is a valid combination on a CPU: Validate (clicked) builds it in a child.
    tab.form.editors["bf16"].editor.setChecked(True)  # type: ignore[attr-defined]
    click(qtbot, tab.btn["Validate"])
    qtbot.waitUntil(lambda: tab.status.text().startswith(("valid:", "invalid:")), timeout=90000)
    assert tab.status.text() == "valid: TrainingArguments builds", tab.status.text()
    # fp16 and bf16 together is not: blamed at the fields.
    tab.form.editors["fp16"].editor.setChecked(True)  # type: ignore[attr-defined]
    click(qtbot, tab.btn["Validate"])
    qtbot.waitUntil(lambda: tab.status.text().startswith("invalid:"), timeout=90000)
    assert "fp16" in tab.status.text() or "bf16" in tab.status.text()
    tab.form.editors["fp16"].editor.setChecked(False)  # type: ignore[attr-defined]
    tab.form.editors["bf16"].editor.setChecked(False)  # type: ignore[attr-defined]
    # Save and load through the real buttons (the file dialogs answered by the test).
    path = tmp_path / "job.json"
    from PySide6.QtWidgets import QFileDialog
    original_save, original_open = QFileDialog.getSaveFileName, QFileDialog.getOpenFileName
    QFileDialog.getSaveFileName = staticmethod(lambda *a, **k: (str(path), ""))  # type: ignore[method-assign]
    QFileDialog.getOpenFileName = staticmethod(lambda *a, **k: (str(path), ""))  # type: ignore[method-assign]
    try:
        click(qtbot, tab.btn["Save job…"])
        saved = JobConfig.load(path)
        assert saved.training_args["max_steps"] == 5 and "weight_decay" not in saved.training_args
        assert saved.training_args["learning_rate"] == 1e-3  # the demo job's own, kept as set
        assert "tf32" not in saved.training_args  # an optional bool the user never touched
        set_arg(tab, "max_steps", "99")
        click(qtbot, tab.btn["Load job…"])
        assert tab.form.job()[0].training_args["max_steps"] == 5
    finally:
        QFileDialog.getSaveFileName, QFileDialog.getOpenFileName = original_save, original_open  # type: ignore[method-assign]
    click(qtbot, tab.btn["Copy command"])
    assert tab.status.text() == "command copied to the clipboard"
    from PySide6.QtGui import QGuiApplication
    assert "accelerate" in QGuiApplication.clipboard().text()


def test_stop_by_click_while_a_slow_checkpoint_is_written(qtbot, tab: TrainingTab, tmp_path: Path,
                                                          sized_model_dir: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """What the scenario's quick checkpoint cannot show: the seconds counted while it is written."""
    for key, value in slow_disk_env(4).items():
        monkeypatch.setenv(key, value)
    tab.form.model.setCurrentText(str(sized_model_dir))
    set_arg(tab, "output_dir", str(tmp_path / "out"))
    set_arg(tab, "max_steps", "100000")
    set_arg(tab, "save_steps", "100000")
    set_arg(tab, "logging_steps", "1")
    click(qtbot, tab.btn["Start"])
    job = tab.job
    # The supervisor (`train --detach`) answers with the run folder within seconds.
    qtbot.waitUntil(lambda: job.run is not None, timeout=60000)
    assert job.run is not None, tab.status.text()
    qtbot.waitUntil(lambda: len(job.records) >= 2, timeout=240000)
    said: list[str] = []
    job.summary_changed.connect(said.append)
    click(qtbot, tab.btn["Stop"])
    qtbot.waitUntil(lambda: "saving checkpoint" in tab.status.text(), timeout=60000)
    qtbot.waitUntil(lambda: tab.status.text().endswith(("1 s", "2 s", "3 s")), timeout=10000)
    with qtbot.waitSignal(job.finished, timeout=180000) as done:
        pass
    assert done.args[1] == "stopped", tab.status.text()
    # The stop's words only go forward: once the checkpoint is saved, never "waiting for the current
    # step" again (issue 25, item 17).
    saved_at = next(i for i, text in enumerate(said) if " saved" in text)
    assert not [t for t in said[saved_at:] if "waiting for the current step" in t], said
    step = job.run.status().step
    assert tab.status.text() == f"Stopped at step {step} — checkpoint-{step} saved; Resume continues there"
    assert "143" not in tab.status.text() and "@gaudi-gui" not in tab.status.text()
    assert checkpoint_complete(tmp_path / "out" / f"checkpoint-{step}")
    saved = next(e for e in job.events if e["type"] == "checkpoint_saved")
    assert saved["seconds"] > 10
    assert not job.run.processes_alive()


@pytest.mark.parametrize("probed", [False, True])
def test_a_cached_schema_builds_the_form_without_a_child(qtbot, tmp_path: Path, probed: bool) -> None:
    """The home's cache holds this transformers' schema (conftest, as after a first start): the tab
    builds its form from it and starts no schema child, whether the environment probe has answered
    (its version is under "packages": the tab read a top-level key that never existed and always
    asked the child) or not yet (the version comes from the installed package's metadata)."""
    from importlib import metadata
    services = create_services()
    if probed:
        services.environment._result = {"packages": {"transformers": metadata.version("transformers")}}
    w = TrainingTab(services)
    qtbot.addWidget(w)
    assert w.form.schema is not None
    assert not w.schema_loader.loading and not w.schema_loader.is_running()
    w.shutdown()


# A fresh install: no cached schema, so the tab asks the schema child (form_ready waits for its answer).
@pytest.mark.fresh_install
@pytest.mark.usefixtures("demo_model")
def test_demo_run_end_to_end_and_history_by_clicks(qtbot, tab: TrainingTab, tmp_path: Path) -> None:
    assert latest_cached() is not None  # the child answered, and its schema was cached
    set_arg(tab, "output_dir", str(tmp_path / "out"))
    set_arg(tab, "max_steps", "8")
    set_arg(tab, "save_steps", "4")
    set_arg(tab, "logging_steps", "1")
    click(qtbot, tab.btn["Start"])
    job = tab.job
    # The supervisor (`train --detach`) answers with the run folder within seconds.
    qtbot.waitUntil(lambda: job.run is not None, timeout=60000)
    assert job.run is not None, tab.status.text()
    with qtbot.waitSignal(job.finished, timeout=180000) as blocker:
        pass
    assert blocker.args[1] == "finished", tab.status.text()
    assert tab.chart.point_count() == 8
    assert tab.progress.value() == 100 and tab.status.text().startswith("Finished 8 steps; final loss")
    qtbot.waitUntil(lambda: "[rank 0/1] done" in tab.log.plain_text(), timeout=5000)
    assert "@gaudi-gui" not in tab.log.plain_text()
    assert tab.runs.table.rowCount() == 1
    assert tab.runs.table.item(0, 1).text() == "finished"
    run = job.run
    # History, by clicks: Reopen clears, then shows the run; Compare; Load in runner; Clone.
    tab.runs.select_row(0)
    click_history(qtbot, tab, "Reopen")
    assert tab.chart.point_count() == 8 and tab.eta.text() == "step 8/8"
    click_history(qtbot, tab, "Compare")
    assert len(tab.chart._overlays) == 1 and tab.chart.point_count() == 0 and tab.eta.text() == ""
    with qtbot.waitSignal(tab.load_in_runner_requested, timeout=2000) as loaded:
        click_history(qtbot, tab, "Try in runner")
    assert Path(loaded.args[0]).name == "final"
    set_arg(tab, "max_steps", "3")
    click_history(qtbot, tab, "Clone")
    cloned, _errors = tab.form.job()
    assert cloned.training_args["max_steps"] == 8
    # Only what the user set: not what the launcher added for the CPU.
    assert "use_cpu" not in cloned.training_args and "ddp_backend" not in cloned.training_args
    assert json.loads((run.folder / "config.json").read_text())["training_args"]["use_cpu"] is True
    click_history(qtbot, tab, "Refresh")
    assert tab.runs.table.rowCount() == 1
    # A run folder holds no secret and is private.
    assert oct(run.folder.stat().st_mode & 0o777) == "0o700"
    for path in run.folder.rglob("*"):
        if path.is_file():
            assert path.stat().st_mode & 0o077 == 0, path


@pytest.mark.usefixtures("demo_model")
def test_stop_then_kill_now_while_saving_leaves_no_checkpoint_to_resume(
        qtbot, tab: TrainingTab, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in slow_disk_env(0.05).items():  # the demo checkpoint then takes ~30 s
        monkeypatch.setenv(key, value)
    set_arg(tab, "output_dir", str(tmp_path / "out"))
    set_arg(tab, "max_steps", "100000")
    set_arg(tab, "save_steps", "100000")
    click(qtbot, tab.btn["Start"])
    job = tab.job
    qtbot.waitUntil(lambda: len(job.records) >= 2, timeout=240000)
    click(qtbot, tab.btn["Stop"])
    qtbot.waitUntil(lambda: "saving checkpoint" in tab.status.text(), timeout=60000)
    assert tab.btn["Stop"].text() == "Kill now"
    # "saving" is announced just before the Trainer makes the folder: kill once the write is under way.
    qtbot.waitUntil(lambda: any((tmp_path / "out").glob("checkpoint-*/*")), timeout=60000)
    with qtbot.waitSignal(job.finished, timeout=60000) as done:
        click(qtbot, tab.btn["Stop"])
    assert done.args[1] == "killed"
    assert tab.status.text().startswith("Killed at step") and "killed on request" in tab.status.text()
    assert job.run is not None and not job.run.processes_alive()
    # The cut checkpoint is on disk, but never offered for resume.
    assert list((tmp_path / "out").glob("checkpoint-*"))
    assert job.run.latest_checkpoint() is None
    tab.runs.refresh()
    tab.runs.select_row(0)
    click_history(qtbot, tab, "Resume")
    assert tab.status.text().endswith("has no complete checkpoint of its own to resume from")


@pytest.mark.usefixtures("demo_model")
def test_stop_before_the_launcher_started(qtbot, tab: TrainingTab, tmp_path: Path) -> None:
    set_arg(tab, "output_dir", str(tmp_path / "out"))
    set_arg(tab, "max_steps", "100000")
    pgid = os.getpgrp()
    click(qtbot, tab.btn["Start"])
    job = tab.job
    assert not job.folder  # the supervisor has not answered yet: the stop waits for it
    with qtbot.waitSignal(job.finished, timeout=60000) as done:
        click(qtbot, tab.btn["Stop"])
    assert done.args[1] == "stopped"
    assert tab.status.text() == "Stopped before training began — nothing to save"
    assert os.getpgrp() == pgid  # we are alive: our own group was never signalled
    assert job.run is not None and not job.run.processes_alive()


def test_reattach_refuses_a_recycled_pid(qtbot, tmp_path: Path) -> None:
    """status.json names a pid that now belongs to someone else: nothing is followed or signalled."""
    stranger = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        store = RunStore(tmp_path / "runs")
        run = store.create(JobConfig(training_args={"output_dir": str(tmp_path / "out")}))
        real = ProcessRef.of(stranger.pid)
        assert real is not None
        run.update_status(state="running", pid=stranger.pid, pid_create_time=real.create_time - 3600,
                          started_at=time.time() - 3600)
        (run.ranks_dir / "rank-0.json").write_text(json.dumps(
            {"rank": 0, "pid": stranger.pid, "create_time": real.create_time - 3600}))
        job = TrainingJob(Placement.local(), store)
        assert not job.attach(run)
        # Told as its events prove by every reader; never written back (the supervisor, gone, was
        # the only writer of status.json).
        status = run.reconcile()
        assert status.state == "killed" and "supervisor was gone" in status.summary
        assert run.status().state == "running"
        job.stop()
        job.kill()
        assert stranger.poll() is None and psutil.Process(stranger.pid).is_running()
    finally:
        stranger.kill()
        stranger.wait()


def test_corrupt_status_files_do_not_block_the_tab(qtbot, tmp_path: Path) -> None:
    services = create_services()
    services.settings.set("training/runs_dir", str(tmp_path / "runs"))
    services.training.store = RunStore(tmp_path / "runs")
    bad = {"list": "[]", "string": '"running"', "range": '{"state": "running", "started_at": 1e300}',
           "broken": "{oops"}
    for text in bad.values():
        run = services.training.store.create(JobConfig())
        run.status_path.write_text(text)
    services.settings.set("training/detached_runs", [str(p) for p in (tmp_path / "runs").iterdir()])
    w = TrainingTab(services)
    qtbot.addWidget(w)
    assert w.runs.table.rowCount() == 4
    states = [w.runs.table.item(r, 1).text() for r in range(4)]
    assert {s.split(" ")[0] for s in states} <= {"failed", "killed"}, states
    # The run whose status.json is not JSON says so in its row, with where the text broke.
    assert any("status.json is not JSON" in s for s in states), states
    assert not services.training.active_jobs()
    _end_all(qtbot, services)
    w.shutdown()


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
    # Terminal escapes (tqdm's cursor-up, colours, a window title) and control characters are not
    # shown as boxes and "[A": the text a terminal would show stays, tabs too.
    view.rank.setCurrentIndex(0)
    view.append_line("Writing model shards: 100%|##| 1/1 [00:03<00:00]\x1b[A\x1b[A")
    view.append_line("\x1b[1;31mWARNING\x1b[0m\tdisk \x1b]0;title\x07almost full\x00\x08")
    view.flush()
    lines = view.plain_text().splitlines()
    assert lines[-2:] == ["Writing model shards: 100%|##| 1/1 [00:03<00:00]", "WARNING\tdisk almost full"]
    view.shutdown()


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


def test_run_folder_is_private(tmp_path: Path) -> None:
    run = RunStore(tmp_path / "runs").create(JobConfig())
    assert isinstance(run, Run)
    assert oct(run.folder.stat().st_mode & 0o777) == "0o700"


def test_one_job_class_for_every_placement_and_no_idle_runner(qtbot, tmp_path: Path) -> None:
    """One TrainingJob for this machine, a host, several hosts and Slurm, composed of one part per
    place: no process is held before the start (an N-host run used to hold N+1 idle QProcess
    objects), nor by a part of any place (the agent starts and follows its run, Slurm's too)."""
    from PySide6.QtCore import QProcess

    from gaudi_gui.core.remote import Host
    from gaudi_gui.services.run_parts import AgentPart
    store = RunStore(tmp_path / "runs")
    hosts = [Host.parse("gg-a"), Host.parse("gg-b")]
    placements = [Placement.local(), Placement.on_host(hosts[0]), Placement.on_hosts(hosts),
                  Placement.on_slurm()]
    for placement in placements:
        job = TrainingJob(placement, store)
        assert type(job) is TrainingJob and job.findChildren(QProcess) == [] and not job.is_running()
        assert job.pid == 0 and job.parts == []
    assert [len(p.places) for p in placements] == [1, 1, 2, 1]
    for host in (Host.local(), hosts[0]):
        assert AgentPart(host, grace_s=5).findChildren(QProcess) == []
    slurm = AgentPart(Host.local(), grace_s=5, runs_dir=str(store.root),
                      slurm=Placement.on_slurm().slurm_target())
    assert slurm.findChildren(QProcess) == []


def test_compare_shows_the_runs_scores_beside_their_curves(qtbot, tab: TrainingTab) -> None:
    """Compare in Runs: the curves of the chosen runs and, docked to their right in the Run page, the
    latest Evaluate scores of those that have any (as core.evaluation writes them)."""
    from gaudi_gui.core import evaluation
    from gaudi_gui.ui.eval_view import ScoresPanel
    store = tab.training.store
    runs = [store.create(JobConfig(name=f"r{i}")) for i in range(2)]
    for i, run in enumerate(runs):
        run.update_status(state="finished")
        evaluation.write_results(run.folder / evaluation.EVAL_DIR, {
            "base": {"metrics": {"rougeL": 0.1}}, "tuned": {"metrics": {"rougeL": 0.2 + i / 10}}}, [])
    tab.runs.refresh()
    click_history(qtbot, tab, "Refresh")
    tab.runs.table.selectAll()
    click_history(qtbot, tab, "Compare")
    panel = tab.runs.scores_panel
    assert isinstance(panel, ScoresPanel) and panel.parent() is tab.chart_row
    qtbot.waitUntil(panel.isVisible, timeout=5000)
    assert tab.views.currentWidget() is tab.live and tab.chart_row.widget(0) is tab.chart
    headers = {panel.table.horizontalHeaderItem(c).text() for c in range(1, panel.table.columnCount())}
    assert headers == {r.name for r in runs}
    assert panel.table.item(0, 0).text() == "rougeL"
    # A new view of a run hides the scores again.
    tab.runs.select_row(0)
    click_history(qtbot, tab, "Reopen")
    assert not panel.isVisible()


@pytest.mark.usefixtures("demo_model")
def test_ticked_cards_on_a_cpu_machine_are_said_ignored_and_not_charted(qtbot, fake_hl_smi: Path,
                                                                          tmp_path: Path) -> None:
    """Issue 25, item 9: Gaudi cards seen by hl-smi, but this Python has no habana_frameworks, so runs
    go to the CPU. Ticking cards in Devices started a CPU run with no word, and its chart plotted
    the cards' utilization as if the run used them."""
    from gaudi_gui.ui.main_window import MainWindow
    from tests.qt.test_devices_tab import click_row, row_of_module

    services = create_services()
    services.training.store = RunStore(tmp_path / "runs")
    window = MainWindow(services)
    qtbot.addWidget(window)
    window.resize(1400, 900)
    window.show()
    devices = window.devices_tab
    devices.poller.start()
    qtbot.waitUntil(lambda: devices.table.rowCount() == 8, timeout=20000)
    services.environment.refresh()  # as the app does after its first paint
    qtbot.waitUntil(lambda: services.environment.result is not None, timeout=120000)
    assert services.selection.jobs_kind == "cpu"  # no habana_frameworks here
    rows = row_of_module(devices)
    click_row(qtbot, devices, rows[4])
    click_row(qtbot, devices, rows[5])
    qtbot.waitUntil(lambda: services.selection.selected == [4, 5])
    bar = window.tabs.tabBar()
    titles = [window.tabs.tabText(i).replace("&", "") for i in range(window.tabs.count())]
    click(qtbot, bar, bar.tabRect(titles.index("Training")).center())
    tab = window.training_tab
    qtbot.waitUntil(lambda: tab.isVisible() and form_ready(tab), timeout=60000)
    tab.update_preview()
    assert "card(s) 4,5 are ignored: the run uses the CPU" in tab.form.hints.text()
    # The tab was built in the background before the probe answered, when the 8 cards counted: its
    # default process count follows the cards jobs use, one CPU process (it launched 8 CPU ranks).
    assert tab.form.num_processes.value() == 1
    set_arg(tab, "max_steps", "6")
    set_arg(tab, "logging_steps", "1")
    click(qtbot, tab.btn["Start"])
    qtbot.waitUntil(lambda: tab.job.run is not None, timeout=60000)
    assert "are ignored: the run uses the CPU" in tab.status.text()
    with qtbot.waitSignal(tab.job.finished, timeout=180000):
        pass
    store = services.poller.history_store
    keys: list[str] = store.keys()  # the history store's series, not a dict
    cards = {store.label(k) for k in keys if not k.startswith("host")}
    assert cards and not set(tab.chart._device_curves) & cards
    window.close()


# -- the run meter (issue 27) ---------------------------------------------------------------------------


@pytest.mark.usefixtures("demo_model")
def test_meter_line_and_runs_columns_after_a_gaudi_run(qtbot, fake_hl_smi: Path, tab: TrainingTab,
                                                       tmp_path: Path) -> None:
    """A real 3-step demo run started by a click, on a machine the probe calls Gaudi (the fake
    hl-smi's 8 cards on PATH; the Trainer itself runs on this CPU): the run's supervisor meters the
    cards, and the tab says what it cost under the status; the Runs list has its card-hours and kWh."""
    from gaudi_gui.core import meter_files, meter_words
    from gaudi_gui.ui.training_runs import COLUMNS
    tab.services.environment._result = {"device": "hpu"}  # as the probe of a Gaudi machine answers
    assert tab.training.device == "hpu"
    set_arg(tab, "output_dir", str(tmp_path / "out"))
    set_arg(tab, "max_steps", "3")
    set_arg(tab, "save_steps", "100")
    set_arg(tab, "logging_steps", "1")
    assert not tab.meter_line.isVisible()
    click(qtbot, tab.btn["Start"])
    job = tab.job
    # The live line as each step's metrics arrive (the tab's own slot ran first: it was bound first).
    live: list[tuple[str, str]] = []
    job.metrics_received.connect(lambda _r: live.append((tab.meter_line.text(), tab.eta.text())))
    qtbot.waitUntil(lambda: job.run is not None, timeout=60000)
    assert job.run is not None, tab.status.text()
    with qtbot.waitSignal(job.finished, timeout=180000) as blocker:
        pass
    assert blocker.args[1] == "finished", tab.status.text()
    by_step: dict[str, tuple[str, str]] = {}
    for meter_text, eta_text in live:  # the run's summary record repeats the last step: the first counts
        by_step.setdefault(eta_text.split()[1], (meter_text, eta_text))
    assert list(by_step) == ["1/3", "2/3", "3/3"], live
    # Step 1 is warm-up: the worker's averages so far, said so, and no ETA yet; from step 2 on the
    # rates and the ETA come from the steps after it.
    first, second, third = by_step.values()
    assert all(u in first[0] for u in ("steps/s", "samples/s", "tokens/s")), live
    assert "warm-up included" in first[0] and "ETA –" in first[1], live
    assert "warm-up" not in second[0] and "ETA –" not in second[1], live
    assert all(u in third[0] for u in ("steps/s", "samples/s", "tokens/s")), live
    summary = meter_files.read_summary(job.run.folder)
    assert summary is not None and summary["energy_source"] == "hl-smi power integrated"
    # What a person reads: the fake server's 8 cards (512 MiB each as hl-smi sees it).
    line = tab.meter_line.text()
    assert tab.meter_line.isVisible()
    kj = summary["energy_j"] / 1000
    assert line.startswith(f"8 cards · {meter_words.figure(summary['card_hours'])} card-hours · "), line
    assert f"· {kj:.1f} kJ (hl-smi power integrated) ·" in line
    assert f"mean {summary['power_mean_w']:.0f} W" in line and "peak device memory 512 MiB" in line, line
    assert f"util {summary['utilization_mean']:.0f} %" in line
    assert "not measured" not in line and " 0 J" not in line
    # No true device memory on the CPU (the ranks say so once), so no "(true: …)".
    assert "true:" not in line
    # The Runs list: card-hours and energy of that run, from its meter-summary.json.
    row = 0
    hours = meter_words.figure(summary["card_hours"])
    assert tab.runs.table.item(row, COLUMNS.index("card-hours")).text() == hours
    assert tab.runs.table.item(row, COLUMNS.index("energy")).text() == \
        f"{meter_words.figure(summary['energy_kwh'])} kWh"
    # The live line's ETA comes from the steps after warm-up (said in its tooltip).
    assert "after warm-up" in tab.eta.toolTip()
    # Reopened from Runs by a click: the same line (after the view was cleared by another run's view).
    tab.runs.select_row(0)
    click_history(qtbot, tab, "Compare")
    assert not tab.meter_line.isVisible()
    # Compare puts the run's meter beside the curves (it has no scores: the meter rows only).
    panel = tab.runs.scores_panel
    qtbot.waitUntil(lambda: panel is not None and panel.isVisible(), timeout=5000)
    rows = {panel.table.item(r, 0).text(): panel.table.item(r, 1).text()
            for r in range(panel.table.rowCount())}
    assert rows["card-hours"] == meter_words.figure(summary["card_hours"])
    assert rows["energy"] == f"{meter_words.figure(summary['energy_kwh'])} kWh"
    assert rows["mean power"] == f"{summary['power_mean_w']:.0f} W"
    click_history(qtbot, tab, "Reopen")
    assert tab.meter_line.isVisible() and tab.meter_line.text() == line

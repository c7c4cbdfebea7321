"""The Runs list keeps its selection by run, shows new runs and moving steps by itself (issue 25,
item 3), and the Training form says at the output folder that it holds another run's files (item 1)."""
# mypy: disable-error-code="union-attr"

from __future__ import annotations

import json
from pathlib import Path

import pytest
from PySide6.QtCore import QPoint, Qt

from gaudi_gui.core import outputs
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import RunStore
from gaudi_gui.ui.training_runs import COLUMNS, RunsTable
from tests.helpers import click, form_ready


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
    # Seen through the runs folder's watch (inotify), not a timer; the new run, not ended, is watched.
    from gaudi_gui.services import disk_watch
    assert {str(store.root), str(third.folder)} <= table._watched and not table._watch.isActive()
    selected_rows = {i.row() for i in table.table.selectedIndexes()}
    assert selected_rows == {_row_of(table, first.name)}
    # Resume (clicked) acts on that run, not on whatever now sits in its old row.
    with qtbot.waitSignal(table.resume_requested, timeout=2000) as resumed:
        click(qtbot, table.buttons["Resume"])
    assert resumed.args[0] == first
    # A running run's step moves on its own.
    third.update_status(state="running", step=7, max_steps=40)
    steps = COLUMNS.index("steps")
    qtbot.waitUntil(lambda: table.table.item(_row_of(table, third.name), steps).text() == "7/40",
                    timeout=10000)
    assert table.selected_runs() == [first]
    assert second in [table._runs[r] for r in range(3)]
    # A run that ended is no longer watched (this "running" one has no process: it reads as ended).
    qtbot.waitUntil(lambda: str(third.folder) not in table._watched, timeout=10000)
    assert str(store.root) in table._watched and not table._watch.isActive()
    table.hide()
    assert not table._watch.isActive() and table._watched == set()  # a hidden list watches nothing
    assert not disk_watch.shared().watching(str(store.root))


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
    qtbot.waitUntil(lambda: form_ready(tab), timeout=60000)
    editor = tab.form.editors["output_dir"].editor
    assert "folder of its own" in editor.placeholderText()  # type: ignore[attr-defined]  # empty is the default
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


# -- the run meter (issue 27) ---------------------------------------------------------------------------

def _metered_run(store: RunStore, tmp_path: Path, name: str, *, device: str, measured: bool,
                 compile_dumps: list[dict] | None = None, first_step_at: float = 0.0):
    """A finished run folder as the supervisor leaves it: events (3 logged steps, the ranks' true
    memory on Gaudi), meter-summary.json made by core.meter_account.summarize, and on Gaudi the bridge's
    compile-meter file (``compile_dumps``, written as the bridge writes it: an array, here cut short
    of its ``]`` as a killed rank leaves it)."""
    import datetime as dt

    from gaudi_gui.core import hpu_metrics, meter_account, meter_files
    from gaudi_gui.core.events import EventWriter

    run = store.create(JobConfig(name=name, training_args={"output_dir": str(tmp_path / name)}))
    run.update_status(state="finished", step=3, max_steps=3, started_at=first_step_at - 5,
                      ended_at=first_step_at + 5, summary="Finished 3 steps")
    with EventWriter(run.events_path) as events:
        for step in (1, 2, 3):
            extra = ({"memory_peak_mib": 9000.0 + step * 345, "memory_limit_mib": 98304.0}
                     if device == "hpu" else {})
            events.write("metrics", step=step, max_steps=3, loss=4.0 - step / 10, elapsed=step * 0.5,
                         time=first_step_at + step - 1, throughput=2.0, **extra)
    accounts = meter_account.Accounts()
    if measured:
        for k in range(11):
            accounts.add(first_step_at + k, [{"name": "module 2", "power_w": 100.0, "utilization": 90,
                                              "memory_used_mib": 12595.0},
                                             {"name": "module 3", "power_w": 105.0, "utilization": 84,
                                              "memory_used_mib": 12595.0}])
        summary = meter_account.summarize(accounts, source="hl-smi",
                                          energy_source=meter_account.SOURCE_HLSMI, wall_s=10.0,
                                  card_count=2, cards=[2, 3], kind=device)
    else:
        summary = meter_account.summarize(accounts, source="none", energy_source=meter_account.NOT_MEASURED,
                                          wall_s=10.0,
                                  card_count=None, kind=device,
                                  note="no readable RAPL counter under /sys/class/powercap")
    (run.folder / meter_files.SUMMARY_NAME).write_text(json.dumps(summary))
    if compile_dumps is not None:
        folder = run.folder / hpu_metrics.FOLDER_NAME
        folder.mkdir()
        text = "[" + ",".join(json.dumps({**d, "generated_on": dt.datetime.fromtimestamp(d.pop("at"))
                                          .isoformat()}) for d in compile_dumps)
        (folder / "metrics-rank0.json").write_text(text)  # no "]": the rank was killed
    return run


def _tab(qtbot, store: RunStore):
    from gaudi_gui.app import create_services
    from gaudi_gui.ui.training_tab import TrainingTab

    services = create_services()
    services.training.store = store
    tab = TrainingTab(services)
    qtbot.addWidget(tab)
    tab.resize(1400, 900)
    tab.show()
    qtbot.waitExposed(tab)
    qtbot.waitUntil(lambda: form_ready(tab), timeout=60000)
    return services, tab


def _reopen(qtbot, tab, name: str) -> None:
    bar = tab.views.tabBar()
    click(qtbot, bar, bar.tabRect(tab.views.indexOf(tab.runs)).center())
    qtbot.waitUntil(lambda: tab.views.currentWidget() is tab.runs, timeout=5000)
    _click_row(qtbot, tab.runs, _row_of(tab.runs, name))
    click(qtbot, tab.runs.buttons["Reopen"])
    qtbot.waitUntil(lambda: tab.views.currentWidget() is tab.live, timeout=5000)


def test_reopened_gaudi_run_shows_its_meter_and_compile_meter(qtbot, tmp_path: Path) -> None:
    """Reopen (clicked) of a finished Gaudi run: its cost under the status, with the ranks' true
    memory beside hl-smi's pool and the bridge's compilations split at the first logged step; the
    tooltip names the ops that fell back to the CPU."""
    import time

    t0 = time.time() - 100
    dumps = [
        {"metric_name": "graph_compilation", "triggered_by": "metric_change", "at": t0 - 3,
         "statistics": {"TotalNumber": 3, "TotalTime": 3000, "AvgTime": 1000}},
        {"metric_name": "graph_compilation", "triggered_by": "metric_change", "at": t0 - 1,
         "statistics": {"TotalNumber": 5, "TotalTime": 5200, "AvgTime": 1040}},
        {"metric_name": "cpu_fallback", "triggered_by": "metric_change", "at": t0 - 1,
         "statistics": {"TotalNumber": 4, "FallbackOps": {"aten::digamma": 3, "aten::_unique2": 1}}},
        {"metric_name": "graph_compilation", "triggered_by": "metric_change", "at": t0 + 1.5,
         "statistics": {"TotalNumber": 7, "TotalTime": 6100, "AvgTime": 871}},
    ]
    store = RunStore(tmp_path / "runs")
    run = _metered_run(store, tmp_path, "gaudi", device="hpu", measured=True, compile_dumps=dumps,
                       first_step_at=t0)
    services, tab = _tab(qtbot, store)
    try:
        row = _row_of(tab.runs, run.name)
        assert tab.runs.table.item(row, COLUMNS.index("card-hours")).text() == "0.0056"  # 2 cards x 10 s
        assert tab.runs.table.item(row, COLUMNS.index("energy")).text() == "0.00057 kWh"  # 205 W x 10 s
        assert not tab.meter_line.isVisible()
        _reopen(qtbot, tab, run.name)
        assert tab.meter_line.isVisible()
        assert tab.meter_line.text() == (
            "2 cards · 0.0056 card-hours · 2.0 kJ (hl-smi power integrated) · mean 205 W · util 87 % · "
            "peak device memory 12.3 GiB (true: 9.8 GiB) · 7 graph compilations (2 after warm-up)")
        tip = tab.meter_line.toolTip()
        assert "CPU-fallback ops: aten::digamma, aten::_unique2" in tip
        assert "file was cut" in tip  # the rank's array had no "]"
    finally:
        tab.shutdown()
        services.training.shutdown()


def test_unmeasured_run_says_not_measured_never_zero(qtbot, tmp_path: Path) -> None:
    """A CPU run without a readable RAPL counter: 'energy not measured (why)' under the status, 'not
    measured' in the Runs list's energy column (its tooltip says why), never 0 J or 0.0 kWh."""
    store = RunStore(tmp_path / "runs")
    run = _metered_run(store, tmp_path, "cpu", device="cpu", measured=False, first_step_at=1_700_000_000.0)
    services, tab = _tab(qtbot, store)
    try:
        row = _row_of(tab.runs, run.name)
        energy = tab.runs.table.item(row, COLUMNS.index("energy"))
        assert energy.text() == "not measured" and "energy not measured (no readable RAPL counter" in \
            energy.toolTip()
        assert tab.runs.table.item(row, COLUMNS.index("card-hours")).text() == "–"  # no cards
        assert tab.runs.table.item(row, COLUMNS.index("tokens/s")).text() == "not measured"
        assert tab.runs.table.item(row, COLUMNS.index("compilations")).text() == "–"  # not a Gaudi run
        _reopen(qtbot, tab, run.name)
        line = tab.meter_line.text()
        assert line == "CPU · energy not measured (no readable RAPL counter under /sys/class/powercap)"
        for shown in (line, tab.meter_line.toolTip(), energy.toolTip()):
            assert " 0 J" not in shown and "0.0 kWh" not in shown and "0 kWh" not in shown
        # Compare (clicked): the meter beside the (absent) scores says "not measured" too.
        click(qtbot, tab.views.tabBar(), tab.views.tabBar().tabRect(tab.views.indexOf(tab.runs)).center())
        _click_row(qtbot, tab.runs, row)
        click(qtbot, tab.runs.buttons["Compare"])
        panel = tab.runs.scores_panel
        qtbot.waitUntil(lambda: panel is not None and panel.isVisible(), timeout=5000)
        rows = {panel.table.item(r, 0).text(): panel.table.item(r, 1) for r in range(panel.table.rowCount())}
        assert rows["energy"].text() == "not measured" and "RAPL" in rows["energy"].toolTip()
        assert rows["mean power"].text() == "–"
    finally:
        tab.shutdown()
        services.training.shutdown()


def test_runs_list_reads_each_meter_once_per_change(qtbot, tmp_path: Path, monkeypatch) -> None:
    """The list refreshes itself whenever a status moves: a run's meter summary is read again only
    when its file changed (by its change time), not at every refresh."""
    import os

    from gaudi_gui.core import meter_files
    from gaudi_gui.ui import training_runs
    store = RunStore(tmp_path / "runs")
    run = _metered_run(store, tmp_path, "gaudi", device="hpu", measured=True, first_step_at=1_700_000_000.0)
    reads: list[Path] = []
    real = meter_files.read_summary
    def counted(folder: Path) -> dict | None:
        reads.append(Path(folder))
        return real(folder)

    monkeypatch.setattr(training_runs.meter_files, "read_summary", counted)
    table = RunsTable(store)
    qtbot.addWidget(table)
    table.show()
    for _ in range(3):
        click(qtbot, table.buttons["Refresh"])
    assert reads == [run.folder]
    cell = lambda: table.table.item(0, COLUMNS.index("card-hours")).text()  # noqa: E731
    assert cell() == "0.0056"
    # The summary rewritten (a later meter): read again on the next refresh, once.
    path = run.folder / meter_files.SUMMARY_NAME
    data = json.loads(path.read_text())
    data["card_hours"] = 0.25
    path.write_text(json.dumps(data))
    st = path.stat()
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 1_000_000_000))
    click(qtbot, table.buttons["Refresh"])
    click(qtbot, table.buttons["Refresh"])
    assert reads == [run.folder, run.folder] and cell() == "0.25"


def test_export_clicked_writes_tensorboard_events_or_trackio_of_the_selected_run(qtbot, tmp_path: Path,
                                                                                  monkeypatch) -> None:
    """Export… (clicked) offers TensorBoard or trackio. TensorBoard: Browse… asks for a folder (cancelled:
    nothing chosen, Export stays off and says why) and the run is written under <folder>/<run name>/,
    read back by TensorBoard's own reader; the next Export… starts in that folder and replaces the
    first. trackio: its folder and a project; a name trackio would store under another name is said at
    the field and Export stays off; then the run is read back by trackio's own storage class."""
    import os
    import subprocess
    import sys

    from PySide6.QtWidgets import QFileDialog

    from gaudi_gui.core import export
    accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")

    store = RunStore(tmp_path / "runs")
    run = _metered_run(store, tmp_path, "gaudi", device="hpu", measured=True, first_step_at=1_700_000_000.0)
    _metered_run(store, tmp_path, "other", device="cpu", measured=False, first_step_at=1_700_000_100.0)
    asked: list[str] = []
    answer = [""]

    def choose(_parent, caption: str, start: str) -> str:
        asked.append(start)
        return answer[0]

    monkeypatch.setattr(QFileDialog, "getExistingDirectory", choose)
    table = RunsTable(store)
    qtbot.addWidget(table)
    table.resize(900, 500)
    table.show()
    qtbot.waitExposed(table)
    _click_row(qtbot, table, _row_of(table, run.name))
    click(qtbot, table.buttons["Export…"])
    dialog = table.export_dialog
    qtbot.waitUntil(lambda: dialog is not None and dialog.isVisible(), timeout=5000)
    assert dialog.tensorboard.isChecked() and not dialog.export_button.isEnabled()
    assert dialog.problem.text() == "choose a folder for the TensorBoard files"
    click(qtbot, dialog.browse)  # cancelled: nothing chosen, nothing written
    assert len(asked) == 1 and dialog.tb_folder.text() == "" and not (tmp_path / "tb").exists()
    answer[0] = str(tmp_path / "tb")
    click(qtbot, dialog.browse)
    assert dialog.tb_folder.text() == str(tmp_path / "tb") and dialog.export_button.isEnabled()
    click(qtbot, dialog.export_button)
    qtbot.waitUntil(lambda: "exported" in table.status.text(), timeout=5000)
    assert not dialog.isVisible()
    assert f"tensorboard --logdir {tmp_path / 'tb'}" in table.status.text()
    acc = accumulator.EventAccumulator(str(tmp_path / "tb" / run.name))
    acc.Reload()
    assert [round(e.value, 4) for e in acc.Scalars("train/loss")] == [3.9, 3.8, 3.7]  # 32-bit floats
    assert [e.value for e in acc.Scalars("train/memory_peak_mib")] == [9345.0, 9690.0, 10035.0]
    assert table.buttons["Export…"].isEnabled()
    # The next export starts in the folder the last one went to (and replaces the first).
    click(qtbot, table.buttons["Export…"])
    qtbot.waitUntil(dialog.isVisible, timeout=5000)
    assert dialog.tb_folder.text() == str(tmp_path / "tb")
    table.status.setText("")
    click(qtbot, dialog.export_button)
    qtbot.waitUntil(lambda: table.buttons["Export…"].isEnabled() and "exported" in table.status.text(),
                    timeout=10000)
    assert len(list((tmp_path / "tb" / run.name).iterdir())) == 1

    click(qtbot, table.buttons["Export…"])
    qtbot.waitUntil(dialog.isVisible, timeout=5000)
    if export.trackio_state():  # trackio not installed here: its choice is off and says how to get it
        assert not dialog.trackio.isEnabled() and "pip install trackio" in dialog.trackio_note.text()
        return
    click(qtbot, dialog.trackio)
    for edit, text in ((dialog.trackio_dir, str(tmp_path / "tio")), (dialog.project, "my project")):
        edit.selectAll()
        qtbot.keyClicks(edit, text)
    assert "letters, digits, - and _" in dialog.problem.text() and not dialog.export_button.isEnabled()
    dialog.project.selectAll()
    qtbot.keyClicks(dialog.project, "gaudi")
    assert dialog.problem.text() == "" and dialog.export_button.isEnabled()
    click(qtbot, dialog.export_button)
    qtbot.waitUntil(lambda: table.buttons["Export…"].isEnabled()
                    and "trackio project 'gaudi'" in table.status.text(), timeout=60000)
    read = ("import json, sys; from trackio.sqlite_storage import SQLiteStorage as S; "
            "print(json.dumps([r.get('train/loss') for r in S.get_logs('gaudi', sys.argv[1])]))")
    res = subprocess.run([sys.executable, "-c", read, run.name], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "TRACKIO_DIR": str(tmp_path / "tio")})
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout.splitlines()[-1]) == pytest.approx([3.9, 3.8, 3.7])

    # A folder that cannot be written (a file is in the way): the agent's export child fails, and its
    # reason is said where the result would be, with Export on again.
    (tmp_path / "in-the-way").write_text("a file\n")
    click(qtbot, table.buttons["Export…"])
    qtbot.waitUntil(dialog.isVisible, timeout=5000)
    from PySide6.QtCore import QPoint
    click(qtbot, dialog.tensorboard, QPoint(8, dialog.tensorboard.height() // 2))  # on its circle
    assert dialog.tensorboard.isChecked()
    dialog.tb_folder.selectAll()
    qtbot.keyClicks(dialog.tb_folder, str(tmp_path / "in-the-way"))
    table.status.setText("")
    click(qtbot, dialog.export_button)
    qtbot.waitUntil(lambda: table.buttons["Export…"].isEnabled() and table.status.text().startswith("⚠"),
                    timeout=30000)
    assert "Traceback" not in table.status.text() and "in-the-way" in table.status.text()


def test_compare_shows_how_long_each_run_was_throttled(qtbot, tmp_path: Path) -> None:
    """Compare (clicked) of two Gaudi runs: a 'throttled' row beside the cost ('10 s (25 %)' for the run
    whose module 3 sat in power slowdown, its card and reason in the tooltip; '0 s' for the other),
    and the Runs list's tooltip says it too."""
    from gaudi_gui.core import meter_account, meter_files
    store = RunStore(tmp_path / "runs")
    slow = _metered_run(store, tmp_path, "slow", device="hpu", measured=True, first_step_at=1_700_000_000.0)
    fast = _metered_run(store, tmp_path, "fast", device="hpu", measured=True, first_step_at=1_700_000_100.0)
    for run, active in ((slow, ["power"]), (fast, [])):
        clocks = {"module 2": meter_account.ThrottleClock(), "module 3": meter_account.ThrottleClock()}
        for t in (0.0, 5.0, 10.0, 15.0):
            clocks["module 2"].add(t, [])
            clocks["module 3"].add(t, active if t >= 5 else [])
        path = run.folder / meter_files.SUMMARY_NAME
        data = json.loads(path.read_text())
        data["throttle"] = meter_account.throttle_summary(clocks, interval_s=5.0, wall_s=40.0)
        data["rates"] = {"steps_per_s": 2.0, "samples_per_s": 8.0, "steady": True, "from_step": 2,
                         "tokens_per_s": 900.0 if active else 2050.0}
        path.write_text(json.dumps(data))
    services, tab = _tab(qtbot, store)
    try:
        bar = tab.views.tabBar()
        click(qtbot, bar, bar.tabRect(tab.views.indexOf(tab.runs)).center())
        row = _row_of(tab.runs, slow.name)
        assert "throttled 10 s (25 % of the run): module 3 power 10 s" in \
            tab.runs.table.item(row, COLUMNS.index("energy")).toolTip()
        _click_row(qtbot, tab.runs, row)
        other = tab.runs.table.model().index(_row_of(tab.runs, fast.name), 0)
        qtbot.mouseClick(tab.runs.table.viewport(), Qt.MouseButton.LeftButton,
                         Qt.KeyboardModifier.ControlModifier, tab.runs.table.visualRect(other).center())
        assert {r.name for r in tab.runs.selected_runs()} == {slow.name, fast.name}
        click(qtbot, tab.runs.buttons["Compare"])
        panel = tab.runs.scores_panel
        qtbot.waitUntil(lambda: panel is not None and panel.isVisible(), timeout=5000)
        header = [panel.table.horizontalHeaderItem(c).text() for c in range(panel.table.columnCount())]
        rows = {panel.table.item(r, 0).text(): r for r in range(panel.table.rowCount())}
        cell = lambda name: panel.table.item(rows["throttled"], header.index(name))  # noqa: E731
        assert cell(slow.name).text() == "10 s (25 %)" and "module 3 power 10 s" in cell(slow.name).toolTip()
        assert cell(fast.name).text() == "0 s" and "not throttled" in cell(fast.name).toolTip()
        pace = lambda name: panel.table.item(rows["tokens/s"], header.index(name))  # noqa: E731
        assert pace(slow.name).text() == "900" and pace(fast.name).text() == "2050"
        assert pace(slow.name).toolTip() == "2 steps/s · 8 samples/s · 900 tokens/s (after warm-up)"
    finally:
        tab.shutdown()
        services.training.shutdown()


def test_meter_columns_sort_by_a_header_click_with_not_measured_last(qtbot, tmp_path: Path) -> None:
    """tokens/s, compilations and energy in the Runs list; a click on a column's header sorts the runs
    by its figure (again: the other way), "not measured" after every figure either way, never read as
    0; the selection and the buttons still act on the run clicked, wherever sorting moved it."""
    import time

    from gaudi_gui.core import meter_files

    t0 = time.time() - 100
    dumps = [{"metric_name": "graph_compilation", "triggered_by": "metric_change", "at": t0 - 3,
              "statistics": {"TotalNumber": 3, "TotalTime": 3000, "AvgTime": 1000}},
             {"metric_name": "graph_compilation", "triggered_by": "metric_change", "at": t0 + 1.5,
              "statistics": {"TotalNumber": 7, "TotalTime": 6100, "AvgTime": 871}}]
    store = RunStore(tmp_path / "runs")
    gaudi = _metered_run(store, tmp_path, "gaudi", device="hpu", measured=True, compile_dumps=dumps,
                         first_step_at=t0)
    cold = _metered_run(store, tmp_path, "cold", device="cpu", measured=False, first_step_at=t0)
    small = _metered_run(store, tmp_path, "small", device="hpu", measured=True, first_step_at=t0)
    for run, rate, joules in ((gaudi, 30720.0, None), (small, 512.0, 800.0)):
        summary = json.loads((run.folder / meter_files.SUMMARY_NAME).read_text())
        summary["rates"] = {"steps_per_s": 1.9, "tokens_per_s": rate, "steady": True}
        if joules is not None:
            summary["energy_j"], summary["energy_kwh"] = joules, joules / 3.6e6
        (run.folder / meter_files.SUMMARY_NAME).write_text(json.dumps(summary))
    table = RunsTable(store)
    qtbot.addWidget(table)
    table.resize(1300, 500)
    table.show()
    qtbot.waitExposed(table)
    cell = lambda name, col: table.table.item(_row_of(table, name), COLUMNS.index(col)).text()  # noqa: E731
    assert cell(gaudi.name, "tokens/s") == "30720" and cell(small.name, "tokens/s") == "512"
    assert cell(gaudi.name, "compilations") == "7 (4 after warm-up)"
    assert cell(small.name, "compilations") == "not measured"  # a Gaudi run whose bridge wrote nothing
    assert cell(cold.name, "energy") == "not measured" and cell(cold.name, "tokens/s") == "not measured"
    assert "0.00057 kWh" in cell(gaudi.name, "energy")
    header = table.table.horizontalHeader()

    def sort_by(column: str) -> list[str]:
        index = COLUMNS.index(column)
        click(qtbot, header.viewport(), QPoint(header.sectionViewportPosition(index)
                                               + header.sectionSize(index) // 2, header.height() // 2))
        names = [table.table.item(r, 0).text() for r in range(table.table.rowCount())]
        return [next(n for n in ("gaudi", "cold", "small") if name.endswith(n)) for name in names]

    assert sort_by("energy") == ["small", "gaudi", "cold"]  # 800 J, 2050 J, not measured last
    assert sort_by("energy") == ["gaudi", "small", "cold"]  # descending: not measured still last
    assert sort_by("tokens/s") == ["small", "gaudi", "cold"]
    assert sort_by("compilations") in (["gaudi", "small", "cold"], ["gaudi", "cold", "small"])
    # The row clicked is the run the buttons act on, wherever the sort put it.
    _click_row(qtbot, table, _row_of(table, small.name))
    assert table.selected_runs() == [small]
    with qtbot.waitSignal(table.resume_requested, timeout=2000) as resumed:
        click(qtbot, table.buttons["Resume"])
    assert resumed.args == [small]
    # A refresh (a new run appears) keeps the sort and the selection on that run.
    store.create(JobConfig(name="late", training_args={"output_dir": str(tmp_path / "late")}))
    qtbot.waitUntil(lambda: table.table.rowCount() == 4, timeout=10000)
    assert table.selected_runs() == [small]


def test_prices_clicked_turn_the_meter_into_a_cost_in_tooltips_compare_and_runs_show(qtbot,
                                                                                    tmp_path: Path) -> None:
    """Prices… (clicked): a price per kWh and per card-hour with a currency, saved by clicking Save;
    the Runs list's meter tooltips and Compare (clicked) say the cost, a run whose energy nobody
    measured says what was left out; `gaudi-gui runs show` reads the same settings. Before any price:
    no cost anywhere."""
    import subprocess
    import sys

    from PySide6.QtWidgets import QDialogButtonBox

    store = RunStore(tmp_path / "runs")
    gaudi = _metered_run(store, tmp_path, "gaudi", device="hpu", measured=True)
    cold = _metered_run(store, tmp_path, "cold", device="cpu", measured=False)
    table = RunsTable(store)
    qtbot.addWidget(table)
    table.resize(1300, 500)
    table.show()
    qtbot.waitExposed(table)
    tip = lambda run: table.table.item(_row_of(table, run.name), COLUMNS.index("energy")).toolTip()  # noqa: E731
    assert "cost" not in tip(gaudi)
    click(qtbot, table.buttons["Prices…"])
    dialog = table.prices_dialog
    qtbot.waitUntil(lambda: dialog is not None and dialog.isVisible(), timeout=5000)
    for box, text in ((dialog.per_kwh, "0.5"), (dialog.per_card_hour, "2")):
        box.lineEdit().selectAll()
        qtbot.keyClicks(box.lineEdit(), text)
    dialog.currency.clear()
    qtbot.keyClicks(dialog.currency, "EUR")
    click(qtbot, dialog.buttons.button(QDialogButtonBox.StandardButton.Save))
    qtbot.waitUntil(lambda: not dialog.isVisible(), timeout=5000)
    assert table.status.text() == "prices saved: 0.50 EUR per kWh, 2.00 EUR per card-hour"
    # 2 cards x 10 s = 0.0056 card-hours (0.011 EUR); 2050 J = 0.00057 kWh (0.00028 EUR).
    qtbot.waitUntil(lambda: "cost 0.011 EUR (energy 0.00028 EUR + card-hours 0.011 EUR)" in tip(gaudi),
                    timeout=5000)
    assert "cost not known (energy not measured; no card-hours (no cards))" in tip(cold)
    # Compare (clicked, both runs selected): a cost row under the meter rows.
    _click_row(qtbot, table, _row_of(table, gaudi.name))
    rect = table.table.visualRect(table.table.model().index(_row_of(table, cold.name), 0))
    qtbot.mouseClick(table.table.viewport(), Qt.MouseButton.LeftButton, Qt.KeyboardModifier.ControlModifier,
                     rect.center())
    click(qtbot, table.buttons["Compare"])
    panel = table.scores_panel
    qtbot.waitUntil(lambda: panel is not None and panel.isVisible(), timeout=5000)
    rows = {panel.table.item(r, 0).text(): r for r in range(panel.table.rowCount())}
    header = [panel.table.horizontalHeaderItem(c).text() for c in range(panel.table.columnCount())]
    assert panel.table.item(rows["cost"], header.index(gaudi.name)).text() == "0.011 EUR"
    assert panel.table.item(rows["cost"], header.index(cold.name)).text() == "not known"
    # The command line reads the same settings file (GAUDI_GUI_HOME of this test).
    shown = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(store.root), "show",
                            gaudi.name], capture_output=True, text=True, timeout=60)
    assert "cost 0.011 EUR (energy 0.00028 EUR + card-hours 0.011 EUR)" in shown.stdout, shown.stdout
    as_json = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(store.root),
                              "show", gaudi.name, "--json", "--price-kwh", "1", "--price-card-hour", "0"],
                             capture_output=True, text=True, timeout=60)
    cost = json.loads(as_json.stdout)["cost"]
    assert cost["total"] == pytest.approx(2050 / 3.6e6) and cost["cards"] is None
    # Cleared (0 is "not set"): no cost anywhere again.
    click(qtbot, table.buttons["Prices…"])
    qtbot.waitUntil(dialog.isVisible, timeout=5000)
    for box in (dialog.per_kwh, dialog.per_card_hour):
        box.lineEdit().selectAll()
        qtbot.keyClicks(box.lineEdit(), "0")
    click(qtbot, dialog.buttons.button(QDialogButtonBox.StandardButton.Save))
    qtbot.waitUntil(lambda: "cost" not in tip(gaudi), timeout=5000)
    assert "cost" not in {panel.table.item(r, 0).text() for r in range(panel.table.rowCount())}
    table.shutdown()

"""Issue 40 in the window, clicked: the form's "Profile N steps" field typed into and read back as the job's
profile_steps; a profiled run's "Profile…" page (top operators, host vs device, compilations, the rules'
sentences) and its "Open trace" (QDesktopServices.openUrl patched to record the URL: the one fake);
a run without a profile says how to make one."""
# mypy: disable-error-code="union-attr"

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path

from PySide6.QtCore import Qt, QUrl
from PySide6.QtGui import QDesktopServices

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, RunStore
from gaudi_gui.core.training_args import Schema
from gaudi_gui.ui.profile_view import ProfileView
from gaudi_gui.ui.training_form import TrainingForm
from gaudi_gui.ui.training_runs import RunsTable
from tests.helpers import click


def _run(store: RunStore, tmp_path: Path, name: str, *, profiled: bool) -> Run:
    run = store.create(JobConfig(name=name, training_args={"output_dir": str(tmp_path / name)}))
    run.update_status(state="finished", step=6, max_steps=6, started_at=1_700_000_000.0,
                      ended_at=1_700_000_010.0, summary="Finished 6 steps")
    if not profiled:
        return run
    t0 = 1_800_000_000.0
    folder = run.folder / "profile"
    folder.mkdir()
    (folder / "rank0.1.pt.trace.json").write_text(json.dumps({"traceEvents": [
        {"name": f"ProfilerStep#{i}", "ph": "X", "ts": i, "dur": 1} for i in (3, 4, 5)]}))
    ops = [{"name": "aten::mm", "calls": 132, "self_host_ms": 470.8, "host_total_ms": 470.8,
            "self_device_ms": 0.0, "device_total_ms": 0.0},
           {"name": "aten::_fused_adamw_", "calls": 6, "self_host_ms": 332.4, "host_total_ms": 332.6,
            "self_device_ms": 0.0, "device_total_ms": 0.0}]
    (folder / "summary.json").write_text(json.dumps({
        "steps": 3, "first_step": 3, "activities": ["cpu"], "step_mean_s": 0.1, "step_total_ms": 300.0,
        "host_ms": 290.0, "device_ms": None, "dataloader_ms": 120.0, "collective_ms": 0.0,
        "t0": t0, "t1": t0 + 0.3, "top_operators": ops}))
    # The Gaudi bridge's compile meter of the run: 3 compilations (126 ms) inside the profiled steps.
    (run.folder / "hpu-metrics").mkdir()
    dumps = [{"metric_name": "graph_compilation", "generated_on": dt.datetime.fromtimestamp(t).isoformat(),
              "statistics": {"TotalNumber": n, "TotalTime": ms}}
             for t, n, ms in ((t0 - 1, 10, 2000), (t0 + 0.2, 13, 2126))]
    (run.folder / "hpu-metrics" / "metrics-rank0.json").write_text("[" + ",".join(map(json.dumps, dumps)))
    return run


def _select(qtbot, table: RunsTable, run: Run) -> None:
    row = next(r for r in range(table.table.rowCount()) if table.table.item(r, 0).text().startswith(run.name))
    rect = table.table.visualRect(table.table.model().index(row, 0))
    click(qtbot, table.table.viewport(), rect.center())
    assert table.selected_runs() == [run]


def test_profile_page_clicked(qtbot, tmp_path: Path, monkeypatch) -> None:
    store = RunStore(tmp_path / "runs")
    plain = _run(store, tmp_path, "plain", profiled=False)
    profiled = _run(store, tmp_path, "profiled", profiled=True)
    opened: list[str] = []
    answer = {"opened": True}

    def open_url(url: QUrl) -> bool:
        opened.append(url.toString())
        return answer["opened"]

    monkeypatch.setattr(QDesktopServices, "openUrl", open_url)
    table = RunsTable(store)
    qtbot.addWidget(table)
    table.resize(1000, 500)
    table.show()
    qtbot.waitExposed(table)

    _select(qtbot, table, plain)
    click(qtbot, table.buttons["Profile…"])
    qtbot.waitUntil(lambda: "plain was not profiled" in table.status.text())
    assert "--profile-steps N" in table.status.text()
    assert table.profile_view is None or not table.profile_view.isVisible()

    _select(qtbot, table, profiled)
    click(qtbot, table.buttons["Profile…"])
    qtbot.waitUntil(lambda: table.profile_view is not None and table.profile_view.isVisible())
    view = table.profile_view
    assert isinstance(view, ProfileView)
    qtbot.waitExposed(view)
    assert view.table.rowCount() == 2 and view.table.item(0, 0).text() == "aten::mm"
    assert view.table.item(0, 2).text() == "470.8" and view.table.item(0, 3).text() == "–"
    assert "3 profiled step(s) (steps 3–5" in view.heading.text()
    times = view.times.text()
    assert "host 290.0 ms" in times and "device: none recorded" in times
    assert "graph compilations: 3 (126.0 ms)" in times
    advice = view.advice.text()
    assert "42 % of step time is graph compilation" in advice and "pad_to_multiple_of" in advice
    assert "data loader takes 40 % of step time" in advice and "dataloader_num_workers" in advice
    trace = profiled.folder / "profile" / "rank0.1.pt.trace.json"
    assert str(trace) in view.where.text()

    with qtbot.waitSignal(view.trace_opened) as blocker:
        click(qtbot, view.open_button)
    assert opened == [QUrl.fromLocalFile(str(trace)).toString()] and blocker.args[1] is True
    assert "opened with this desktop's program" in view.where.text()
    # Nothing on this desktop takes a .json trace: the page says where the file is.
    answer["opened"] = False
    click(qtbot, view.open_button)
    qtbot.waitUntil(lambda: "no program here opens it" in view.where.text())
    assert str(trace) in view.where.text() and "ui.perfetto.dev" in view.where.text()
    assert len(opened) == 2
    view.close()


def test_profile_steps_field_typed_into_is_the_job_key(qtbot, real_schema: Schema) -> None:
    form = TrainingForm()
    qtbot.addWidget(form)
    form.set_schema(real_schema)
    form.set_job(JobConfig(training_args={"max_steps": 20}))
    form.show()
    qtbot.waitExposed(form)
    spin = form.profile_steps
    assert spin.text() == "off" and form.job()[0].profile_steps == 0
    spin.setFocus()
    qtbot.keyClick(spin, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClicks(spin, "3")
    qtbot.waitUntil(lambda: spin.value() == 3)
    job = form.job()[0]
    assert job.profile_steps == 3 and job.to_dict()["profile_steps"] == 3
    assert not [f for f, _m in form.check()[1] if f == "profile_steps"]
    # More than max_steps leaves room for: marked at the field.
    qtbot.keyClick(spin, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClicks(spin, "19")
    qtbot.waitUntil(lambda: spin.value() == 19)
    problems = dict(form.check()[1])
    assert "max_steps is 20" in problems["profile_steps"] and "max_steps is 20" in spin.toolTip()
    # Stepped down to 0 with the arrow key: off again, and the job file has no key.
    qtbot.keyClick(spin, Qt.Key.Key_A, Qt.KeyboardModifier.ControlModifier)
    qtbot.keyClicks(spin, "1")
    qtbot.keyClick(spin, Qt.Key.Key_Down)
    qtbot.waitUntil(lambda: spin.text() == "off")
    assert "profile_steps" not in form.job()[0].to_dict()
    # A job that profiles shows in the field.
    form.set_job(JobConfig(training_args={"max_steps": 20}, profile_steps=5))
    assert spin.value() == 5

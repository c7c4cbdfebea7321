"""Did preference tuning work (issue 41, part 4): a DPO run's rewards, chosen vs rejected, their margin and
accuracy, drawn live beside the loss as the run's events arrive through the real path (a ``runs follow``
child reading the run's events.jsonl, the training job, the tab); an SFT run reopened shows no reward
chart; Compare overlays the preference runs' rewards and names in words a run that has none.

The logging steps are TRL 1.16's own: what ``DPOTrainer.log`` gave ``on_log`` in a 6-step run on the
demo model (beta 0.1, batch 4, plain prompt/chosen/rejected pairs), rounded; each is written as the
worker writes a metrics record (its fixed keys, then TRL's ``rewards/*`` and ``logps/*`` under their
own names)."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import QPoint, Qt
from pytestqt.qtbot import QtBot

from gaudi_gui.core import evaluation
from gaudi_gui.core.events import EventType, EventWriter
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.proctree import ProcessRef
from gaudi_gui.core.runstore import SUPERVISOR_INFO, Run, RunStore
from gaudi_gui.ui.training_tab import TrainingTab
from tests import helpers
from tests.qt.test_chart_layout import assert_area_readable

#: (loss, rewards/chosen, rewards/rejected, rewards/accuracies, rewards/margins, logps/chosen) per step.
DPO_STEPS = [(0.6931, 0.0, 0.0, 0.0, 0.0, -41.66),
             (0.6925, 0.001207, -0.0000018, 0.75, 0.001209, -41.658),
             (0.6917, 0.001389, -0.001552, 1.0, 0.002942, -41.654),
             (0.6913, 0.00222, -0.001455, 1.0, 0.003675, -41.733),
             (0.6909, 0.002822, -0.0016, 1.0, 0.004422, -41.608),
             (0.6916, 0.001983, -0.001059, 1.0, 0.003042, -41.612)]


def _logs(step: int, scale: float = 1.0, kto: bool = False) -> dict[str, Any]:
    """Step ``step``'s (1-based) logs as the trainer hands them to ``on_log`` (``scale``: another run;
    ``kto``: as KTOTrainer logs them, without accuracies)."""
    loss, chosen, rejected, accuracy, margin, logps = DPO_STEPS[step - 1]
    logs = {"loss": loss, "grad_norm": 4.68, "learning_rate": 1e-6 * (7 - step) / 6, "entropy": 5.41,
            "num_tokens": 112.0 * step, "logits/chosen": -1.007, "logits/rejected": -1.078,
            "mean_token_accuracy": 0.0, "rewards/chosen": chosen * scale,
            "rewards/rejected": rejected * scale, "rewards/accuracies": accuracy,
            "rewards/margins": margin * scale, "logps/chosen": logps,
            "logps/rejected": -34.4, "epoch": 0.25 * step}
    if kto:
        del logs["rewards/accuracies"]
    return logs


def _write_step(events: EventWriter, step: int, logs: dict[str, Any], t0: float) -> None:
    """One metrics event as workers/train.py writes it."""
    events.write(EventType.METRICS, step=step, max_steps=6, start_step=0, loss=logs["loss"],
                 learning_rate=logs["learning_rate"], epoch=logs["epoch"], grad_norm=logs["grad_norm"],
                 elapsed=float(step), throughput=1.0, samples_per_second=4.0, tokens_per_second=112.0,
                 time=t0 + step, **{k: v for k, v in logs.items() if k.startswith(("rewards/", "logps/"))})


def _run(store: RunStore, name: str, *, preference: bool, scale: float = 1.0, steps: int = 6,
         state: str = "finished", kto: bool = False) -> Run:
    made = store.create(JobConfig(name=name, training_args={"output_dir": str(store.root / "out" / name)}))
    run = Run(made.folder.with_name(name))
    made.folder.rename(run.folder)
    t0 = time.time() - 60
    with EventWriter(run.events_path) as events:
        events.write(EventType.TRAINING_STARTED, max_steps=6, world_size=1, start_step=0)
        for step in range(1, steps + 1):
            logs = _logs(step, scale, kto) if preference else {
                "loss": 2.5 - 0.2 * step, "learning_rate": 1e-4, "grad_norm": 1.0, "epoch": 0.25 * step}
            _write_step(events, step, logs, t0)
    run.update_status(state=state, step=steps, max_steps=6, started_at=t0,
                      **({"ended_at": t0 + 7, "final_loss": 0.69, "summary": "Finished 6 steps"}
                         if state == "finished" else {}))
    return run


def _curve(curve: Any) -> tuple[list[float], list[float]]:
    x, y = curve.getData()
    return ([], []) if x is None else (list(map(float, x)), list(map(float, y)))


def _close(got: Sequence[float], want: Sequence[float]) -> bool:
    return len(got) == len(want) and all(math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)
                                         for a, b in zip(got, want, strict=True))


def _click_row(qtbot: QtBot, tab: TrainingTab, name: str,
               modifier: Any = Qt.KeyboardModifier.NoModifier) -> None:
    table = tab.runs.table
    row = next(r for r in range(table.rowCount()) if name in getattr(table.item(r, 0), "text", str)())
    qtbot.mouseClick(table.viewport(), Qt.MouseButton.LeftButton, modifier,
                     table.visualRect(table.model().index(row, 0)).center())


def _open_runs(qtbot: QtBot, tab: TrainingTab, count: int) -> None:
    bar = tab.views.tabBar()
    helpers.click(qtbot, bar, bar.tabRect(tab.views.indexOf(tab.runs)).center())
    qtbot.waitUntil(lambda: tab.runs.table.rowCount() == count, timeout=10_000)


def test_a_dpo_runs_rewards_are_drawn_live_beside_the_loss_and_an_sft_run_has_none(
        qtbot: QtBot, tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    sft = _run(store, "20261206-101500-sft", preference=False)
    dpo = _run(store, "20261206-103000-dpo", preference=True, steps=3, state="running")
    # The run's supervisor, as `gaudi-gui train` leaves one: a live process the run folder names.
    supervisor = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"],
                                  start_new_session=True)
    services = None
    try:
        ref = ProcessRef.of(supervisor.pid)
        assert ref is not None
        (dpo.folder / SUPERVISOR_INFO).write_text(json.dumps({"pid": ref.pid,
                                                              "create_time": ref.create_time}))
        services, tab = helpers.training_tab(qtbot, tmp_path)  # the tab re-attaches to the running run
        tab.resize(1024, 700)
        chart, rewards = tab.chart, tab.chart.rewards
        qtbot.waitUntil(lambda: len(_curve(rewards.chosen_curve)[0]) == 3, timeout=30_000)
        assert rewards.isVisible() and chart.area.isVisible()
        # Beside the loss, not under it; the same steps.
        assert rewards.geometry().left() >= chart.area.geometry().right()
        assert rewards.rewards_plot.getPlotItem().getViewBox().linkedView(0) is \
            chart.loss_plot.getPlotItem().getViewBox()
        # Live: the next steps the worker appends are drawn as they come.
        t0 = time.time() - 30
        with EventWriter(dpo.events_path) as events:
            for step in (4, 5, 6):
                _write_step(events, step, _logs(step), t0)
        qtbot.waitUntil(lambda: len(_curve(rewards.margins_curve)[0]) == 6, timeout=30_000)
        steps = [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        for curve, column in ((rewards.chosen_curve, 1), (rewards.rejected_curve, 2),
                              (rewards.accuracy_curve, 3), (rewards.margins_curve, 4)):
            x, y = _curve(curve)
            assert x == steps and _close(y, [row[column] for row in DPO_STEPS]), (column, y)
        assert _close(_curve(chart._loss_curve)[1], [row[0] for row in DPO_STEPS])
        for plot in rewards.plots():
            assert rewards.area.is_shown(plot) and plot.isVisible()
        # Which line is which, in each line's colour, above the charts (not in a box over the points).
        key = rewards.key
        assert key.isVisible() and "#2ca02c'>━━ chosen" in key.text() and "#d62728'>━━ rejected" in key.text()
        assert key.geometry().bottom() < rewards.geometry().top()
        assert rewards.chosen_curve.opts["pen"].color().name() == "#2ca02c"

        # The run ends; an SFT run reopened from the Runs list shows its loss and no reward chart.
        with EventWriter(dpo.events_path) as events:
            events.write(EventType.FINISHED, global_step=6, max_steps=6, final_loss=0.6916)
        dpo.update_status(state="finished", ended_at=time.time(), summary="Finished 6 steps")
        (dpo.folder / SUPERVISOR_INFO).unlink()
        supervisor.kill()
        supervisor.wait()
        assert services.training is not None
        qtbot.waitUntil(lambda: not services.training.running(), timeout=30_000)  # type: ignore[union-attr]
        _open_runs(qtbot, tab, 2)
        _click_row(qtbot, tab, sft.name)
        helpers.click(qtbot, tab.runs.buttons["Reopen"])
        qtbot.waitUntil(lambda: tab.views.currentWidget() is tab.live, timeout=5000)
        qtbot.waitUntil(lambda: chart.point_count() == 6, timeout=5000)
        assert not rewards.isVisibleTo(tab) and not rewards.key.isVisibleTo(tab)
        assert all(not _curve(c)[0] for c in (rewards.chosen_curve, rewards.margins_curve))
        # Reopening the DPO run brings them back, whole.
        _open_runs(qtbot, tab, 2)
        _click_row(qtbot, tab, dpo.name)
        helpers.click(qtbot, tab.runs.buttons["Reopen"])
        qtbot.waitUntil(lambda: rewards.isVisible() and len(_curve(rewards.margins_curve)[0]) == 6,
                        timeout=5000)
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()
        if services is not None:
            helpers.end_training_tab(qtbot, services, tab)


def test_compare_overlays_a_dpo_and_a_kto_runs_margins_and_says_the_sft_run_has_none(
        qtbot: QtBot, tmp_path: Path) -> None:
    services, tab = helpers.training_tab(qtbot, tmp_path)
    try:
        assert services.training is not None
        store = services.training.store
        names = ("20261206-110000-dpo", "20261206-120000-kto", "20261206-130000-sft")
        dpo = _run(store, names[0], preference=True)
        _run(store, names[1], preference=True, scale=5.0, kto=True)
        # Evaluated: Compare docks its scores beside the charts, which leaves a 1024-pixel window less
        # room for the two columns of charts.
        evaluation.write_results(dpo.folder / evaluation.EVAL_DIR, {
            "base": {"metrics": {"rougeL": 0.1}}, "tuned": {"metrics": {"rougeL": 0.3}}}, [])
        _run(store, names[2], preference=False)
        tab.resize(1024, 700)
        _open_runs(qtbot, tab, 3)
        _click_row(qtbot, tab, names[0])
        for name in names[1:]:
            _click_row(qtbot, tab, name, Qt.KeyboardModifier.ControlModifier)
        assert len(tab.runs.selected_runs()) == 3
        helpers.click(qtbot, tab.runs.buttons["Compare"])
        qtbot.waitUntil(lambda: tab.views.currentWidget() is tab.live, timeout=5000)
        rewards = tab.chart.rewards
        qtbot.waitUntil(rewards.isVisible, timeout=5000)

        def drawn(plot: Any) -> list[tuple[list[float], list[float]]]:
            return [c for c in map(_curve, plot.getPlotItem().listDataItems()) if c[0]]

        margins = sorted(drawn(rewards.margins_plot), key=lambda c: max(c[1]))
        assert len(margins) == 2  # the DPO and the KTO run; the SFT run has no curve here
        assert margins[0][0] == [1.0, 2.0, 3.0, 4.0, 5.0, 6.0]
        assert _close(margins[0][1], [row[4] for row in DPO_STEPS])
        assert _close(margins[1][1], [row[4] * 5 for row in DPO_STEPS])
        assert len(drawn(rewards.rewards_plot)) == 4  # chosen and rejected (dashed) of each
        styles = sorted(c.opts["pen"].style().name for c in rewards.rewards_plot.getPlotItem().listDataItems()
                        if _curve(c)[0])
        assert styles == ["DashLine", "DashLine", "SolidLine", "SolidLine"]
        assert "╍╍ rejected" in rewards.key.text()
        accuracy = drawn(rewards.accuracy_plot)  # the DPO run's: KTO logs none
        assert len(accuracy) == 1 and _close(accuracy[0][1], [row[3] for row in DPO_STEPS])
        # Each run in its legend-row colour; the SFT run named as absent, in words.
        colors = {c.opts["pen"].color().name() for c in rewards.margins_plot.getPlotItem().listDataItems()
                  if _curve(c)[0]}
        legend_colors = {label.text().split("color:")[1][:7] for label in tab.chart.legend_labels
                         if "sft" not in label.toolTip()}
        assert colors == legend_colors and len(colors) == 2
        note = tab.chart.reward_note
        assert note.isVisible()
        assert note.text() == ("not in the reward charts: 130000-sft (no rewards logged); "
                               "120000-kto logged no accuracy")
        # Under the row that names the runs, above every chart (the rewards stay level with the loss),
        # whole inside the chart's width (a long line once pushed the charts past the window's edge).
        chart = tab.chart
        panel = tab.runs.scores_panel
        assert panel is not None
        qtbot.waitUntil(panel.isVisible, timeout=5000)
        qtbot.wait(300)  # laid out as a person sees it (a layout request is handled after the event)
        assert chart.legend_row.geometry().bottom() < note.geometry().top()
        assert note.geometry().bottom() < chart.area.geometry().top()
        # Beside the loss, level with it, every chart readable, and neither the charts nor the scores
        # pushed past the window's right edge.
        assert chart.area.geometry().top() == chart.rewards.geometry().top()
        assert chart.rewards.geometry().left() >= chart.area.geometry().right()
        for widget in (chart.rewards, panel):
            right = widget.mapTo(tab, QPoint(widget.width(), 0)).x()
            assert right <= tab.width(), f"{widget} ends at x={right}, past the {tab.width()} px window"
        for plot in (*chart.rewards.plots(), chart.loss_plot):  # each chart whole in its cell
            view = plot.getPlotItem().getViewBox().sceneBoundingRect()
            assert view.right() <= plot.width() + 1, (plot, view, plot.width())
        assert assert_area_readable(qtbot, chart.rewards.area, "Compare's rewards at 1024x700") == 3
        assert assert_area_readable(qtbot, chart.area, "Compare's loss at 1024x700") >= 2
        # The loss chart still draws all three; no compared run has a meter, so no card chart.
        assert len(drawn(tab.chart.loss_plot)) == 3
        assert not chart.area.is_shown(chart.device_plot)
        # Reopening one run ends the comparison: its own rewards, no note, the card chart as before.
        _open_runs(qtbot, tab, 3)
        _click_row(qtbot, tab, names[2])
        helpers.click(qtbot, tab.runs.buttons["Reopen"])
        qtbot.waitUntil(lambda: tab.views.currentWidget() is tab.live, timeout=5000)
        qtbot.waitUntil(lambda: chart.point_count() == 6, timeout=5000)
        assert not note.isVisible() and not chart.rewards.isVisible() and not chart.legend_row.isVisible()
        assert chart.area.is_shown(chart.device_plot)
    finally:
        helpers.end_training_tab(qtbot, services, tab)

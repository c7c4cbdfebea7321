"""The Training tab's meter strip (issue 27) on a real run started by a click: watts now and Wh so far
while it trains (the fake hl-smi's 8 recorded cards), as the agent reads the run's meter.jsonl and
sends it (its ``meter`` event, issue 38 item 7: the window opens no meter.jsonl), and the run meter's
warning when graph compilations keep rising after warm-up, live (a bridge metrics file written into
the run folder as Intel's bridge writes it, timed at the run's own logged steps) and again when the
stopped run is reopened."""
# mypy: disable-error-code="union-attr"

from __future__ import annotations

import builtins
import datetime as dt
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gaudi_gui.core import hpu_metrics
from gaudi_gui.core.events import EventType
from tests.helpers import click, set_arg
from tests.qt.test_training_tab import click_history, tab  # noqa: F401 - the fixture

DATA = Path(__file__).resolve().parents[1] / "data" / "hlsmi"


@pytest.fixture
def meter_opens(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[str]]:
    """Every meter.jsonl this (the window's) process opens from now on (the agent is another process)."""
    opened: list[str] = []
    real_open, real_path_open = builtins.open, Path.open

    def spy(file: Any, *args: Any, **kwargs: Any) -> Any:
        if isinstance(file, (str, Path)) and str(file).endswith("meter.jsonl"):
            opened.append(str(file))
        return real_open(file, *args, **kwargs)

    def spy_path(self: Path, *args: Any, **kwargs: Any) -> Any:
        if self.name == "meter.jsonl":
            opened.append(str(self))
        return real_path_open(self, *args, **kwargs)

    monkeypatch.setattr(builtins, "open", spy)
    monkeypatch.setattr(io, "open", spy)
    monkeypatch.setattr(Path, "open", spy_path)
    yield opened


def _recorded_total_power() -> float:
    lines = (DATA / "csv-nounits-hl205.txt").read_text().splitlines()
    column = [p.strip() for p in lines[0].split(",")].index("power.draw [W]")
    return sum(float(line.split(",")[column]) for line in lines[1:])


def _steps(run_folder: Path) -> list[tuple[float, int]]:
    out = []
    for line in (run_folder / "events.jsonl").read_text().splitlines():
        try:
            event = json.loads(line)
        except ValueError:
            continue
        if event.get("type") == "metrics" and isinstance(event.get("step"), int) and not event.get("summary"):
            out.append((float(event["time"]), int(event["step"])))
    return out


def _bridge_file(folder: Path, steps: list[tuple[float, int]]) -> None:
    """rank 0's metrics file: 6 compilations before the first step, then one every 2nd step after
    step 11 (a dump at each change, `metric_change`), no closing ']' (the rank is still running)."""
    dumps, total = [], 0
    for when, step in [(steps[0][0] - 1, 0), *steps]:
        grew = 6 if step == 0 else (1 if step > 11 and step % 2 == 0 else 0)
        if grew:
            total += grew
            dumps.append({"metric_name": "graph_compilation", "triggered_by": "metric_change",
                          "generated_on": dt.datetime.fromtimestamp(when - 0.01).isoformat(),
                          "statistics": {"TotalNumber": total, "TotalTime": 800 * total, "AvgTime": 800}})
    folder.mkdir(exist_ok=True)
    (folder / "metrics-rank0.json").write_text("[" + ",\n".join(json.dumps(d) for d in dumps))


@pytest.mark.usefixtures("fake_hl_smi")
def test_live_power_and_compile_warning_by_clicks(qtbot, tab, tmp_path: Path,  # noqa: F811
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   meter_opens: list[str]) -> None:
    monkeypatch.setenv("GAUDI_GUI_METER_COMPILE_S", "0.3")
    monkeypatch.setenv("GAUDI_GUI_METER_RISE_WARMUP", "10")  # 10 steps of warm-up, not 50: a shorter test
    tab.services.environment._result = {"device": "hpu"}  # as the probe of a Gaudi machine answers
    set_arg(tab, "output_dir", str(tmp_path / "out"))
    set_arg(tab, "max_steps", "100000")
    set_arg(tab, "save_steps", "100000")
    set_arg(tab, "logging_steps", "1")
    strip = tab.meter_strip
    assert not strip.power.isVisible() and not strip.warning.isVisible()
    click(qtbot, tab.btn["Start"])
    job = tab.job
    qtbot.waitUntil(lambda: job.run is not None and bool(job.records), timeout=120000)
    # Watts now: the 8 recorded cards' power summed; Wh so far grows with the samples.
    qtbot.waitUntil(lambda: strip.power.isVisible() and "Wh so far" in strip.power.text(), timeout=60000)
    assert strip.power.text().startswith(f"⚡ {_recorded_total_power():.0f} W now · "), strip.power.text()
    assert "card-hours" in strip.power.text()
    assert strip.reading is not None
    first = strip.reading["energy_j"]
    qtbot.waitUntil(lambda: strip.reading["energy_j"] > first, timeout=30000)
    # The agent read it: no meter.jsonl was opened here (this is the window's process).
    assert meter_opens == []

    # The bridge's file, once the run has logged 75 steps: the meter's watch (in the run's supervisor)
    # finds the rise and writes its warning event; the strip says it while the run goes on.
    folder = job.run.folder
    qtbot.waitUntil(lambda: len(_steps(folder)) >= 35, timeout=120000)
    _bridge_file(folder / hpu_metrics.FOLDER_NAME, _steps(folder))
    qtbot.waitUntil(strip.warning.isVisible, timeout=60000)
    assert job.is_running()
    text = strip.warning.text()
    assert text.startswith("⚠ graph compilations keep rising after warm-up: ") and "after step 11" in text
    assert "pad to fixed lengths or buckets" in text and "dataloader_drop_last" in text
    assert "pad every batch to a fixed length" in strip.warning.toolTip()

    click(qtbot, tab.btn["Stop"])
    with qtbot.waitSignal(job.finished, timeout=180000):
        pass
    assert meter_opens == []  # the whole live run long
    assert not strip.power.isVisible() and not strip.following  # the meter line says what it cost
    assert strip.warning.isVisible()
    summary = json.loads((folder / "meter-summary.json").read_text())
    assert summary["compile_warning"]["kind"] == "compile_rise"
    warnings = [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()
                if '"warning"' in line]
    assert len([w for w in warnings if w["type"] == EventType.WARNING]) == 1
    # The supervisor's last words say it too (a foreground `gaudi-gui train` prints them).
    assert "⚠ graph compilations keep rising after warm-up" in (folder / "supervisor.log").read_text()

    # Reopened from Runs (clicked): the warning again, from the summary; no live power.
    tab.runs.select_row(0)
    click_history(qtbot, tab, "Compare")
    assert not strip.warning.isVisible()
    click_history(qtbot, tab, "Reopen")
    # The finding is made once: the summary's is the one said live.
    assert strip.warning.isVisible() and strip.warning.text() == text
    assert not strip.power.isVisible()


def test_the_strip_says_when_hl_smi_stopped_answering(qtbot, fake_hl_smi: Path, tmp_path: Path,
                                                      meter_opens: list[str]) -> None:
    """Issue 37 item 4, live: the run's real meter with an hl-smi that answers 0.2 s and then fails on
    every restart. The strip stopped at its last "W now" and "Wh so far" as if hl-smi still answered;
    now the power reading's age is said and the energy is what the readings cover, not the run's. The
    readings come from the agent (the strip follows the run by its id, in the runs store named)."""
    import os
    import time

    from gaudi_gui.core import meter
    from gaudi_gui.services.run_meter import RunMeter
    from gaudi_gui.ui.meter_strip import MeterStrip
    folder = tmp_path / "runs" / "run-live"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "status.json").write_text(json.dumps({"state": "running", "started_at": time.time()}))
    env = {**os.environ, "HABANA_VISIBLE_MODULES": "2,3", "FAKE_HLSMI_MODE": "once_then_fail:3",
           "FAKE_HLSMI_STATE": str(tmp_path / "driver-gone"), "GAUDI_GUI_METER_RESTART_S": "0.5"}
    run_meter = meter.Meter(folder, device="hpu", env=env)
    run_meter.start()
    strip = MeterStrip(meter=RunMeter())
    qtbot.addWidget(strip)
    try:
        strip.show()
        strip.follow("run-live", runs_dir=str(tmp_path / "runs"))
        qtbot.waitUntil(lambda: "not the run's" in strip.power.text(), timeout=60_000)
        assert "Wh read over" in strip.power.text() and "Wh so far" not in strip.power.text()
        qtbot.waitUntil(lambda: "no power reading for" in strip.power.text(), timeout=60_000)
        assert " W now" not in strip.power.text()
    finally:
        strip.clear()
        run_meter.stop()
    assert meter_opens == []

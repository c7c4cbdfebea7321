"""Graph compilations that keep rising after warm-up (issue 27): found from the bridge's metrics files
(written here as Intel's bridge writes them: a JSON array per rank, no closing "]" while it runs,
``-rank<N>`` names, ``.1`` for a rank started again) and the run's logged steps, by the run meter
while the run trains: one "warning" event in events.jsonl, and ``compile_warning`` in the summary
that ``runs show`` prints."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from gaudi_gui.core import compile_rise, meter, meter_account, meter_files
from gaudi_gui.core.events import EventType, EventWriter


def _dump(when: float, total: int) -> str:
    return json.dumps({"metric_name": "graph_compilation", "triggered_by": "metric_change",
                       "generated_on": dt.datetime.fromtimestamp(when).isoformat(),
                       "statistics": {"TotalNumber": total, "TotalTime": total * 900, "AvgTime": 900}})


def test_a_rise_after_warm_up_is_found_with_its_numbers() -> None:
    steps = [(1000.0 + s, s) for s in range(1, 121)]
    # 10 compilations in warm-up, then one every 4 steps: 25 per 100 steps.
    timeline = [(1000.0 + s + 0.5, 10 + max(0, (s - 51) // 4)) for s in range(1, 121)]
    found = compile_rise.compile_rise(timeline, steps)
    assert found is not None and found["kind"] == "compile_rise"
    assert found["from_step"] == 51 and found["to_step"] == 120 and found["steady_steps"] == 69
    assert found["warmup_compilations"] == 10 and found["steady_compilations"] == 17
    assert found["per_100_steps"] == round(100 * 17 / 69, 2)
    text = compile_rise.rise_text(found)
    assert text.startswith("⚠ graph compilations keep rising after warm-up: 17 in the 69 steps after step 51")
    assert "pad" in text and "dataloader_drop_last" in text


def test_warm_up_compilations_and_a_few_later_ones_are_not_a_rise() -> None:
    steps = [(1000.0 + s, s) for s in range(1, 201)]
    flat = [(1000.0 + s + 0.5, 40 if s < 30 else 42) for s in range(1, 201)]  # 2 after warm-up: fine
    assert compile_rise.compile_rise(flat, steps) is None
    rising = [(1000.0 + s + 0.5, s) for s in range(1, 201)]  # one a step, but too early to judge:
    assert compile_rise.compile_rise(rising, steps[:60]) is None  # 9 steps after warm-up
    assert compile_rise.compile_rise(rising, steps) is not None
    assert compile_rise.compile_rise([], steps) is None


def test_timeline_of_the_worst_rank_goes_on_across_a_restart(tmp_path: Path) -> None:
    base = tmp_path / "metrics.json"
    (tmp_path / "metrics-rank0.json").write_text("[" + ",".join(_dump(100.0 + i, i) for i in (1, 2, 3)) + "]")
    (tmp_path / "metrics-rank0.json.1").write_text("[" + _dump(200.0, 2) + ",")  # restarted, cut
    (tmp_path / "metrics-rank1.json").write_text("[" + _dump(100.0, 1))
    assert compile_rise.compile_timeline(base) == [(101.0, 1), (102.0, 2), (103.0, 3), (200.0, 5)]


def _meter(folder: Path, base: Path) -> meter.Meter:
    env = {"PATH": "", "PT_HPU_METRICS_FILE": str(base), "GAUDI_GUI_METER_COMPILE_S": "0.1"}
    return meter.Meter(folder, device="hpu", env=env)


def _events(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "events.jsonl").read_text().splitlines()]


def test_the_meter_warns_while_the_run_trains_and_runs_show_says_it(tmp_path: Path) -> None:
    """The real path: a Meter started as the supervisor starts it (hl-smi absent: energy not
    measured, the compile watch still runs); a rank0 bridge file that keeps growing, one compilation
    every 2 steps after step 40 (a metric_change dump each), and rank 0's metrics events: the
    warning event comes while the 'run' goes on, once; the summary and `runs show` carry it."""
    runs = tmp_path / "runs"
    folder = runs / "run-rise"
    (folder / "hpu-metrics").mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "status.json").write_text(json.dumps({"state": "running"}))
    base = folder / "hpu-metrics" / "metrics.json"
    rank_file = folder / "hpu-metrics" / "metrics-rank0.json"
    rank_file.write_text("[")
    m = _meter(folder, base)
    m.start()
    t0 = time.time() - 1000
    compiled = 0
    with EventWriter(folder / "events.jsonl") as events, open(rank_file, "a") as bridge:
        for step in range(1, 121):
            grew = step <= 5 or (step > 40 and step % 2 == 0)
            if grew:
                compiled += 1
                bridge.write(("," if compiled > 1 else "") + _dump(t0 + step - 0.5, compiled))
                bridge.flush()
            events.write("metrics", step=step, max_steps=200, loss=2.0, time=t0 + step)
        # The 'run' goes on (no more steps yet): the meter's watch finds it by itself.
        while not [e for e in _events(folder) if e["type"] == EventType.WARNING]:
            time.sleep(0.05)
    summary = m.stop()
    warnings = [e for e in _events(folder) if e["type"] == EventType.WARNING]
    assert len(warnings) == 1 and warnings[0]["kind"] == "compile_rise"
    assert warnings[0]["warmup_compilations"] == 10  # 5 at the start and 5 of steps 42-50
    assert summary["compile_warning"]["steady_compilations"] == 35  # steps 52..120, even ones
    assert summary["energy_source"] == meter_account.NOT_MEASURED  # no hl-smi: the watch ran anyway
    assert meter_files.read_summary(folder)["compile_warning"] == summary["compile_warning"]  # type: ignore[index]
    shown = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(runs), "show",
                            "run-rise"], capture_output=True, text=True, timeout=60, env={**os.environ})
    assert shown.returncode == 0, shown.stderr
    assert "⚠ graph compilations keep rising after warm-up: 35 in the 69 steps after step 51" in shown.stdout
    assert "pad every batch to a fixed length" in shown.stdout


def test_no_warning_for_a_run_that_stops_compiling(tmp_path: Path) -> None:
    folder = tmp_path / "run-flat"
    (folder / "hpu-metrics").mkdir(parents=True)
    base = folder / "hpu-metrics" / "metrics.json"
    (folder / "hpu-metrics" / "metrics-rank0.json").write_text(
        "[" + ",".join(_dump(1000.0 + s, s) for s in range(1, 11)))
    with EventWriter(folder / "events.jsonl") as events:
        for step in range(1, 121):
            events.write("metrics", step=step, max_steps=120, time=1000.0 + step)
    m = _meter(folder, base)
    m.start()
    summary = m.stop()
    assert "compile_warning" not in summary
    assert not [e for e in _events(folder) if e["type"] == EventType.WARNING]

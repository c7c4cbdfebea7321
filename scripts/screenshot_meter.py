"""``python scripts/screenshot_meter.py [OUTDIR] [WxH ...]``: the run meter where people look (issue 27):
the Training tab with a reopened Gaudi run's meter line under its status, and the Runs list with its
card-hours and energy columns, at 1280x800 and 1024x700 (default).

The runs are made here as the supervisor leaves them (events, meter-summary.json from
core.meter_account.summarize, a compile-meter file in the bridge's format): a 2-card Gaudi LoRA run of 25
minutes, a 1-card one of 8 minutes, and a CPU run whose energy was not measured. Files:
OUTDIR/meter-training-WxH.png, OUTDIR/meter-runs-WxH.png, OUTDIR/meter-runs-list-WxH.png (the Runs page
whole, with its buttons) (default OUTDIR: docs/screens/).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from screenshots import _choose_platform
from shot import parse_size

from gaudi_gui.core.runstore import Run, RunStore

SIZES = ((1280, 800), (1024, 700))
TRAINING = 2


def _run(store: RunStore, home: Path, name: str, *, cards: list[int], minutes: float, watts: float,
         steps: int, compiled: tuple[int, int] | None) -> Run:
    from gaudi_gui.core import hpu_metrics, meter_account, meter_files
    from gaudi_gui.core.events import EventWriter
    from gaudi_gui.core.jobconfig import JobConfig

    run = store.create(JobConfig(name=name, method="lora", training_args={"output_dir": str(home / name)}))
    wall = minutes * 60
    t0 = time.time() - wall - 600
    with EventWriter(run.events_path) as events:
        events.write("training_started", step=0, max_steps=steps, world_size=max(1, len(cards)), time=t0)
        for step in range(1, steps + 1):
            elapsed = 40 + (wall - 60) * step / steps
            extra = {"memory_peak_mib": 10035.0, "memory_limit_mib": 98304.0} if cards else {}
            events.write("metrics", step=step, max_steps=steps, loss=2.2 * 0.97 ** step + 0.6,
                         elapsed=elapsed, throughput=step / elapsed, samples_per_second=8 * step / elapsed,
                         tokens_per_second=4096 * step / elapsed, time=t0 + elapsed, **extra)
    run.update_status(state="finished", step=steps, max_steps=steps, started_at=t0 - 20, ended_at=t0 + wall,
                      final_loss=2.2 * 0.97 ** steps + 0.6, summary=f"Finished {steps} steps")
    accounts = meter_account.Accounts()
    if cards:
        for k in range(int(wall) + 1):
            accounts.add(t0 + k, [{"name": f"module {c}", "power_w": watts + (k % 7), "utilization": 87,
                                   "memory_used_mib": 94100.0, "memory_total_mib": 98304.0} for c in cards])
        summary = meter_account.summarize(accounts, source="hl-smi",
                                          energy_source=meter_account.SOURCE_HLSMI, wall_s=wall,
                                  card_count=len(cards), cards=cards, kind="hpu")
    else:
        summary = meter_account.summarize(accounts, source="none", energy_source=meter_account.NOT_MEASURED,
                                          wall_s=wall,
                                  card_count=None, kind="cpu",
                                  note="no readable RAPL counter under /sys/class/powercap")
    (run.folder / meter_files.SUMMARY_NAME).write_text(json.dumps(summary))
    if compiled is not None:
        folder = run.folder / hpu_metrics.FOLDER_NAME
        folder.mkdir()
        warm, late = compiled
        dumps = [{"metric_name": "graph_compilation", "triggered_by": "metric_change",
                  "generated_on": dt.datetime.fromtimestamp(t0 + 30).isoformat(),
                  "statistics": {"TotalNumber": warm, "TotalTime": 9000 * warm, "AvgTime": 9000}},
                 {"metric_name": "cpu_fallback", "triggered_by": "metric_change",
                  "generated_on": dt.datetime.fromtimestamp(t0 + 30).isoformat(),
                  "statistics": {"TotalNumber": 2, "FallbackOps": {"aten::_unique2": 2}}},
                 {"metric_name": "graph_compilation", "triggered_by": "metric_change",
                  "generated_on": dt.datetime.fromtimestamp(t0 + wall / 2).isoformat(),
                  "statistics": {"TotalNumber": warm + late, "TotalTime": 9000 * (warm + late),
                                 "AvgTime": 9000}}]
        (folder / "metrics-rank0.json").write_text(json.dumps(dumps))
    return run


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else "docs/screens")
    sizes = [parse_size(a, "screenshot_meter") for a in argv[2:]] or list(SIZES)
    out.mkdir(parents=True, exist_ok=True)
    _choose_platform()
    home = Path(tempfile.mkdtemp(prefix="gaudi-gui-meter-"))
    os.environ["GAUDI_GUI_HOME"] = str(home)
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest
    from shot import open_window

    app, services, window = open_window(TRAINING, *sizes[0])
    store = services.training.store if services.training is not None else RunStore()
    _run(store, home, "cpu-smoke", cards=[], minutes=3, watts=0, steps=20, compiled=None)
    _run(store, home, "lora-1card", cards=[4], minutes=8, watts=190, steps=60, compiled=(9, 0))
    gaudi = _run(store, home, "lora-2cards", cards=[2, 3], minutes=25, watts=205, steps=200, compiled=(14, 3))
    tab = window.training_tab
    tab.runs.refresh()
    for width, height in sizes:
        window.resize(width, height)
        tab.reopen(gaudi)  # what the Runs page's Reopen does for the selected run
        for _ in range(30):
            app.processEvents()
        window.grab().save(str(out / f"meter-training-{width}x{height}.png"))
        print(f"training {width}x{height}: {tab.meter_line.text()}")
        bar = tab.views.tabBar()
        runs_title = bar.tabRect(tab.views.indexOf(tab.runs)).center()
        QTest.mouseClick(bar, Qt.MouseButton.LeftButton, pos=runs_title)
        for _ in range(30):
            app.processEvents()
        window.grab().save(str(out / f"meter-runs-{width}x{height}.png"))
        # The list's whole page with its buttons (Export…, Open in TensorBoard / trackio…), which the
        # window shows below the fold at these sizes.
        tab.runs.grab().save(str(out / f"meter-runs-list-{width}x{height}.png"))
        print(f"runs {width}x{height}")
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

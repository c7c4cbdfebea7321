"""``python scripts/screenshot_compare.py [OUTDIR] [WxH ...]``: Compare on two runs (issue 37, item 18):
the Training tab's curves after Runs → select two runs → Compare: loss, learning rate and card
utilization of both, a legend naming each, at 1280x800 and 1024x700 (default). Files:
OUTDIR/compare-WxH.png (default OUTDIR: docs/screens/).

The runs are written here as a training run leaves them: metrics events (loss, learning rate, wall
time) and the meter's samples (meter.jsonl: each card's utilization), under names that differ only in
their start time, as two runs of the same job do.
"""

from __future__ import annotations

import json
import math
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


def make_run(store: RunStore, name: str, *, steps: int, lr: float, utilization: float, seconds: float) -> Run:
    """A finished run named ``name``: its loss and learning-rate curve and its card's utilization."""
    from gaudi_gui.core import meter_files
    from gaudi_gui.core.events import EventWriter
    from gaudi_gui.core.jobconfig import JobConfig

    made = store.create(JobConfig(training_args={"output_dir": str(store.root / "out" / name)}))
    run = Run(made.folder.with_name(name))
    made.folder.rename(run.folder)
    t0 = time.time() - seconds - 60
    with EventWriter(run.events_path) as events:
        events.write("training_started", step=0, max_steps=steps, world_size=1, time=t0)
        for step in range(1, steps + 1):
            elapsed = seconds * step / steps
            rate = lr * min(1.0, step / 5) * (1 - step / (steps + 1))
            events.write("metrics", step=step, max_steps=steps, loss=2.0 * math.exp(-step * lr * 60) + 0.4,
                         learning_rate=rate, elapsed=elapsed, time=t0 + elapsed)
    with open(run.folder / meter_files.METER_NAME, "w", encoding="utf-8") as fh:
        for k in range(int(seconds) + 1):
            busy = utilization + 8 * math.sin(k / 3)
            fh.write(json.dumps({"t": round(t0 + k, 3), "source": "hl-smi",
                                 "cards": [{"name": "module 0", "utilization": busy}]}) + "\n")
    run.update_status(state="finished", step=steps, max_steps=steps, started_at=t0, ended_at=t0 + seconds,
                      final_loss=0.5, summary=f"Finished {steps} steps")
    return run


def main(argv: list[str]) -> int:
    out = Path(argv[1] if len(argv) > 1 else "docs/screens")
    sizes = [parse_size(a, "screenshot_compare") for a in argv[2:]] or list(SIZES)
    out.mkdir(parents=True, exist_ok=True)
    _choose_platform()
    home = Path(tempfile.mkdtemp(prefix="gaudi-gui-compare-"))
    os.environ["GAUDI_GUI_HOME"] = str(home)
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest
    from shot import open_window

    app, services, window = open_window(TRAINING, *sizes[0])
    store = services.training.store if services.training is not None else RunStore()
    make_run(store, "20261206-031502-builtin-demo", steps=60, lr=1e-3, utilization=55, seconds=40)
    make_run(store, "20261206-034417-builtin-demo", steps=60, lr=3e-3, utilization=80, seconds=30)
    tab = window.training_tab
    tab.runs.refresh()
    table = tab.runs.table
    for width, height in sizes:
        window.resize(width, height)
        bar = tab.views.tabBar()
        runs_title = bar.tabRect(tab.views.indexOf(tab.runs)).center()
        QTest.mouseClick(bar, Qt.MouseButton.LeftButton, pos=runs_title)
        for _ in range(20):
            app.processEvents()
        table.selectAll()
        QTest.mouseClick(tab.runs.buttons["Compare"], Qt.MouseButton.LeftButton)
        for _ in range(40):
            app.processEvents()
        window.grab().save(str(out / f"compare-{width}x{height}.png"))
        print(f"compare {width}x{height}")
    window.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))

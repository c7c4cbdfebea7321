"""Start-up: time from launching ``gaudi-gui`` to its first painted window, and the GUI process's RSS,
each against a bare PySide6 window started the same way in the same run."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

BARE = r"""
import json, sys, time
t0 = time.perf_counter()
import psutil
from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QApplication, QLabel, QMainWindow
app = QApplication(sys.argv)
win = QMainWindow()
win.setCentralWidget(QLabel("bare"))
win.resize(1280, 860)
class F(QObject):
    def eventFilter(self, obj, ev):
        if obj is win and ev.type() == QEvent.Type.Paint:
            win.removeEventFilter(self)
            QTimer.singleShot(0, report)
        return False
def report():
    print(json.dumps({"rss_bytes": psutil.Process().memory_info().rss,
                      "event": "ready", "torch_loaded": "torch" in sys.modules}), flush=True)
    win.close()
f = F(); win.installEventFilter(f)
win.show()
app.exec()
"""


def _measure(argv: list[str], env: dict[str, str]) -> tuple[float, dict, float, dict]:
    """(seconds to first paint, its report, seconds to ready, its report) seen from the parent."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
    assert proc.stdout is not None
    first: dict = {}
    ready: dict = {}
    t_first = t_ready = float("nan")
    for line in proc.stdout:
        line = line.strip()
        if not line.startswith("{"):
            continue
        report = json.loads(line)
        if not first:
            t_first, first = time.perf_counter() - start, report
        if report.get("event", "ready") == "ready":
            t_ready, ready = time.perf_counter() - start, report
            break
    proc.stdout.close()
    proc.wait(timeout=60)
    return t_first, first, t_ready, ready


def run(quick: bool = False) -> list[dict]:
    repeats = 3 if quick else 7
    with tempfile.TemporaryDirectory() as home:
        env = dict(os.environ, QT_QPA_PLATFORM="offscreen", GAUDI_GUI_HOME=home,
                   GAUDI_GUI_BENCH_STARTUP="1")
        app_times, bare_times, ready_times, app_rss, bare_rss = [], [], [], [], []
        torch_loaded = False
        for _ in range(repeats):
            # Interleave so drift (page cache, other load) hits both sides alike.
            t, _first, t_ready, rep = _measure([sys.executable, "-m", "gaudi_gui"], env)
            app_times.append(t)
            ready_times.append(t_ready)
            app_rss.append(rep.get("rss_bytes", 0))
            torch_loaded |= bool(rep.get("torch_loaded") or rep.get("transformers_loaded"))
            t, _first, _t, rep = _measure([sys.executable, "-c", BARE], env)
            bare_times.append(t)
            bare_rss.append(rep.get("rss_bytes", 0))
    app_t, bare_t = statistics.median(app_times), statistics.median(bare_times)
    ready_t = statistics.median(ready_times)
    app_m, bare_m = statistics.median(app_rss) / 2**20, statistics.median(bare_rss) / 2**20
    if torch_loaded:
        raise AssertionError("the GUI process imported torch or transformers")
    return [
        {"name": "startup: launch to first painted window", "value": app_t * 1000, "unit": "ms",
         "baseline": bare_t * 1000, "ratio": app_t / bare_t, "goal": "ratio <= 1.5"},
        {"name": "startup: launch to every tab built", "value": ready_t * 1000, "unit": "ms",
         "baseline": bare_t * 1000, "ratio": ready_t / bare_t, "goal": "(report)"},
        {"name": "startup: GUI process RSS, all tabs built", "value": app_m, "unit": "MiB",
         "baseline": bare_m, "ratio": app_m / bare_m, "goal": "(report)"},
        {"name": "startup: torch in the GUI process", "value": 0.0, "unit": "modules",
         "baseline": None, "ratio": None, "goal": "0 (asserted)"},
    ]

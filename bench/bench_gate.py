"""Start gate benchmark: what the card check adds to Start in the Training tab on this machine, with
the fake hl-smi's sick 8-card server (free cards 4,7 chosen, so the check passes and the run starts).

Both sides click the real Start button of a TrainingTab and time the click to the run having started
(the supervisor's ``current_changed``): the app side with hl-smi on PATH (one ``doctor --json`` child,
then the start), the baseline without it (no child: the start at once, as on a plain CPU machine).
Interleaved (bench/harness.py); each run is killed as soon as it has started. The added time is the
difference of the medians (goal < 1 s)."""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.harness import interleaved, row

ROOT = Path(__file__).resolve().parents[1]
FAKE_HLSMI = ROOT / "tests" / "fake_hl_smi.py"


def _sick_server(tmp: Path) -> dict[str, str]:
    """The env of the tests' sick server (tests/helpers.sick_server_env: fixture sysfs / proc / dev)."""
    from tests.helpers import sick_server_env
    return {**sick_server_env(tmp), "FAKE_HLSMI_DRIVER": "1.23.0", "GAUDI_GUI_HOME": str(tmp)}


def run(quick: bool = False) -> list[dict[str, Any]]:
    os.environ.setdefault("QT_QPA_PLATFORM", "offscreen")
    from PySide6.QtCore import Qt
    from PySide6.QtTest import QTest
    from PySide6.QtWidgets import QApplication

    from bench.bench_training import _ensure_model, _wait

    app = QApplication.instance() or QApplication([])
    tmp = Path(tempfile.mkdtemp(prefix="gaudi-gui-bench-gate-"))
    fake_bin = tmp / "bin"
    fake_bin.mkdir()
    program = fake_bin / "hl-smi"
    program.write_text(f"#!/bin/sh\nexec {sys.executable} {FAKE_HLSMI} \"$@\"\n")
    program.chmod(0o755)
    saved = dict(os.environ)
    os.environ.update(_sick_server(tmp))
    os.environ.pop("GAUDI_GUI_HL_SMI", None)
    plain_path = os.environ["PATH"]
    try:
        _ensure_model(tmp)
        from gaudi_gui.app import create_services
        from gaudi_gui.core.jobconfig import JobConfig
        from gaudi_gui.core.runstore import RunStore
        from gaudi_gui.ui.training_tab import TrainingTab

        services = create_services()
        assert services.training is not None
        training = services.training
        training.store = RunStore(tmp / "runs")
        services.selection.set_kind("hpu", list(range(8)))
        services.selection.set_selected([4, 7])
        tab = TrainingTab(services)
        tab.resize(1400, 900)
        tab.show()
        tab.form.set_job(JobConfig(training_args={"output_dir": str(tmp / "out"), "max_steps": 100000,
                                                  "save_strategy": "no"}))
        started: list[float] = []
        training.current_changed.connect(lambda _job: started.append(time.perf_counter()))

        def start_once(with_hl_smi: bool) -> float:
            os.environ["PATH"] = f"{fake_bin}{os.pathsep}{plain_path}" if with_hl_smi else plain_path
            started.clear()
            _wait(app, tab.btn["Start"].isEnabled, 60)
            t0 = time.perf_counter()
            QTest.mouseClick(tab.btn["Start"], Qt.MouseButton.LeftButton)
            _wait(app, lambda: bool(started), 120)
            if not started:
                last = " | ".join(tab.log.plain_text().splitlines()[-4:])[-300:]
                raise RuntimeError(f"the run did not start: {tab.status.text()} {tab.gate_label.text()} "
                                   f"(job {tab.job.state}, running {len(training.running())}; {last})")
            took = started[0] - t0
            for job in training.running():
                job.kill()
            _wait(app, lambda: not training.running(), 60)
            return took

        result = interleaved(lambda: start_once(True), lambda: start_once(False),
                             repeats=3 if quick else 7, warmup=1)
        tab.shutdown()
        training.shutdown()
    finally:
        os.environ.clear()
        os.environ.update(saved)
    added = result["app_median"] - result["base_median"]
    return [row(f"gate: Start with the card check, 8 fake cards (baseline: no hl-smi, no check); "
                f"added {added * 1000:.0f} ms", result, unit="ms", scale=1000, goal="added < 1 s")]


if __name__ == "__main__":
    for r in run(quick="--quick" in sys.argv):
        print(r)

"""'Leave running and quit': a training launch outlives the app process, and a new one re-attaches.

The first app is a real child Python that starts a run through TrainingJob (its supervisor, `train
--detach`, runs in a session of its own), detaches it and exits the way gaudi_gui.app does (the run
is the agent's: the window holds no process). The test process then plays the next start: it
re-attaches to the run folder, sees it still progress, and stops it with nothing left."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil
import pytest

from gaudi_gui.core.placement import Placement
from gaudi_gui.core.runstore import Run, RunStore
from gaudi_gui.services.training_job import TrainingJob

pytestmark = pytest.mark.usefixtures("demo_model")

FIRST_APP = textwrap.dedent("""
    import json, os, sys
    from PySide6.QtCore import QCoreApplication, QTimer
    from gaudi_gui.core.jobconfig import JobConfig
    from gaudi_gui.core.placement import Placement
    from gaudi_gui.core.runstore import RunStore
    from gaudi_gui.services.training_job import TrainingJob

    app = QCoreApplication([])
    job = JobConfig()
    job.dataset.max_length = 32
    job.training_args = {"output_dir": sys.argv[2], "max_steps": 100000, "logging_steps": 1,
                         "per_device_train_batch_size": 2, "save_strategy": "no"}
    tj = TrainingJob(Placement.local(), RunStore(sys.argv[1]))
    def on_metrics(record):
        if record.get("step", 0) >= 2 and not tj.is_detached_for_test:
            tj.is_detached_for_test = True
            tj.detach()
            print(json.dumps({"run": str(tj.run.folder), "pid": tj.pid}), flush=True)
            app.quit()
    tj.is_detached_for_test = False
    tj.metrics_received.connect(on_metrics)
    tj.start(job, device="cpu")
    QTimer.singleShot(120000, app.quit)
    app.exec()
    os._exit(0)
""")


def test_run_outlives_the_app_and_is_reattached(qtbot, tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", FIRST_APP, str(tmp_path / "runs"), str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=180)
    assert proc.returncode == 0, proc.stderr[-3000:]
    info = json.loads(proc.stdout.strip().splitlines()[-1])
    pid = info["pid"]
    try:
        assert psutil.pid_exists(pid), "the launch died with the app"
        run = Run(info["run"])
        job = TrainingJob(Placement.local(), RunStore(run.folder.parent))
        assert job.attach(run)
        steps: list[int] = []
        job.metrics_received.connect(lambda r: steps.append(r.get("step", 0)))
        qtbot.waitUntil(lambda: len(steps) >= 2, timeout=60000)  # still training, seen from the file
        with qtbot.waitSignal(job.finished, timeout=60000):
            job.stop(grace_s=5)
        qtbot.waitUntil(lambda: not psutil.pid_exists(pid) or
                        psutil.Process(pid).status() == psutil.STATUS_ZOMBIE, timeout=20000)
    finally:
        if psutil.pid_exists(pid):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, 9)

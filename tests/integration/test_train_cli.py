from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gaudi_gui.core.jobconfig import JobConfig


@pytest.mark.usefixtures("demo_model")
def test_cli_train_runs_and_writes_run_folder(tmp_path: Path) -> None:
    job = JobConfig(training_args={"output_dir": str(tmp_path / "out"), "max_steps": 3,
                                   "per_device_train_batch_size": 2, "logging_steps": 1})
    job.save(tmp_path / "job.json")
    res = subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config", str(tmp_path / "job.json"),
                          "--runs-dir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    assert "Finished 3 steps; final loss" in res.stderr
    (run,) = list((tmp_path / "runs").iterdir())
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "finished" and status["exit_code"] == 0 and status["origin"] == "cli"
    assert status["step"] == 3 and status["max_steps"] == 3  # the CLI records its steps
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    assert sum(e["type"] == "metrics" for e in events) >= 3


def test_cli_bad_config(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"model": 3}')
    res = subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config", str(bad)],
                         capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "'model' must be a string" in res.stderr
    assert "Traceback" not in res.stderr

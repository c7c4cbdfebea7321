from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import RunStore
from tests.helpers import children_get_sigint, job_file


@pytest.mark.usefixtures("demo_model")
@pytest.mark.parametrize("mode", ["agent", "no-agent"])
def test_cli_train_runs_and_writes_run_folder(tmp_path: Path, mode: str) -> None:
    """The foreground ``train``: through this machine's agent (the default; here started from a
    background job, SIGINT and SIGHUP ignored, as ``nohup`` does), or in this process (``--no-agent``):
    the same lines, the same outcome, the same run folder; the agent's run is in ``runs list``."""
    job = JobConfig(training_args={"output_dir": str(tmp_path / "out"), "max_steps": 3,
                                   "per_device_train_batch_size": 2, "logging_steps": 1})
    job.save(tmp_path / "job.json")
    argv = [sys.executable, "-m", "gaudi_gui", "train", "--config", str(tmp_path / "job.json"), "--runs-dir",
            str(tmp_path / "runs"), *(["--no-agent"] if mode == "no-agent" else [])]
    with children_get_sigint("ignored" if mode == "agent" else "default"):
        res = subprocess.run(argv, capture_output=True, text=True, timeout=180)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stderr.count("Finished 3 steps; final loss") == 1, res.stderr  # said once, at the end
    assert "meter: " in res.stderr and "Traceback" not in res.stderr  # the supervisor's notes, as in-process
    (run_,) = RunStore(tmp_path / "runs").runs()
    run = run_.folder
    assert res.stdout.startswith(f"run folder: {run} ("), res.stdout[:500]
    assert ("through the agent" in res.stdout.splitlines()[0]) == (mode == "agent")
    assert "'loss'" in res.stdout  # the Trainer's own lines, as they came
    if mode == "agent":
        listed = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir",
                                 str(tmp_path / "runs"), "list"], capture_output=True, text=True, timeout=60)
        assert run.name in listed.stdout and "finished" in listed.stdout, listed.stdout
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


@pytest.mark.usefixtures("demo_model")
def test_detached_run_shows_its_steps_while_it_trains(tmp_path: Path) -> None:
    """The app's local runs: `train --config - --detach --json --origin gui` (the job on stdin), followed
    with `runs follow`: the status shows the step before the end, and Kill now ends it with the
    launcher's exit code recorded."""
    runs = str(tmp_path / "runs")
    config = job_file(tmp_path, tmp_path / "out").read_text()
    started = subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config", "-", "--detach",
                              "--json", "--device", "cpu", "--grace", "30", "--origin", "gui",
                              "--runs-dir", runs], input=config, capture_output=True, text=True, timeout=180)
    assert started.returncode == 0, started.stderr[-2000:]
    info = json.loads(started.stdout)
    folder = Path(info["folder"])
    follow = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", runs, "follow",
                               str(folder)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert follow.stdout is not None
    kill = [sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", runs, "stop", str(folder), "--now"]
    item: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 240
        progress = None
        while progress is None and time.monotonic() < deadline:
            item = json.loads(follow.stdout.readline())  # a heartbeat comes every second at least
            assert item["t"] != "end", item
            status = item.get("status") or {}
            if item["t"] == "status" and status["state"] == "running" and status["step"] > 0:
                progress = status
        assert progress is not None, "no step in the status within 240 s"
        assert progress["max_steps"] == 100000 and progress["origin"] == "gui"
        on_disk = json.loads((folder / "status.json").read_text())
        assert on_disk["state"] == "running" and on_disk["step"] >= progress["step"]
        stop = subprocess.run(kill, capture_output=True, text=True, timeout=60)
        assert stop.returncode == 0 and "kill requested" in stop.stdout, stop
        while True:
            item = json.loads(follow.stdout.readline())
            if item["t"] == "end":
                break
            assert time.monotonic() < deadline + 60, "the killed run did not end"
    finally:
        if item.get("t") != "end":  # the test failed midway: end the run it started
            subprocess.run(kill, capture_output=True, timeout=60)
        assert follow.stdin is not None
        follow.stdin.close()  # ends the follower
        follow.wait(timeout=30)
    status = item["status"]
    assert status["state"] == "killed" and "killed on request" in status["summary"], status
    assert status["step"] >= progress["step"] and status["origin"] == "gui"
    assert isinstance(status["exit_code"], int) and status["exit_code"] != 0, status
    assert status["exit_description"].startswith("launcher "), status
    supervisor_log = (folder / "supervisor.log").read_text()
    assert "kill requested" in supervisor_log and "Traceback" not in supervisor_log

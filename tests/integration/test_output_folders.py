"""Runs never write over each other's output, and Resume continues the run's own checkpoint
(issue 25, items 1 and 2), through the real `gaudi-gui train` and real training children."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gaudi_gui.core import outputs
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import RunStore


def _train(tmp_path: Path, job: JobConfig, *extra: str) -> subprocess.CompletedProcess[str]:
    path = tmp_path / f"job-{len(list(tmp_path.glob('job-*.json')))}.json"
    job.save(path)
    return subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config", str(path),
                           "--runs-dir", str(tmp_path / "runs"), "--device", "cpu", *extra],
                          capture_output=True, text=True, timeout=240)


def _job(out: Path | None, steps: int, **extra: object) -> JobConfig:
    args: dict[str, object] = {"max_steps": steps, "per_device_train_batch_size": 2, "logging_steps": 1,
                               "save_steps": 2, **extra}
    if out is not None:
        args["output_dir"] = str(out)
    return JobConfig(training_args=args)


@pytest.mark.slow
@pytest.mark.usefixtures("demo_model")
def test_a_second_run_into_a_used_folder_is_refused_then_resume_takes_its_own_checkpoint(
        tmp_path: Path) -> None:
    out = tmp_path / "out"
    first = _train(tmp_path, _job(out, 4))
    assert first.returncode == 0, first.stderr[-2000:]
    store = RunStore(tmp_path / "runs")
    (run_a,) = store.runs()
    assert outputs.owner_of(out) == str(run_a.folder)
    before = {p.name: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}

    # A new run into the same folder: refused, exit 2, naming the folder and the run; nothing written.
    second = _train(tmp_path, _job(out, 8, save_steps=3))
    assert second.returncode == 2, second.stderr[-2000:]
    assert str(out) in second.stderr and run_a.name in second.stderr and "--overwrite-output" in second.stderr
    assert "Traceback" not in second.stderr
    assert len(store.runs()) == 1
    assert {p.name: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()} == before

    # Asked for: the later run writes there (checkpoint-6 is its own, beyond run A's 4 steps).
    third = _train(tmp_path, _job(out, 6, save_steps=3), "--overwrite-output")
    assert third.returncode == 0, third.stderr[-2000:]
    run_c = store.runs()[0]
    assert run_c != run_a and outputs.owner_of(out) == str(run_c.folder)
    assert (out / "checkpoint-6").is_dir()

    # Resuming run A (as the Runs list does: its job, "latest", --resumed-from A) continues from A's
    # own checkpoint-4, not run C's newer checkpoint-6, and says so.
    job = run_a.user_job()
    job.resume_from_checkpoint = "latest"
    job.training_args["max_steps"] = 5
    # Run C owns the folder now: resuming A there would write over C's files, so that is asked too.
    refused = _train(tmp_path, job, "--resumed-from", str(run_a.folder))
    assert refused.returncode == 2 and run_c.name in refused.stderr, refused.stderr[-2000:]
    resumed = _train(tmp_path, job, "--resumed-from", str(run_a.folder), "--overwrite-output")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    run_d = store.runs()[0]
    assert json.loads(run_d.config_path.read_text())["resume_from_checkpoint"] == str(out / "checkpoint-4")
    assert run_d.status().resumed_from == str(run_a.folder)
    steps = [e["step"] for e in run_d.events() if e.get("type") == "metrics" and "loss" in e]
    assert steps and min(steps) == 5 and max(steps) == 5  # one step after A's 4, not C's 6


@pytest.mark.slow
@pytest.mark.usefixtures("demo_model")
def test_runs_without_an_output_dir_each_get_their_own(tmp_path: Path) -> None:
    for _ in range(2):
        done = _train(tmp_path, _job(None, 2))
        assert done.returncode == 0, done.stderr[-2000:]
    runs = RunStore(tmp_path / "runs").runs()
    folders = {r.output_dir() for r in runs}
    assert len(folders) == 2
    for run in runs:
        out = run.output_dir()
        assert out is not None and out.name == run.name and (out / "final").is_dir()
        assert run.user_job().output_dir == ""  # Clone gets a new folder again

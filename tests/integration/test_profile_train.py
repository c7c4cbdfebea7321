"""``gaudi-gui train --profile-steps N`` (issue 40): real torch.profiler on real training of the demo
model, through the CLI; and its bad inputs, one line and exit 2 each."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from gaudi_gui.core import profile
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.profile_rules import sentences
from gaudi_gui.core.runstore import RunStore


def _job(tmp_path: Path, max_steps: int = 6) -> Path:
    job = JobConfig(training_args={"output_dir": str(tmp_path / "out"), "max_steps": max_steps,
                                   "per_device_train_batch_size": 2, "logging_steps": 1, "save_steps": 100})
    job.dataset.max_length = 32
    path = tmp_path / "job.json"
    job.save(path)
    return path


def _train(tmp_path: Path, *extra: str, timeout: int = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config", str(tmp_path / "job.json"),
                           "--runs-dir", str(tmp_path / "runs"), "--device", "cpu", *extra],
                          capture_output=True, text=True, timeout=timeout)


def test_train_profile_steps_3_writes_a_trace_and_a_summary(tmp_path: Path, demo_model: Path) -> None:
    _job(tmp_path)
    done = _train(tmp_path, "--profile-steps", "3")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = [r.folder for r in RunStore(tmp_path / "runs").runs()]
    (trace,) = profile.trace_files(run)
    steps = profile.profiler_steps(trace)
    assert len(steps) == 3, steps
    summary = profile.read(run)
    assert summary is not None and summary["trace"] == str(trace)
    assert summary["steps"] == 3 and len(summary["step_times_s"]) == 3
    assert summary["activities"] == ["cpu"] and summary["device_ms"] is None
    assert summary["first_step"] == profile.PROFILE_SKIP_STEPS + 1
    top = summary["top_operators"]
    assert top and all(r["name"] and r["calls"] > 0 for r in top)
    assert top[0]["self_host_ms"] >= top[-1]["self_host_ms"] > 0
    assert summary["host_ms"] > 0 and summary["step_total_ms"] > 0
    assert "compilations" not in summary  # no Gaudi bridge here: the meter knows none
    assert all(isinstance(s, str) for s in sentences(summary))
    # The job the run recorded holds the key (a host's or a queued run reads it there).
    assert json.loads((run / "config.json").read_text())["profile_steps"] == 3
    assert "profile: 3 step(s) recorded" in done.stdout
    # `runs show` says it: the steps, the top operators and where the trace is.
    shown = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(tmp_path / "runs"),
                            "show", run.name], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert "profile: 3 step(s) from step 3" in shown.stdout and f"trace: {trace}" in shown.stdout
    assert f"top operators (self time): {top[0]['name']} " in shown.stdout


@pytest.mark.parametrize("value", ["0", "-2", "three"])
def test_bad_profile_steps_is_one_line_exit_2(tmp_path: Path, value: str) -> None:
    _job(tmp_path)
    done = _train(tmp_path, f"--profile-steps={value}", timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "--profile-steps" in lines[0] and "Traceback" not in done.stderr, lines
    assert not (tmp_path / "runs").exists()


def test_more_profile_steps_than_max_steps_is_refused(tmp_path: Path) -> None:
    _job(tmp_path, max_steps=4)
    done = _train(tmp_path, "--profile-steps", "3", timeout=60)
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in done.stderr
    assert "profile_steps: 3 profiled steps need 5 training steps" in lines[0]
    assert "max_steps is 4" in lines[0]


def test_two_ranks_only_rank_0_profiles_and_counts_the_all_reduce(tmp_path: Path, demo_model: Path) -> None:
    """2 gloo ranks: one trace (rank 0's) and one summary; DDP's all-reduce is among its operators and
    in its collective time (what the all-reduce rule reads)."""
    job = JobConfig.load(_job(tmp_path))
    job.launch.num_processes = 2
    job.save(tmp_path / "job.json")
    done = _train(tmp_path, "--profile-steps", "3")
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (run,) = [r.folder for r in RunStore(tmp_path / "runs").runs()]
    (trace,) = profile.trace_files(run)
    assert trace.name.startswith("rank0.") and len(profile.profiler_steps(trace)) == 3
    summary = profile.read(run)
    assert summary is not None and summary["rank"] == 0
    assert any(op["name"] == "c10d::allreduce_" for op in summary["top_operators"])
    assert summary["collective_ms"] > 0

"""Stop keeps the checkpoint on a real model whose save takes seconds, from the terminal.

The model is a real Llama (~4.5M parameters, ~55 MB checkpoint with its Adam state) and the save is
slowed for real: tests/slowdisk makes every checkpoint file go to disk in fsync'd 1 MiB chunks at
4 MB/s, so one checkpoint takes >10 s, longer than accelerate's 5 s SIGTERM-to-SIGKILL in the
launcher and transformers' 3 s JIT wait together. A Stop that reached the launcher would be killed
mid-save; these runs must end "stopped" with a complete checkpoint that resumes at its step.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from gaudi_gui.core.events import read_events
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, RunStore, checkpoint_complete
from tests.helpers import children_get_sigint, slow_disk_env, steps, wait_until


def _job(tmp_path: Path, model: Path, *, nproc: int = 1, max_steps: int = 100000,
         resume: str = "") -> Path:
    job = JobConfig(model=str(model), training_args={
        "output_dir": str(tmp_path / "out"), "max_steps": max_steps, "per_device_train_batch_size": 2,
        "logging_steps": 1, "save_steps": 100000, "save_strategy": "steps"}, resume_from_checkpoint=resume)
    job.launch.num_processes = nproc
    path = tmp_path / f"job-{nproc}-{resume or 'new'}.json"
    job.save(path)
    return path


def _start_cli(tmp_path: Path, config: Path, env_extra: dict[str, str], *extra: str) -> subprocess.Popen[str]:
    """``gaudi-gui train`` in the foreground: this machine's agent's job, followed to its end (``extra``
    ``--no-agent``: in the command's own process)."""
    env = {**os.environ, **env_extra}
    with children_get_sigint():  # its Ctrl-C (SIGINT) is the stop
        return subprocess.Popen([sys.executable, "-m", "gaudi_gui", "train", "--config", str(config),
                                 "--runs-dir", str(tmp_path / "runs"), "--device", "cpu", *extra],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)


def _run_folder(tmp_path: Path) -> Run:
    (run,) = RunStore(tmp_path / "runs").runs()
    return run


def _steps_so_far(tmp_path: Path) -> int:
    """The step the one run in tmp_path/runs reached (0 while there is none yet)."""
    return steps(_run_folder(tmp_path)) if RunStore(tmp_path / "runs").runs() else 0


def _no_process_left(run: Run) -> None:
    assert wait_until(lambda: not run.processes_alive(), 30), "a rank was left after 30 s"
    for rank in run.ranks():
        assert not psutil.pid_exists(rank["pid"]) or \
            psutil.Process(rank["pid"]).status() == psutil.STATUS_ZOMBIE


@pytest.mark.parametrize("nproc", [1, 2])
def test_ctrl_c_on_cli_keeps_a_slow_checkpoint_and_resumes_there(tmp_path: Path, sized_model_dir: Path,
                                                                nproc: int) -> None:
    cli = _start_cli(tmp_path, _job(tmp_path, sized_model_dir, nproc=nproc), slow_disk_env(4))
    try:
        assert wait_until(lambda: _steps_so_far(tmp_path) >= 3, 240), "no three training steps in 240 s"
        run = _run_folder(tmp_path)
        assert len(run.ranks()) == nproc
        t0 = time.monotonic()
        cli.send_signal(signal.SIGINT)
        _out, err = cli.communicate(timeout=180)
        took = time.monotonic() - t0
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 0, err[-3000:]
    events = run.events()
    saved = [e for e in events if e["type"] == "checkpoint_saved"]
    assert saved and saved[-1]["seconds"] > 10, saved  # the save really took longer than 10 s
    assert took > 10
    step = saved[-1]["step"]
    ckpt = tmp_path / "out" / f"checkpoint-{step}"
    assert checkpoint_complete(ckpt)
    assert (ckpt / "model.safetensors").stat().st_size > 15e6 and (ckpt / "optimizer.pt").is_file()
    if nproc == 2:
        assert (ckpt / "rng_state_1.pth").is_file()  # every rank took part in the save
        assert {e["rank"] for e in events if e["type"] == "stop_requested"} == {0, 1}
    status = run.status()
    assert status.state == "stopped" and status.step == step and status.origin == "cli"
    assert status.summary == f"Stopped at step {step} — checkpoint-{step} saved; Resume continues there"
    assert "saving checkpoint…" in err and "Traceback" not in err
    assert "143" not in status.summary
    _no_process_left(run)

    # Resume continues at the checkpoint's step and reaches the same step count a full run would.
    target = step + 2
    resume = _start_cli(tmp_path / "resume", _job(tmp_path, sized_model_dir, nproc=1, max_steps=target,
                                                   resume="latest"), {})
    _out, err = resume.communicate(timeout=240)
    assert resume.returncode == 0, err[-3000:]
    rfolder = _run_folder(tmp_path / "resume").folder
    revents = read_events(rfolder / "events.jsonl")
    started = next(e for e in revents if e["type"] == "training_started")
    assert started["start_step"] == step
    finished = next(e for e in revents if e["type"] == "finished")
    assert finished["global_step"] == target
    metric_steps = [e["step"] for e in revents if e["type"] == "metrics" and not e.get("summary")]
    assert metric_steps[0] == step + 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_or_sighup_to_cli_stops_like_ctrl_c(tmp_path: Path, demo_model: Path, sig: int) -> None:
    cli = _start_cli(tmp_path, _job(tmp_path, demo_model), {})
    try:
        assert wait_until(lambda: _steps_so_far(tmp_path) >= 2, 240), "no two training steps in 240 s"
        run = _run_folder(tmp_path)
        cli.send_signal(sig)
        _out, err = cli.communicate(timeout=120)
    finally:
        if cli.poll() is None:
            cli.kill()
    assert cli.returncode == 0, err[-2000:]
    status = run.status()
    assert status.state == "stopped" and status.checkpoint, status
    assert checkpoint_complete(status.checkpoint)
    _no_process_left(run)


def _signal_the_rank(tmp_path: Path, model: Path, sig: int) -> tuple[subprocess.Popen[str], Run, str]:
    """Start a CLI run, wait for two steps, send ``sig`` to its rank (not the CLI) and wait."""
    cli = _start_cli(tmp_path, _job(tmp_path, model), {})
    try:
        assert wait_until(lambda: _steps_so_far(tmp_path) >= 2, 240), "no two training steps in 240 s"
        run = _run_folder(tmp_path)
        (rank,) = run.ranks()
        os.kill(rank["pid"], sig)
        _out, err = cli.communicate(timeout=120)
    finally:
        if cli.poll() is None:
            cli.kill()
    return cli, run, err


def test_sigterm_to_a_rank_from_outside_is_a_stop_not_a_finish(tmp_path: Path, demo_model: Path) -> None:
    """Preemption: a scheduler SIGTERMs the worker directly. The run saves and says "stopped"."""
    cli, run, err = _signal_the_rank(tmp_path, demo_model, signal.SIGTERM)
    status = run.status()
    assert status.state == "stopped", (status, err[-2000:])
    assert status.step < 100000 and status.max_steps == 100000
    assert cli.returncode == 0


def test_sigkill_of_a_rank_is_killed(tmp_path: Path, demo_model: Path) -> None:
    cli, run, err = _signal_the_rank(tmp_path, demo_model, signal.SIGKILL)
    assert cli.returncode == 1
    status = run.status()
    assert status.state == "killed" and "Killed at step" in status.summary, status
    assert "gaudi-gui train: Killed at step" in err


def test_sigkill_of_the_cli_leaves_a_run_a_later_reader_reports_truthfully(tmp_path: Path,
                                                                          demo_model: Path) -> None:
    """The in-process supervisor (``--no-agent``) killed: the run goes on, nobody writes its status."""
    cli = _start_cli(tmp_path, _job(tmp_path, demo_model), {}, "--no-agent")
    try:
        assert wait_until(lambda: _steps_so_far(tmp_path) >= 2, 240), "no two training steps in 240 s"
        run = _run_folder(tmp_path)
        cli.kill()
        cli.wait(timeout=30)
    finally:
        if cli.poll() is None:
            cli.kill()
    # The launch lives on in its own session and keeps writing its folder...
    assert run.reconcile().state == "running"
    before = steps(run)
    assert wait_until(lambda: steps(run) > before, 60), "training did not go on without the CLI"
    # ...and a later gaudi-gui can stop it exactly, through the recorded ranks.
    from gaudi_gui.core.stopper import Stopper
    stopper = Stopper(run, run.status().launcher)
    assert "SIGTERM sent to 1 rank" in stopper.request()
    assert wait_until(lambda: not run.processes_alive(), 120), "the run did not end in 120 s"
    status = run.reconcile()
    assert status.state == "stopped" and checkpoint_complete(status.checkpoint), status
    # Its supervisor is gone: every reader tells it so, and none writes its status (one writer).
    assert json.loads(run.status_path.read_text())["state"] == "running"


def test_resume_latest_without_checkpoint_says_so(tmp_path: Path, demo_model: Path) -> None:
    cli = _start_cli(tmp_path, _job(tmp_path, demo_model, max_steps=3, resume="latest"), {})
    _out, err = cli.communicate(timeout=240)
    assert cli.returncode == 1
    assert "nothing to resume" in err and "Traceback" not in err
    assert _run_folder(tmp_path).status().error_kind == "resume"

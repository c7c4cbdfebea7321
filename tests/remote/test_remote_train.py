"""Training on a host over SSH: the run lives there, outlives the client and the connection, is
followed again and stopped with a checkpoint; nothing is left on the host afterwards."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.remote import Host
from tests.helpers import steps, wait_until
from tests.remote.conftest import SshHost


@pytest.mark.usefixtures("demo_model")
def test_run_on_host_outlives_client_and_connection_then_stops_with_checkpoint(
        ssh_host: SshHost, tmp_path: Path) -> None:
    job_file = tmp_path / "job.json"
    out_dir = ssh_host.home / "out"  # a path on the host
    JobConfig(training_args={"output_dir": str(out_dir), "max_steps": 100000, "logging_steps": 1,
                             "per_device_train_batch_size": 2, "save_strategy": "no"}).save(job_file)
    cli = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "train", "--host", ssh_host.dest, "--config",
                            str(job_file), "--device", "cpu"], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, env=dict(os.environ), start_new_session=True)
    def runs() -> list[Path]:
        return [p for p in ssh_host.runs_dir.glob("*") if (p / "config.json").exists()]

    assert wait_until(lambda: bool(runs()), 60), cli.stderr
    (run,) = runs()
    assert wait_until(lambda: steps(run) >= 2, 120), (run / "log.txt").read_text()[-2000:]
    # The app's side dies hard (ssh included): the run on the host goes on.
    os.killpg(cli.pid, signal.SIGKILL)
    cli.wait()
    before = steps(run)
    assert wait_until(lambda: steps(run) >= before + 3, 60)
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "running"

    # Follow it again, then the network drops: the follower reconnects and goes on where it was.
    follower = subprocess.Popen([sys.executable, "-m", "gaudi_gui", "runs", "--host", ssh_host.dest,
                                 "follow", run.name], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True, env=dict(os.environ))
    out_lines: list[str] = []
    err_lines: list[str] = []
    for stream, sink in ((follower.stdout, out_lines), (follower.stderr, err_lines)):
        threading.Thread(target=lambda s=stream, k=sink: k.extend(iter(s.readline, "")), daemon=True).start()
    assert wait_until(lambda: len(out_lines) >= 3, 60)  # the follower is connected and streaming
    ssh_host.drop()
    assert wait_until(lambda: any("reconnecting" in ln for ln in err_lines), 30), err_lines
    seen = len(out_lines)
    assert wait_until(lambda: len(out_lines) > seen + 2, 60), err_lines  # streaming again after the drop
    stop = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--host", ssh_host.dest, "stop",
                           run.name], capture_output=True, text=True, timeout=60, env=dict(os.environ))
    assert stop.returncode == 0, stop.stderr
    follower.wait(timeout=180)
    err, out = "".join(err_lines), "".join(out_lines)
    assert follower.returncode == 0, err[-3000:]
    assert "Stopped at step" in err and "saved" in err
    status = json.loads((run / "status.json").read_text())
    assert status["state"] == "stopped" and status["checkpoint"]
    assert (Path(status["checkpoint"]) / "trainer_state.json").is_file()
    assert "loss" in out  # the log streamed through
    assert ssh_host.wait_no_processes(30) == []


def test_guarded_hl_smi_loop_ends_when_the_client_is_killed(ssh_host: SshHost) -> None:
    host = Host.parse(ssh_host.dest)
    argv = host.wrap(host.gaudi_gui_argv("guard", "--grace", "0", "--", "hl-smi", "-Q",
                                         "index,utilization.aip", "-f", "csv,noheader", "-l", "1"))
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    first = proc.stdout.readline()
    assert first.strip()  # the loop runs on the host and prints
    assert any("fake_hl_smi" in line for line in ssh_host.command_lines())
    proc.kill()  # no pty: OpenSSH sends the remote side no signal, only EOF
    proc.wait()
    assert ssh_host.wait_no_processes(20) == []

"""``gaudi-gui train --hosts A,B --remote-command CMD`` runs CMD on every host (it was silently dropped:
both hosts got the default ``python3 -m gaudi_gui``). Checked against the real SSH test server with a
command that cannot run gaudi-gui: the pre-flight must fail on both hosts with that command's problem,
before anything is started."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from gaudi_gui.core.jobconfig import JobConfig
from tests.remote.conftest import SshHost

HOST_B = "gg-remote-b"  # the fixture's second alias of the same server


def test_remote_command_applies_to_every_host(ssh_host: SshHost, tmp_path: Path) -> None:
    job = tmp_path / "job.json"
    JobConfig(training_args={"output_dir": str(tmp_path / "out"), "max_steps": 2}).save(job)
    res = subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config", str(job), "--hosts",
                          f"{ssh_host.dest},{HOST_B}", "--device", "cpu", "--main-ip", "127.0.0.1",
                          "--remote-command", "python3 -m no_such_module"],
                         capture_output=True, text=True, timeout=120, env=dict(os.environ), check=False)
    assert res.returncode == 3, res.stdout + res.stderr
    assert "Traceback" not in res.stderr
    # Each host is asked with the given command, and each says it has no gaudi-gui that way.
    for host in (ssh_host.dest, HOST_B):
        assert f"gaudi-gui hosts --setup {host}" in res.stderr, res.stderr
    assert not list(ssh_host.runs_dir.glob("*/config.json"))  # nothing started
    assert ssh_host.wait_no_processes(20) == []

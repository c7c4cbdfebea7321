"""A host's queue (issue 29, 38) over the real SSH test server and the system ssh client: the job is
queued there through this machine's agent and its one link to the host's agent, kept by the host's
agent, and runs while the connection is cut."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gaudi_gui.core import queue
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run
from tests.remote.conftest import SshHost


def gg(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=180, env=dict(os.environ))


def test_a_host_queue_runs_its_job_with_the_connection_cut(demo_model: Path, ssh_host: SshHost,
                                                             tmp_path: Path) -> None:
    job = JobConfig(name="on-the-host $(touch canary)")
    job.training_args = {"max_steps": 2, "logging_steps": 1, "save_strategy": "no"}
    job.save(tmp_path / "job.json")
    added = gg("queue", "add", "--host", ssh_host.dest, "--config", str(tmp_path / "job.json"),
               "--device", "cpu", "--cards", "2,3", "--json")
    assert added.returncode == 0, added.stderr
    entry_id = json.loads(added.stdout)["entry"]
    ssh_host.drop()  # every connection cut: the host's agent goes on by itself
    root = ssh_host.home / "data" / "queue"
    deadline = time.monotonic() + 180
    while True:
        entry = queue.read_state(root).find(entry_id)
        if entry is not None and entry.state == "ended":
            break
        if time.monotonic() > deadline:
            pytest.fail(f"the host's queued job did not end: {entry}")
        time.sleep(0.2)
    assert entry.outcome == "finished", entry.summary
    assert Path(entry.run_folder).parent == ssh_host.runs_dir
    assert Run(entry.run_folder).status().state == "finished"
    assert entry.cards_used == [2, 3]
    # Asked again over a new connection: the host's queue says how it ended.
    listed = gg("queue", "list", "--host", ssh_host.dest, "--json")
    assert listed.returncode == 0, listed.stderr
    (shown,) = json.loads(listed.stdout)["entries"]
    assert shown["id"] == entry_id and shown["outcome"] == "finished"
    # The job's name travelled as data: nothing ran in the remote shell.
    assert not (ssh_host.home / "canary").exists() and not Path("canary").exists()
    assert ssh_host.wait_no_processes(60, but_agent=True) == []  # the host's agent stays


def test_an_add_sent_again_to_a_host_is_queued_once(ssh_host: SshHost, tmp_path: Path) -> None:
    """An add sent again with the same client id (what a requester does when its connection dropped
    before the answer came) finds the entry the first one made: the host's queue holds the job once."""
    job = JobConfig(name="once")
    job.training_args = {"max_steps": 2, "save_strategy": "no"}
    job.save(tmp_path / "job.json")
    assert gg("queue", "pause", "--host", ssh_host.dest).returncode == 0
    for _ in range(2):
        added = gg("queue", "add", "--host", ssh_host.dest, "--config", str(tmp_path / "job.json"),
                   "--client-id", "abc123", "--json")
        assert added.returncode == 0, added.stderr
    assert json.loads(added.stdout)["message"] == "already queued as q1 (once)"
    state = queue.read_state(ssh_host.home / "data" / "queue")
    assert [e.id for e in state.entries] == ["q1"]
    assert gg("queue", "remove", "q1", "--host", ssh_host.dest).returncode == 0
    refused = gg("queue", "remove", "q1", "--host", ssh_host.dest)
    assert refused.returncode == 2 and refused.stderr.strip() == \
        "gaudi-gui queue remove: q1 (once) has already ended (removed)", refused.stderr
    assert gg("queue", "resume", "--host", ssh_host.dest).returncode == 0
    assert ssh_host.wait_no_processes(60, but_agent=True) == []

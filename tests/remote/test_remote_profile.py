"""Profiling on a host (issue 40): the trace is written on the host and brought back with the run. One
real profiled run of the demo on the test host (3 steps, 1 profiled): ``train --host`` brings it into
this machine's runs store when it ends; the window's way (a run on a host followed to its end by a
``TrainingJob``) asks this machine's agent to bring it, and the Profile page opens the trace from the
local copy; ``runs --host H fetch`` brings it again in place."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from gaudi_gui.core import profile, run_copy
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.placement import Placement
from gaudi_gui.core.remote import Host
from gaudi_gui.core.runstore import RunStore
from tests.remote.conftest import SshHost

pytestmark = pytest.mark.slow


def gg(*args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "gaudi_gui", *args], capture_output=True, text=True,
                          timeout=timeout, env=dict(os.environ))


@pytest.mark.usefixtures("demo_model")
def test_a_profile_made_on_a_host_comes_back_with_the_run(ssh_host: SshHost, tmp_path: Path,
                                                          qtbot: QtBot) -> None:
    job = JobConfig(training_args={"output_dir": str(ssh_host.home / "out"), "max_steps": 3,
                                   "logging_steps": 1, "per_device_train_batch_size": 2,
                                   "save_strategy": "no"})
    job.dataset.max_length = 32
    job.save(tmp_path / "job.json")
    done = gg("train", "--host", ssh_host.dest, "--config", str(tmp_path / "job.json"), "--device", "cpu",
              "--profile-steps", "1")
    assert done.returncode == 0, done.stderr[-3000:]
    (remote,) = [p for p in ssh_host.runs_dir.iterdir() if (p / "config.json").is_file()]
    (remote_trace,) = profile.trace_files(remote)  # written on the host
    store = RunStore()
    local = store.root / remote.name
    trace = local / "profile" / remote_trace.name
    assert f"profile: brought back to {local}; its profile trace: {trace}" in done.stderr, done.stderr[-2000:]
    assert local != remote and trace.read_bytes() == remote_trace.read_bytes()
    summary = profile.read(local)
    assert summary is not None and summary["steps"] == 1 and summary["trace"] == str(trace)
    origin = run_copy.origin(local)
    assert origin is not None and (origin["host"], origin["folder"]) == (ssh_host.dest, str(remote))
    assert not (local / "ranks").exists()  # the host's pids stay there
    assert [r.name for r in store.runs()] == [remote.name]  # the Runs list has it, as a finished run
    assert store.runs()[0].status().state == "finished"

    # The window's way: the run on the host followed (here: again, to its end) by a TrainingJob,
    # which asks this machine's agent to bring the profile; the Profile page then opens it here.
    shutil.rmtree(local)
    from gaudi_gui.services.training_job import TrainingJob
    from gaudi_gui.ui.profile_view import ProfileView
    followed = TrainingJob(Placement.on_host(Host.parse(ssh_host.dest)), store)
    try:
        with qtbot.waitSignal(followed.profile_brought, timeout=60000) as brought:
            followed.follow({"parts": [{"host": ssh_host.dest, "folder": str(remote), "name": remote.name}],
                             "job": json.loads((remote / "config.json").read_text())})
        assert brought.args == [str(local)]
        assert followed.state == "finished"
        view = ProfileView()
        qtbot.addWidget(view)
        assert view.show_run(local, remote.name)
        assert view.open_button.isEnabled() and str(local / "profile") in view.where.text()
    finally:
        followed.shutdown()

    # By hand, again: the copy is replaced in place (not a second one).
    again = gg("runs", "--host", ssh_host.dest, "fetch", str(remote), timeout=60)
    assert again.returncode == 0, again.stderr
    assert again.stdout.startswith(f"brought back to {local}; its profile trace: ")
    assert [r.name for r in store.runs()] == [remote.name]
    refused = gg("runs", "fetch", str(remote), timeout=60)
    assert refused.returncode == 2 and "gaudi-gui runs --host DEST fetch RUN" in refused.stderr
    assert ssh_host.wait_no_processes(30, but_agent=True) == []  # the run followed through the agents

"""Issue 38, a thin window, for training: a run started from the Training tab, on this machine or on a
saved host (a real SSH server on 127.0.0.1), is its place's agent's. While it trains the window
process has no child process at all (no `train --detach` call, no `runs follow` follower, no ssh);
the window's connection to its agent dropped (the agent SIGKILLed) leaves the run training, and the
tab follows it again, each step once; Stop, clicked, saves a checkpoint the job then offers."""
# mypy: disable-error-code="union-attr"

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
from pytestqt.qtbot import QtBot

from gaudi_gui.core import agentwire, remote
from gaudi_gui.core.runstore import Run, checkpoint_complete
from gaudi_gui.services.agent_child import shared_client
from gaudi_gui.services.run_parts import FOLLOWING, RECONNECTING
from tests.helpers import click, end_training_tab, set_arg, training_tab, wait_gone
from tests.remote.conftest import SshHost


def _children(qtbot: QtBot, ssh_host: SshHost) -> list[str]:
    """The window's children, once its start of a new agent (``agentwire.spawn(wait=False)``: an
    intermediate that forks the agent and ends, reaped on a later turn of the event loop) is over."""
    qtbot.waitUntil(lambda: agentwire.reap_started() == 0, timeout=30_000)
    return ssh_host.window_children()


@pytest.mark.parametrize("where", ["local", "host"])
@pytest.mark.usefixtures("demo_model")
def test_training_is_the_agents_and_outlives_a_dropped_agent_connection(
        qtbot: QtBot, ssh_host: SshHost, tmp_path: Path, where: str) -> None:
    remote.save_hosts([remote.Host.parse(ssh_host.dest)])
    services, tab = training_tab(qtbot, tmp_path)
    try:
        if where == "host":
            tab.placement.host_combo.setCurrentIndex(tab.placement.host_combo.findData(ssh_host.dest))
        out = (ssh_host.home if where == "host" else tmp_path) / "out"
        tab.form.model.setCurrentText("builtin:demo")
        set_arg(tab, "output_dir", str(out))
        set_arg(tab, "max_steps", "100000")
        set_arg(tab, "save_steps", "100000")
        set_arg(tab, "logging_steps", "1")
        click(qtbot, tab.btn["Start"])
        qtbot.waitUntil(lambda: tab.job.kind == where and tab.job.folder != "", timeout=120_000)
        job = tab.job
        qtbot.waitUntil(lambda: len(job.records) >= 2, timeout=240_000)
        run = Run(job.folder)
        assert run.folder.parent == (ssh_host.runs_dir if where == "host" else tmp_path / "runs")
        # Training, and not the window's: no child of this process runs for it.
        assert _children(qtbot, ssh_host) == []
        assert "it goes on if the app" in tab.log.plain_text()
        assert run.status().origin == "gui"  # the agent's to set, from the request (a host's run too)

        # The window's connection to its agent drops (the agent is killed): the run trains on, the
        # tab says so, then follows it again from where it was.
        agent_pid = int(shared_client().agent.get("pid") or 0)
        assert agent_pid > 0
        os.kill(agent_pid, signal.SIGKILL)
        assert wait_gone(agent_pid, 10)
        qtbot.waitUntil(lambda: job.connection == RECONNECTING, timeout=30_000)
        assert job.is_running() and run.supervisor() is not None
        seen = len(job.records)
        qtbot.waitUntil(lambda: job.connection == FOLLOWING and len(job.records) > seen + 2, timeout=120_000)
        steps = [r["step"] for r in job.records]
        assert steps == list(range(steps[0], steps[0] + len(steps))), steps  # each step once, none missed
        assert int(shared_client().agent.get("pid") or 0) not in (0, agent_pid)  # a new agent took it up
        assert _children(qtbot, ssh_host) == []

        # Stop, clicked: the ranks save a checkpoint, the job offers it; still no child of the window.
        with qtbot.waitSignal(job.finished, timeout=180_000) as done:
            click(qtbot, tab.btn["Stop"])
            assert tab.btn["Stop"].text() == "Kill now"
            assert _children(qtbot, ssh_host) == []
        assert done.args[1] == "stopped", tab.status.text()
        step = run.status().step
        assert job.checkpoint() == str(out / f"checkpoint-{step}"), (job.checkpoint(), step)
        assert checkpoint_complete(Path(job.checkpoint()))
        assert tab.status.text().startswith(f"Stopped at step {step}"), tab.status.text()
        assert not run.processes_alive()
        assert _children(qtbot, ssh_host) == []
    finally:
        end_training_tab(qtbot, services, tab)

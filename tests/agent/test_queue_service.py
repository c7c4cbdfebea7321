"""The queue is the agent's (agent/queue.py, issue 38): SIGKILL the agent while a queued job runs and
another waits for its card; the next client starts a new agent, which takes the queue up from its state,
re-adopts the running job and starts the waiting one when the first ends. Nothing is lost, nothing runs
twice. Real parts: the command line, real detached training runs of the demo model on the CPU, the fake
hl-smi of a recorded 8-card server."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import psutil
import pytest

from gaudi_gui.core.agentwire import Connection
from gaudi_gui.core.runstore import Run
from tests.integration.test_queue import (  # noqa: F401 (idle_server, queue_env: fixtures)
    add,
    ended,
    entries,
    gg,
    idle_server,
    job_file,
    queue_env,
    wait_for,
)

pytestmark = pytest.mark.usefixtures("demo_model", "idle_server")


def test_a_killed_agent_loses_no_queued_job_and_the_next_one_starts_the_waiting_one(tmp_path: Path) -> None:
    first = add(job_file(tmp_path, "one"), "--cards", "1,")
    second = add(job_file(tmp_path, "two"), "--cards", "1,")
    wait_for(lambda: entries()[first].state == "started", "the first job to start")
    with Connection.open(start=False, client="test") as conn:
        pid = int(conn.agent["pid"])
    kept = entries()
    assert kept[second].state == "waiting" and "in use by queued job q1 (one)" in kept[second].why
    supervisor = Run(kept[first].run_folder).supervisor()
    assert supervisor is not None
    os.kill(pid, signal.SIGKILL)
    psutil.Process(pid).wait(timeout=10)
    # The run goes on without an agent; the queue's state is as the agent last wrote it.
    kept = entries()
    assert kept[first].state == "started" and kept[second].state == "waiting"
    run_first = kept[first].run_folder
    # The next client (a `queue list`) starts a new agent: it takes the queue up from its state.
    listed = gg("queue", "list")
    assert listed.returncode == 0 and "started on module 1" in listed.stdout, listed.stdout + listed.stderr
    with Connection.open(start=False, client="test") as conn:
        assert int(conn.agent["pid"]) != pid
    started = wait_for(lambda: entries()[second].state == "started" and entries()[second],
                       "the waiting job to start after the first one ended")
    assert gg("runs", "stop", started.run_folder, "--now").returncode == 0  # its start is what counts
    done = wait_for(lambda: ended([first, second]), "both jobs to end")
    assert done[first].run_folder == run_first and done[first].outcome == "finished", done[first].summary
    assert done[second].outcome in ("killed", "stopped", "failed", "finished"), done[second].summary
    # One after the other on the one card; and nothing started twice.
    assert Run(done[second].run_folder).status().started_at >= Run(run_first).status().ended_at
    runs = [p for p in (Path(os.environ["GAUDI_GUI_HOME"]) / "data" / "runs").iterdir() if p.is_dir()
            and not p.name.startswith(".")]
    assert sorted(str(p) for p in runs) == sorted([run_first, done[second].run_folder])

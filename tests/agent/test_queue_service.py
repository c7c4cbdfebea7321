"""The queue is the agent's (agent/queue.py, issue 38): SIGKILL the agent while a queued job runs and
another waits for its card; the next client starts a new agent, which takes the queue up from its state,
re-adopts the running job and starts the waiting one when the first ends. Nothing is lost, nothing runs
twice. Real parts: the command line, real detached training runs of the demo model on the CPU, the fake
hl-smi of a recorded 8-card server."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest

from gaudi_gui.core.agentwire import Connection
from gaudi_gui.core.runstore import Run
from tests.helpers import wait_gone
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


@pytest.mark.usefixtures("demo_model", "idle_server")
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
    assert wait_gone(pid, 10)
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


def test_a_start_the_killed_agent_did_not_hear_back_from_is_taken_up_from_the_run_it_made(
        tmp_path: Path) -> None:
    """Two entries written "starting" by an agent killed before its starts answered: the next agent
    takes the run the first start made (its kind, begun once it was starting, no other entry's) and
    reports how it ended; the second start left nothing, so it is made again after its back-off."""
    import asyncio
    import time

    from gaudi_gui.agent.queue import QueueService
    from gaudi_gui.agent.server import Agent
    from gaudi_gui.core import queue
    from gaudi_gui.core.jobconfig import JobConfig
    from gaudi_gui.core.queue import Entry, QueueState
    from gaudi_gui.core.runstore import RunStore

    since = time.time() - 1.0
    root = queue.make_dirs(tmp_path / "q")
    queue.write_state(QueueState(entries=[
        Entry(id=f"q{n}", job={}, name=f"job{n}", state="starting", since=since, attempts=1)
        for n in (1, 2)]), root)
    made = RunStore().create(JobConfig(name="job1"))
    made.update_status(state="finished", started_at=time.time(), ended_at=time.time(), summary="Finished")

    async def take_up() -> dict[str, Entry]:
        service = QueueService(Agent(sock_path=tmp_path / "agent.sock"), root)
        await service.start()
        try:
            for _ in range(100):  # the recoveries are tasks of the agent's loop
                if all(e.state != "starting" for e in service.state.entries):
                    break
                await asyncio.sleep(0.02)
            return {e.id: e for e in service.state.entries}
        finally:
            await service.stop()

    got = asyncio.run(take_up())
    first = got["q1"]
    assert (first.state, first.outcome, first.run_folder) == ("ended", "finished", str(made.folder))
    assert got["q2"].state == "waiting" and got["q2"].retry_at > time.time(), got["q2"]
    assert "start attempt 1 of 3 failed (the start was interrupted" in got["q2"].why
    # What the next agent wrote is what the one after it reads.
    assert [(e.id, e.state) for e in queue.read_state(root).entries] == [("q1", "ended"), ("q2", "waiting")]

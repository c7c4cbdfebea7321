"""A stop that could not be carried out is said, and the next press sends it again: a training run
followed by the window (``TrainingJob.follow``) whose Stop was on its way when the agent died (the
request is answered "the agent went away before it answered"): the job says so in its line, goes back to
running, and once a new agent answers, Stop pressed again stops the run. And a run followed again after a
restart whose folder was deleted meanwhile is said and let go, not "re-attaching…" for ever."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from pytestqt.qtbot import QtBot

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.placement import Placement
from gaudi_gui.core.runstore import SUPERVISOR_INFO, RunStore
from gaudi_gui.services.run_parts import FOLLOWING
from gaudi_gui.services.training_job import TrainingJob

#: A run's supervisor as far as a follower can tell: alive, and on SIGTERM it writes "stopped" and ends.
_SUPERVISOR = """
import signal, sys, time
from gaudi_gui.core.runstore import Run
run = Run(sys.argv[1])
def stop(*_):
    run.update_status(state="stopped", summary="Stopped (asked)", ended_at=time.time())
    sys.exit(0)
signal.signal(signal.SIGTERM, stop)
print("ready", flush=True)
while True:
    time.sleep(0.1)
"""


def test_a_stop_lost_with_the_agent_is_said_and_sent_again(qtbot: QtBot, tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    run = store.create(JobConfig())
    supervisor = subprocess.Popen([sys.executable, "-c", _SUPERVISOR, str(run.folder)],
                                  stdout=subprocess.PIPE, text=True, start_new_session=True)
    try:
        assert supervisor.stdout is not None and supervisor.stdout.readline().strip() == "ready"
        made = psutil.Process(supervisor.pid).create_time()
        run.update_status(state="running", pid=supervisor.pid, pid_create_time=made, started_at=time.time())
        (run.folder / SUPERVISOR_INFO).write_text(json.dumps({"pid": supervisor.pid, "create_time": made}))
        job = TrainingJob(Placement.local(), store)
        job.follow({"parts": [{"host": "local", "folder": str(run.folder), "name": run.name}]})
        part = job.parts[0]
        client = part.job.client()
        qtbot.waitUntil(lambda: client.state == "up" and part.connection == FOLLOWING, timeout=30_000)
        failed: list[tuple[bool, str]] = []
        part.stop_failed.connect(lambda now, words: failed.append((now, words)))
        lines: list[str] = []
        job.log_line_received.connect(lines.append)

        # The agent hangs, the Stop goes out, the agent dies before it answered.
        agent = int(client.agent["pid"])
        os.kill(agent, signal.SIGSTOP)
        job.stop()
        assert job.state == "stopping" and part.stop_sent == 1
        os.kill(agent, signal.SIGKILL)
        qtbot.waitUntil(lambda: len(failed) == 1, timeout=60_000)
        assert failed[0][0] is False and "the agent went away before it answered" in failed[0][1], failed
        assert job.state == "running" and part.stop_sent == 0 and job.is_running()
        # Said in the log; the line then says the agent is being reached again.
        assert any(line.startswith("[gaudi-gui] could not stop the run: ") and "went away" in line
                   for line in lines), lines
        qtbot.waitUntil(lambda: job.summary == "the agent went away; reconnecting… (the run goes on)",
                        timeout=10_000)
        assert supervisor.poll() is None  # nothing reached the run

        # A new agent answers: Stop pressed again is carried out.
        qtbot.waitUntil(lambda: client.state == "up" and int(client.agent.get("pid", agent)) != agent,
                        timeout=60_000)
        job.stop()
        qtbot.waitUntil(lambda: not job.is_running(), timeout=60_000)
        assert job.state == "stopped", job.summary
        assert supervisor.wait(timeout=10) == 0 and len(failed) == 1
        job.shutdown()
    finally:
        if supervisor.poll() is None:
            supervisor.kill()
            supervisor.wait()


def test_a_followed_run_whose_folder_is_gone_is_said_and_let_go(qtbot: QtBot, tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    job = TrainingJob(Placement.local(), store)
    gone = tmp_path / "runs" / "20260101-000000-gone"
    job.follow({"parts": [{"host": "local", "folder": str(gone), "name": gone.name}]})
    assert job.is_running() and job.summary.startswith("re-attaching to ")
    with qtbot.waitSignal(job.finished, timeout=60_000) as ended:
        pass
    assert ended.args[1] == "failed" and not job.is_running()
    assert job.summary.startswith(f"Not followed: no run {gone.name} in the runs store") and \
        "was deleted or moved" in job.summary, job.summary
    job.shutdown()

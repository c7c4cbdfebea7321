"""A run on several hosts asks the hosts first (the pre-flight): this machine's agent runs it as its
child (``hosts --preflight``; the window starts no thread, issue 38). Two hosts that do not exist: the
run fails before anything starts, every problem in the log, the first in the summary; Stop pressed
during the pre-flight ends the run as stopped once it answers; the app leaving during it starts
nothing. (The pre-flight that lets a run go: tests/remote/test_multi_host_tab.py.)"""

from __future__ import annotations

from pathlib import Path

import psutil
from pytestqt.qtbot import QtBot

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.placement import Placement
from gaudi_gui.core.remote import Host
from gaudi_gui.core.runstore import RunStore
from gaudi_gui.services.training_job import TrainingJob

#: Names that never resolve (RFC 2606's .invalid): ssh answers at once that they are unknown.
HOSTS = ("gg-a.invalid", "gg-b.invalid")


def _job(tmp_path: Path) -> tuple[TrainingJob, list[str], list[str]]:
    job = TrainingJob(Placement.on_hosts([Host.parse(n) for n in HOSTS]), RunStore(tmp_path / "runs"))
    lines: list[str] = []
    states: list[str] = []
    job.log_line_received.connect(lines.append)
    job.status_changed.connect(states.append)
    return job, lines, states


def test_a_preflight_that_finds_problems_fails_the_run_before_it_starts(qtbot: QtBot, tmp_path: Path) -> None:
    # The agent is up first: the window's start of it (``agentwire.spawn(wait=False)``: an intermediate
    # reaped on a later turn) is not the pre-flight's.
    from gaudi_gui.core import agentwire
    from gaudi_gui.services.agent_child import shared_client
    qtbot.waitUntil(lambda: shared_client().state == "up" and agentwire.reap_started() == 0, timeout=60_000)
    before = {p.pid for p in psutil.Process().children(recursive=True)}
    job, lines, states = _job(tmp_path)
    with qtbot.waitSignal(job.finished, timeout=60_000) as done:
        job.start(JobConfig(), main_ip="")
        assert job.summary == f"pre-flight on {', '.join(HOSTS)}: versions, paths, port 29500…"
        assert [h[2] for h in job.host_states()] == ["pre-flight", "pre-flight"]
        # Asked of the agent: no child, no thread of this process.
        assert [p for p in psutil.Process().children(recursive=True) if p.pid not in before] == []
    code, state, _tail = done.args
    assert (code, state) == (1, "failed") and states == ["queued", "failed"]
    assert lines[0] == f"[gaudi-gui] pre-flight on {', '.join(HOSTS)} …", lines
    said = [ln for ln in lines if ln.startswith("[gaudi-gui] pre-flight: ")]
    assert [s.split(": ")[1] for s in said] == list(HOSTS), lines  # every host's problem, in host order
    assert all("the host name is unknown" in s for s in said), said
    first = said[0].removeprefix("[gaudi-gui] pre-flight: ")
    assert job.summary == f"Failed: pre-flight: {first} (and 1 more: see the log)", job.summary
    assert job.parts == [] and not job.is_running()


def test_stop_during_the_preflight_ends_the_run_stopped(qtbot: QtBot, tmp_path: Path) -> None:
    job, lines, states = _job(tmp_path)
    with qtbot.waitSignal(job.finished, timeout=60_000) as done:
        job.start(JobConfig(), main_ip="10.0.0.1")
        job.stop()  # before the agent's child answered
        assert job.state == "stopping" and job.stopping
    assert done.args[:2] == [1, "stopped"], done.args
    assert job.summary == "Stopped before the run started on any host"
    assert states == ["queued", "stopping", "stopped"] and job.parts == []
    assert not any(ln.startswith("[gaudi-gui] pre-flight: ") for ln in lines), lines


def test_the_app_leaving_during_the_preflight_starts_nothing(qtbot: QtBot, tmp_path: Path) -> None:
    job, lines, _states = _job(tmp_path)
    ended: list[object] = []
    job.finished.connect(lambda *args: ended.append(args))
    job.start(JobConfig())
    child = job._preflight_child
    assert child is not None
    job.detach()
    qtbot.waitUntil(lambda: not child.is_running(), timeout=30_000)
    qtbot.wait(200)
    assert ended == [] and job.parts == [] and not any("pre-flight: " in ln for ln in lines), lines
    job.shutdown()

"""A stop the agent could not carry out is said, and the next press sends it again: a training run
followed again after a restart (``TrainingJob.follow``) whose run is not in any store of this machine's
agent (its folder was deleted meanwhile): the agent refuses ``job.stop`` ("no job …"), the job says so
in its line, goes back to running, and Stop, then Kill now, are each sent again when pressed."""

from __future__ import annotations

from pathlib import Path

from pytestqt.qtbot import QtBot

from gaudi_gui.core.placement import Placement
from gaudi_gui.core.runstore import RunStore
from gaudi_gui.services.training_job import TrainingJob


def test_a_stop_the_agent_refuses_is_said_and_sent_again(qtbot: QtBot, tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    job = TrainingJob(Placement.local(), store)
    gone = tmp_path / "runs" / "20260101-000000-gone"
    job.follow({"parts": [{"host": "local", "folder": str(gone), "name": gone.name}]})
    assert job.is_running() and job.folder == str(gone)
    part = job.parts[0]
    failed: list[tuple[bool, str]] = []
    part.stop_failed.connect(lambda now, words: failed.append((now, words)))

    job.stop()
    assert job.state == "stopping" and part.stop_sent == 1
    qtbot.waitUntil(lambda: len(failed) == 1, timeout=60_000)
    assert failed[0][0] is False and f"no job '{gone.name}'" in failed[0][1], failed
    assert job.state == "running" and part.stop_sent == 0 and job.is_running()
    assert job.summary.startswith("could not stop the run: stop failed: ") and \
        job.summary.endswith("; press Stop again"), job.summary

    job.stop()  # sent again: refused again
    qtbot.waitUntil(lambda: len(failed) == 2, timeout=60_000)
    job.kill()
    assert part.stop_sent == 2
    qtbot.waitUntil(lambda: len(failed) == 3, timeout=60_000)
    assert failed[2][0] is True and failed[2][1].startswith("kill failed: "), failed
    assert part.stop_sent == 1 and job.is_running()
    job.detach()
    assert not job.is_running()
    job.shutdown()

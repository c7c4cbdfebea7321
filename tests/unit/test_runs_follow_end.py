"""``runs follow`` says "end" only after every event and log line the run wrote before its final
status: a follower paused between its read of the files and its read of the status (a busy machine)
once ended without the last lines ("[rank 0/1] done" missing from the Training tab's log: a fresh
clone's failure)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gaudi_gui.commands import runs as runs_cmd
from gaudi_gui.core.events import EventWriter
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import SUPERVISOR_INFO, Run, RunStore


def test_lines_written_just_before_the_final_status_come_before_the_end(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    run = RunStore(tmp_path / "runs").create(JobConfig(name="late-lines"))
    run.log_path.write_text("[rank 0/1] step 8\n")
    EventWriter(run.events_path).write("step", step=8)
    run.update_status(state="running")
    run.write_supervisor()  # this process plays the supervisor: the run is owned while it is there
    real_reconcile = Run.reconcile
    reads = []

    def reconcile(self: Run) -> object:
        reads.append(1)
        if len(reads) == 2:
            # Between this poll's read of the files (nothing new) and its read of the status: the
            # worker's last words, the launcher's end, the supervisor's final status.
            with self.log_path.open("a") as log:
                log.write("[rank 0/1] done\n")
            EventWriter(self.events_path).write("finished", step=8)
            self.update_status(state="finished", summary="Finished 8 steps", ended_at=1.0)
            (self.folder / SUPERVISOR_INFO).unlink()  # the supervisor has exited
        return real_reconcile(self)

    monkeypatch.setattr(Run, "reconcile", reconcile)
    monkeypatch.setattr(runs_cmd, "FOLLOW_POLL_S", 0.01)
    monkeypatch.setattr(runs_cmd, "stdin_hangs_up", lambda: False)
    assert runs_cmd._follow(run, 0, 0) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    kinds = [m["t"] for m in out]
    assert kinds[-1] == "end" and out[-1]["status"]["state"] == "finished"
    logged = [m["line"] for m in out if m["t"] == "log"]
    assert logged == ["[rank 0/1] step 8", "[rank 0/1] done"], out
    events = [m["event"]["type"] for m in out if m["t"] == "event"]
    assert events == ["step", "finished"], out
    assert len(reads) == 2  # the status was read in the poll that found the files quiet

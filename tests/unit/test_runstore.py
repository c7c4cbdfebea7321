from __future__ import annotations

import json
from pathlib import Path

from gaudi_gui.core import metrics
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import RunStore, is_pid_alive, latest_checkpoint


def test_create_list_clone_and_status(tmp_path: Path) -> None:
    store = RunStore(tmp_path / "runs")
    job = JobConfig(training_args={"output_dir": str(tmp_path / "out")}, resume_from_checkpoint="latest")
    a, b = store.create(job), store.create(job)
    assert a.folder != b.folder
    assert [r.folder for r in store.runs()] == sorted([a.folder, b.folder], reverse=True)
    assert a.status().state == "queued"
    a.update_status(state="running", pid=123, started_at=1.0)
    a.append_log(["one", "two"])
    a.append_log(["three"])
    a.close()
    assert a.log_tail(2) == ["two", "three"]
    assert a.status().pid == 123
    clone = store.clone(a)
    assert clone.resume_from_checkpoint == "" and clone.output_dir == str(tmp_path / "out")
    (a.folder / "status.json").write_text("{broken")
    assert a.status().state == "failed"


def test_latest_checkpoint(tmp_path: Path) -> None:
    for step in (5, 20, 100):
        (tmp_path / f"checkpoint-{step}").mkdir()
    for step in (5, 20):
        (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    assert latest_checkpoint(tmp_path) == tmp_path / "checkpoint-20"  # 100 has no state: incomplete
    assert latest_checkpoint(tmp_path / "missing") is None


def test_metrics_and_progress(tmp_path: Path) -> None:
    path = tmp_path / "m.jsonl"
    rows = [{"step": i, "max_steps": 10, "loss": 5.0 - i, "elapsed": i * 2.0} for i in range(1, 5)]
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n{\"step\": 5, \"lo")  # cut last line
    records = metrics.read_metrics(path)
    assert len(records) == 4
    assert metrics.series(records, "loss") == ([1.0, 2.0, 3.0, 4.0], [4.0, 3.0, 2.0, 1.0])
    p = metrics.Progress()
    for r in records:
        p.update(r)
    assert p.fraction == 0.4 and p.eta == 12.0
    assert metrics.final_loss(records) == 1.0
    assert metrics.format_duration(75) == "1m15s"


def test_pid_alive() -> None:
    import os
    assert is_pid_alive(os.getpid()) and not is_pid_alive(0)

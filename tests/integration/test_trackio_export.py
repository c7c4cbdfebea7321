"""trackio: a run exported into trackio's local storage (``runs export --trackio``, ``core.export.
export_trackio``) and a training run with ``report_to`` trackio and tensorboard, each read back by the
tracker's own reader: trackio's storage class (``SQLiteStorage``) in a child with TRACKIO_DIR set
(trackio reads it once, at import), TensorBoard's EventAccumulator. All offline: no Space, no Hub
(the suite sets HF_HUB_OFFLINE; HF_HOME is the test's own, so no token is found either)."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from gaudi_gui.core import export
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, RunStore

if importlib.util.find_spec("trackio") is None:  # looked up, not imported: only the children import it
    pytest.skip("trackio is not installed (the test extra brings it)", allow_module_level=True)

T0 = 1_700_000_000.0

#: Run in a child with TRACKIO_DIR set: what trackio's own storage class reads of a project, as JSON.
READER = r"""
import json, sys
from trackio.sqlite_storage import SQLiteStorage as S
project = sys.argv[1]
records = S.get_run_records(project)
out = {"runs": [{"id": r["id"], "name": r["name"]} for r in records], "logs": {}, "system": {},
       "configs": S.get_all_run_configs(project)}
for r in records:
    out["logs"][r["id"]] = S.get_logs(project, r["name"], run_id=r["id"])
    out["system"][r["id"]] = S.get_system_logs(project, r["name"], run_id=r["id"])
print(json.dumps(out, default=str))
"""

#: A trackio run of the user's own (trackio's public API, as the Trainer's report_to writes it).
OWN_RUN = r"""
import sys, trackio
trackio.init(project=sys.argv[1], name=sys.argv[2], auto_log_gpu=False, auto_log_cpu=False, embed=False)
trackio.log({"train/loss": 9.0}, step=1)
trackio.finish()
"""


def _trackio(code: str, trackio_dir: Path, *args: str) -> str:
    import os
    env = {**os.environ, "TRACKIO_DIR": str(trackio_dir)}
    res = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, env=env,
                         timeout=120)
    assert res.returncode == 0, res.stderr[-3000:]
    return res.stdout


def _read(trackio_dir: Path, project: str) -> dict[str, Any]:
    return json.loads(_trackio(READER, trackio_dir, project).splitlines()[-1])


def _time(text: str) -> float:
    return datetime.fromisoformat(text).timestamp()


def _fake_run(folder: Path) -> Run:
    """4 logged steps and an evaluation; a meter of 2 cards (one reading missing), throttle reads."""
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps({"model": "demo", "name": "my job"}))
    events: list[dict[str, Any]] = [{"type": "training_started", "rank": 0, "time": T0, "max_steps": 4}]
    for step in range(1, 5):
        events.append({"type": "metrics", "rank": 0, "time": T0 + step, "step": step, "max_steps": 4,
                       "loss": 3.0 - step / 4, "learning_rate": 1e-3, "grad_norm": 1.5, "throughput": 2.0,
                       "tokens_per_second": 512.0, "memory_peak_mib": 100.0 + step})
    events.append({"type": "metrics", "rank": 0, "time": T0 + 4.5, "step": 4, "eval_loss": 2.0})
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (folder / "status.json").write_text(json.dumps({"state": "finished", "started_at": T0}))
    lines = []
    for i in range(6):
        cards = [{"name": "module 2", "power_w": 100.0, "utilization": 50.0, "memory_used_mib": 512.0,
                  "temperature_c": 40.0},
                 {"name": "module 3", "power_w": None if i == 3 else 200.0, "utilization": 60.0}]
        lines.append(json.dumps({"t": T0 + i, "source": "hl-smi", "cards": cards}))
        if i % 2:
            lines.append(json.dumps({"t": T0 + i + 0.5, "source": "hl-smi -q",
                                     "throttle": {"module 2": [], "module 3": ["power"] if i >= 3 else []}}))
    (folder / "meter.jsonl").write_text("\n".join(lines) + "\n")
    (folder / "meter-summary.json").write_text(json.dumps({"cards": [2, 3]}))
    return Run(folder)


def test_export_read_back_by_trackio_and_replaced_not_doubled(tmp_path: Path) -> None:
    """export_trackio writes the training series by step with the events' times and the meter as
    system metrics with the samples' times, as a trackio run named after the run; a second export
    replaces the first, and a trackio run of the user's own with the same name is left alone."""
    run = _fake_run(tmp_path / "runs" / "run-a")
    where = tmp_path / "trackio"
    result = export.export_trackio(run, where, project="gaudi-gui")
    assert result.tracker == "trackio" and result.run_name == "run-a" and result.missing == []
    assert result.file.parent == where and result.file.is_file()
    text = export.describe(result)
    assert "trackio project 'gaudi-gui', run 'run-a'" in text and "trackio show --project gaudi-gui" in text
    assert {"train/loss", "eval/loss", "meter/power_w/module 2", "meter/throttled/module 3",
            "meter/energy_wh", "meter/card_hours"} <= set(result.tags)

    _trackio(OWN_RUN, where, "gaudi-gui", "run-a")  # the user's own trackio run of that name
    again = export.export_trackio(run, where, project="gaudi-gui")
    assert again.scalars == result.scalars
    seen = _read(where, "gaudi-gui")
    ours = export.trackio_run_id("run-a")
    assert sorted(r["id"] == ours for r in seen["runs"]) == [False, True]  # one export, one own run
    assert {r["name"] for r in seen["runs"]} == {"run-a"}
    logs = seen["logs"][ours]
    train = [row for row in logs if "train/loss" in row]
    assert [row["step"] for row in train] == [1, 2, 3, 4]
    assert [row["train/loss"] for row in train] == pytest.approx([2.75, 2.5, 2.25, 2.0])
    assert [row["train/memory_peak_mib"] for row in train] == [101.0, 102.0, 103.0, 104.0]
    assert [_time(row["timestamp"]) for row in train] == [T0 + s for s in (1, 2, 3, 4)]
    (evaluated,) = [row for row in logs if "eval/loss" in row]
    assert evaluated["step"] == 4 and evaluated["eval/loss"] == 2.0
    system = seen["system"][ours]
    card = "meter/power_w/module 2"
    power = [(_time(r["timestamp"]), r[card]) for r in system if card in r]
    assert power == [(T0 + i, 100.0) for i in range(6)]
    # The run's total power only where every card read one; energy with the missing reading bridged.
    assert [_time(r["timestamp"]) - T0 for r in system if "meter/power_w" in r] == [0, 1, 2, 4, 5]
    energy = [r["meter/energy_wh"] for r in system if "meter/energy_wh" in r]
    assert energy[-1] == pytest.approx((500 + 1000) / 3600, rel=1e-6)
    assert [r["meter/throttled/module 3"] for r in system if "meter/throttled/module 3" in r] == [0, 1, 1]
    assert [r["meter/card_hours"] for r in system if "meter/card_hours" in r][-1] == pytest.approx(10 / 3600)
    config = seen["configs"][ours]
    assert config["gaudi_gui_run"] == "run-a" and config["model"] == "demo" and config["job_name"] == "my job"
    # The user's own run: untouched by the second export.
    (own,) = [r["id"] for r in seen["runs"] if r["id"] != ours]
    assert [row["train/loss"] for row in seen["logs"][own]] == [9.0]


def test_runs_export_trackio_command(tmp_path: Path) -> None:
    """`runs export RUN --trackio --trackio-dir DIR --project P`: written (exit 0), a meter-only run
    listed by trackio through its meter by seconds; a project trackio would store under another name
    and --project without --trackio are refused at once (exit 2), nothing written."""
    run = _fake_run(tmp_path / "runs" / "run-m")
    (run.folder / "events.jsonl").unlink()  # a meter and no training step
    base = [sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(tmp_path / "runs"), "export",
            "run-m"]
    where = tmp_path / "tio"
    res = subprocess.run([*base, "--trackio", "--trackio-dir", str(where), "--project", "p1"],
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert "exported" in res.stdout and "not there to export: training metrics" in res.stdout
    seen = _read(where, "p1")
    assert [r["name"] for r in seen["runs"]] == ["run-m"]
    logs = seen["logs"][export.trackio_run_id("run-m")]
    assert [row["step"] for row in logs if "meter/power_w/module 2" in row] == [0, 1, 2, 3, 4, 5]
    for bad, said in ((["--trackio", "--project", "my project"], "letters, digits, - and _"),
                      (["--project", "p2", "--tensorboard", str(tmp_path / "tb")], "are for --trackio")):
        res = subprocess.run([*base, *bad], capture_output=True, text=True, timeout=60)
        assert res.returncode == 2 and said in res.stderr and "Traceback" not in res.stderr, res.stderr
    assert not (tmp_path / "tb").exists() and sorted(p.name for p in where.glob("*.db")) == ["p1.db"]


@pytest.mark.usefixtures("demo_model")
def test_report_to_tensorboard_and_trackio_reach_the_trainer(tmp_path: Path) -> None:
    """A 2-step demo run with report_to ["tensorboard", "trackio"] (the job file's value, as the form
    writes it): TensorBoard event files under the output folder's runs/ with train/loss, and the
    run's metrics in trackio's local storage (TRACKIO_DIR of the test) as a trackio run named after the
    run; where each went is said in the log and kept in trackers.json."""
    import os
    where = tmp_path / "trackio"
    job = JobConfig(training_args={"output_dir": str(tmp_path / "out"), "max_steps": 2, "logging_steps": 1,
                                   "per_device_train_batch_size": 2, "save_strategy": "no",
                                   "report_to": ["tensorboard", "trackio"], "project": "reports"})
    job.save(tmp_path / "job.json")
    res = subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config", str(tmp_path / "job.json"),
                          "--runs-dir", str(tmp_path / "runs")], capture_output=True, text=True, timeout=300,
                         env={**os.environ, "TRACKIO_DIR": str(where)})
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = [r.folder for r in RunStore(tmp_path / "runs").runs()]
    log = (run / "log.txt").read_text()
    assert f"trackio: logging locally to {where}, project reports, run {run.name}" in log
    trackers = json.loads((run / "trackers.json").read_text())
    assert trackers == {"trackio": {"dir": str(where), "project": "reports", "run": run.name},
                        "tensorboard": {"dir": str(tmp_path / "out" / "runs")}}

    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
    (logdir,) = {p.parent for p in (tmp_path / "out" / "runs").rglob("events.out.tfevents.*")}
    acc = EventAccumulator(str(logdir), size_guidance={SCALARS: 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [1, 2]

    seen = _read(where, "reports")
    assert [r["name"] for r in seen["runs"]] == [run.name]
    logs = next(iter(seen["logs"].values()))
    assert [row["train/global_step"] for row in logs if "train/loss" in row] == [1, 2]


def test_report_to_refused_with_its_reason_before_anything_loads(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """The training worker's look at report_to (before the model loads): "none" changes nothing; a trackio
    Space while HF_HUB_OFFLINE is set is refused (it cannot be reached: no wait on the network); a
    tracker whose package cannot be found is refused with its pip line. Nothing is recorded then."""
    from gaudi_gui.workers import train
    args: dict[str, Any] = {"report_to": "none", "output_dir": str(tmp_path / "out")}
    assert train.reporting(args, tmp_path) == {} and "run_name" not in args
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    space = {"report_to": ["trackio"], "trackio_space_id": "me/board", "output_dir": str(tmp_path / "out")}
    with pytest.raises(train.WorkerError, match="the Space me/board needs the network, and HF_HUB_OFFLINE"):
        train.reporting(space, tmp_path)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    for tracker, pip in (("trackio", "pip install trackio"), ("tensorboard", "pip install tensorboard")):
        with pytest.raises(train.WorkerError, match=pip):
            train.reporting({"report_to": tracker, "output_dir": str(tmp_path / "out")}, tmp_path)
    assert not (tmp_path / "trackers.json").exists()

"""TensorBoard event files written by core.tb_events / core.export, read back by TensorBoard's own reader
(its EventAccumulator checks every record's CRC and parses the Event protobuf)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gaudi_gui.core import export, tb_events
from gaudi_gui.core.runstore import Run

event_accumulator = pytest.importorskip("tensorboard.backend.event_processing.event_accumulator")


def _read(folder: Path) -> Any:
    acc = event_accumulator.EventAccumulator(str(folder), size_guidance={event_accumulator.SCALARS: 0})
    acc.Reload()
    return acc


def test_crc32c_known_values() -> None:
    # RFC 3720's test vector and the empty string.
    assert tb_events.crc32c(b"123456789") == 0xE3069283
    assert tb_events.crc32c(b"") == 0
    assert tb_events.crc32c(bytes(32)) == 0x8A9136AA


def test_scalars_read_back_by_tensorboard(tmp_path: Path) -> None:
    tmp_path = tmp_path / "tb"
    writer = tb_events.EventFileWriter(tmp_path, start_time=1_700_000_000.0)
    for step in range(5):
        writer.add_scalars(step, 1_700_000_000.0 + step, [("train/loss", 2.0 - step / 10),
                                                           ("meter/power_w/module 2", 100 + step),
                                                           ("skipped", float("nan"))])
    writer.add_scalars(1 << 40, 1_700_000_100.0, [("big/step", -3.5)])
    path = writer.close()
    assert "tfevents" in path.name and path.name.endswith(".gaudi-gui")
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temporary file left
    acc = _read(tmp_path)
    assert set(acc.Tags()["scalars"]) == {"train/loss", "meter/power_w/module 2", "big/step"}
    loss = acc.Scalars("train/loss")
    assert [e.step for e in loss] == [0, 1, 2, 3, 4]
    assert [e.value for e in loss] == pytest.approx([2.0, 1.9, 1.8, 1.7, 1.6])
    assert [e.wall_time for e in loss] == [1_700_000_000.0 + s for s in range(5)]
    (big,) = acc.Scalars("big/step")
    assert big.step == 1 << 40 and big.value == -3.5


def _fake_run(folder: Path) -> Run:
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    t0 = 1_700_000_000.0
    events = [{"type": "training_started", "rank": 0, "time": t0, "max_steps": 4}]
    for step in range(1, 5):
        events.append({"type": "metrics", "rank": 0, "time": t0 + step, "step": step, "max_steps": 4,
                       "loss": 3.0 - step / 4, "learning_rate": 1e-3, "grad_norm": 1.5, "throughput": 2.0,
                       "samples_per_second": 4.0, "tokens_per_second": 512.0,
                       "memory_peak_mib": 100.0 + step})
    events.append({"type": "metrics", "rank": 0, "time": t0 + 4.5, "step": 4, "eval_loss": 2.0,
                   "eval_perplexity": 7.389})
    (folder / "events.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    (folder / "status.json").write_text(json.dumps({"state": "finished", "started_at": t0}))
    lines = []
    for i in range(6):  # 2 cards at 100 and 200 W, one reading missing; the last line cut
        cards = [{"name": "module 2", "power_w": 100.0, "utilization": 50.0, "memory_used_mib": 512.0,
                  "temperature_c": 40.0},
                 {"name": "module 3", "power_w": None if i == 3 else 200.0, "utilization": 60.0}]
        lines.append(json.dumps({"t": t0 + i, "source": "hl-smi", "cards": cards}))
        if i % 2:  # the throttle reasons are read less often (hl-smi -q)
            lines.append(json.dumps({"t": t0 + i + 0.5, "source": "hl-smi -q",
                                     "throttle": {"module 2": [], "module 3": ["power"] if i >= 3 else []}}))
    (folder / "meter.jsonl").write_text("\n".join(lines) + '\n{"t": 17000')
    (folder / "meter-summary.json").write_text(json.dumps({"cards": [2, 3]}))
    return Run(folder)


def test_export_run_metrics_and_meter(tmp_path: Path) -> None:
    run = _fake_run(tmp_path / "run-a")
    result = export.export_tensorboard(run, tmp_path / "tb")
    assert result.folder == tmp_path / "tb" / "run-a" and result.missing == []
    acc = _read(result.folder)
    tags = set(acc.Tags()["scalars"])
    assert {"train/loss", "train/learning_rate", "train/grad_norm", "train/steps_per_s",
            "train/samples_per_s", "train/tokens_per_s", "train/memory_peak_mib", "eval/loss",
            "eval/perplexity",
            "meter/power_w/module 2", "meter/utilization/module 3", "meter/memory_used_mib/module 2",
            "meter/temperature_c/module 2", "meter/throttled/module 3", "meter/power_w", "meter/energy_wh",
            "meter/card_hours"} <= tags
    assert [e.value for e in acc.Scalars("train/loss")] == pytest.approx([2.75, 2.5, 2.25, 2.0])
    assert [e.step for e in acc.Scalars("eval/loss")] == [4]
    # The meter's series by seconds since it started; the total power only where every card read one.
    assert [e.step for e in acc.Scalars("meter/power_w")] == [0, 1, 2, 4, 5]
    assert [e.value for e in acc.Scalars("meter/throttled/module 3")] == [0, 1, 1]
    energy = acc.Scalars("meter/energy_wh")
    # module 2: 100 W x 5 s; module 3: 200 W x 5 s (the missing reading bridged, never 0 W).
    assert energy[-1].value == pytest.approx((500 + 1000) / 3600, rel=1e-5)
    assert acc.Scalars("meter/card_hours")[-1].value == pytest.approx(2 * 5 / 3600, rel=1e-5)

    # Exported again: the earlier file is replaced, not shown twice.
    again = export.export_tensorboard(run, tmp_path / "tb")
    assert [p.name for p in again.folder.iterdir()] == [again.file.name]
    assert len(_read(again.folder).Scalars("train/loss")) == 4


def test_export_says_what_is_missing_and_refuses_an_empty_run(tmp_path: Path) -> None:
    run = _fake_run(tmp_path / "run-b")
    (run.folder / "meter.jsonl").unlink()
    result = export.export_tensorboard(run, tmp_path / "tb")
    assert result.missing == ["meter samples (no meter.jsonl: an older run, or nothing could be sampled)"]
    assert "not there to export" in export.describe(result)
    (run.folder / "events.jsonl").unlink()
    with pytest.raises(export.ExportError, match="no metrics and no meter samples"):
        export.export_tensorboard(run, tmp_path / "tb")


def test_trackio_missing_is_said_with_its_pip_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Where trackio cannot be found: trackio_state says why, export_trackio refuses before starting a
    child, and `runs export --trackio` says so with the pip line (exit 2) and writes nothing."""
    from gaudi_gui.commands import runs
    monkeypatch.setattr(export.importlib.util, "find_spec", lambda name: None)
    assert export.trackio_state().startswith("trackio is not installed here: pip install trackio")
    run = _fake_run(tmp_path / "run-t")
    with pytest.raises(export.ExportError, match="pip install trackio"):
        export.export_trackio(run, tmp_path / "tio")
    assert runs._export(run, "", trackio=True, trackio_dir=str(tmp_path / "tio")) == 2
    assert "trackio is not installed here: pip install trackio" in capsys.readouterr().err
    assert not (tmp_path / "tio").exists()


def test_trackio_project_names_and_default_folder() -> None:
    assert export.trackio_project_problem("gaudi-gui_2") is None
    assert "may not be empty" in (export.trackio_project_problem(" ") or "")
    assert "letters, digits" in (export.trackio_project_problem("a.b") or "")
    assert export.default_trackio_dir({"TRACKIO_DIR": "/x/t", "HF_HOME": "/h"}) == Path("/x/t")
    assert export.default_trackio_dir({"HF_HOME": "/h"}) == Path("/h/trackio")
    assert export.default_trackio_dir({"XDG_CACHE_HOME": "/c"}) == Path("/c/huggingface/trackio")
    assert export.trackio_run_id("run-a") == export.trackio_run_id("run-a") != export.trackio_run_id("run-b")


def test_runs_export_command(tmp_path: Path) -> None:
    """`runs export RUN --tensorboard DIR`: the TensorBoard files written; no destination at all: exit 2
    naming the flags."""
    import subprocess
    import sys
    (tmp_path / "runs").mkdir()
    run = _fake_run(tmp_path / "runs" / "run-c")
    base = [sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(tmp_path / "runs"), "export",
            run.name]
    res = subprocess.run([*base, "--tensorboard", str(tmp_path / "tb")], capture_output=True,
                         text=True, timeout=60)
    assert res.returncode == 0 and "exported" in res.stdout, res.stderr
    assert len(_read(tmp_path / "tb" / "run-c").Scalars("train/loss")) == 4
    res = subprocess.run(base, capture_output=True, text=True, timeout=60)
    assert res.returncode == 2 and "--tensorboard DIR" in res.stderr


def test_a_long_meter_is_written_in_buckets() -> None:
    """More samples than METER_POINTS: buckets of consecutive samples, the mean of what a sample
    measures, the last of what accumulates, the most of a flag, stamped with the bucket's last time."""
    rows = [(float(t), [("meter/power_w", float(t % 2) * 100), ("meter/energy_wh", float(t)),
                        ("meter/throttled/module 3", 1.0 if t == 5 else 0.0)]) for t in range(10)]
    assert export.thin(rows, limit=10) == rows
    out = export.thin(rows, limit=4)  # buckets of 3: [0,1,2] [3,4,5] [6,7,8] [9]
    assert [t for t, _ in out] == [2.0, 5.0, 8.0, 9.0]
    first, second = dict(out[0][1]), dict(out[1][1])
    assert first["meter/power_w"] == pytest.approx(100 / 3) and first["meter/energy_wh"] == 2.0
    assert second["meter/throttled/module 3"] == 1.0 and dict(out[2][1])["meter/throttled/module 3"] == 0.0

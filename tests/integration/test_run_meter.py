"""The run meter end to end: a real `gaudi-gui train` of the demo model, supervised as every run is.

With the fake hl-smi on PATH and ``--device hpu --cards 2,3`` (on this CPU machine the Trainer runs on
the CPU, but the launch is a Gaudi launch: HABANA_VISIBLE_MODULES=2,3 and the bridge's metrics file),
the meter samples modules 2 and 3 only, integrates their recorded power and ends its hl-smi with the
run. Without hl-smi and without a readable RAPL counter a CPU run's energy is "not measured", not 0.
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import psutil
import pytest

from gaudi_gui.core import meter
from gaudi_gui.core.jobconfig import JobConfig


def _train(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    job = JobConfig(training_args={"output_dir": str(tmp_path / "out"), "max_steps": 3,
                                   "per_device_train_batch_size": 2, "logging_steps": 1})
    job.save(tmp_path / "job.json")
    res = subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config", str(tmp_path / "job.json"),
                          "--runs-dir", str(tmp_path / "runs"), *extra],
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    (run,) = list((tmp_path / "runs").iterdir())
    return res, run


def _hl_smi_children(tmp_path: Path) -> list[psutil.Process]:
    """Fake hl-smi processes started with this test's PATH (other tests may run their own)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        try:
            if any("fake_hl_smi" in part for part in proc.info["cmdline"] or []) \
                    and str(tmp_path) in proc.environ().get("PATH", ""):
                found.append(proc)
        except psutil.Error:
            continue
    return found


def _trapezoid(samples: list[dict[str, Any]], module: int) -> float:
    points = [(s["t"], c["power_w"]) for s in samples for c in s["cards"] if c["module_id"] == module]
    return sum((w0 + w1) / 2 * (t1 - t0) for (t0, w0), (t1, w1) in itertools.pairwise(points))


@pytest.mark.usefixtures("demo_model")
def test_gaudi_run_meters_its_own_cards_and_leaves_no_hl_smi(tmp_path: Path, fake_hl_smi: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    # Module 3 in power slowdown, module 5 (not the run's) in thermal slowdown; hl-smi -q read often.
    monkeypatch.setenv("FAKE_HLSMI_THROTTLE", "3=power,5=thermal")
    monkeypatch.setenv("GAUDI_GUI_METER_THROTTLE_S", "0.5")
    res, run = _train(tmp_path, "--device", "hpu", "--cards", "2,3", "--no-preflight")
    lines = [json.loads(line) for line in (run / meter.METER_NAME).read_text().splitlines()]
    samples = [s for s in lines if "cards" in s]
    reads = [s["throttle"] for s in lines if "throttle" in s]
    assert reads and all(r == {"module 2": [], "module 3": ["power"]} for r in reads)
    assert len(samples) >= 5, samples  # FAKE_HLSMI_PERIOD=0.1 over a run of several seconds
    modules = {c["module_id"] for s in samples for c in s["cards"]}
    assert modules == {2, 3}  # the fake server has 8 cards: the others are not the run's
    assert all(len(s["cards"]) == 2 for s in samples)
    # The recorded HL-205 server: module 2 is index 0 (102 W), module 3 index 2 (103 W).
    assert {c["module_id"]: c["power_w"] for c in samples[0]["cards"]} == {2: 102.0, 3: 103.0}

    summary = json.loads((run / meter.SUMMARY_NAME).read_text())
    assert summary["energy_source"] == "hl-smi power integrated"
    expected = _trapezoid(samples, 2) + _trapezoid(samples, 3)
    assert expected > 0
    assert summary["energy_j"] == pytest.approx(expected, rel=1e-3)
    assert summary["energy_kwh"] == pytest.approx(expected / 3.6e6, rel=1e-3)
    assert summary["power_mean_w"] == pytest.approx(205.0) and summary["power_peak_w"] == 205.0
    assert summary["cards"] == [2, 3]
    assert summary["card_hours"] == pytest.approx(2 * summary["wall_s"] / 3600, rel=1e-3)
    assert summary["memory_used_peak_mib"] == 512.0 and summary["memory_total_mib"] == 32768.0
    assert summary["missing_power_readings"] == 0 and summary["gaps"] == 0
    assert "meter: modules 2 and 3" in res.stderr + res.stdout
    # The pace after warm-up, kept in the summary for the Runs list and Compare.
    assert summary["rates"]["steady"] and summary["rates"]["steps_per_s"] > 0
    assert summary["rates"]["tokens_per_s"] > 0
    throttle = summary["throttle"]
    assert throttle["worst_card"] == "module 3" and throttle["per_card"]["module 2"]["throttled_s"] == 0
    assert 0 < throttle["throttled_s"] <= summary["wall_s"]

    # The meter's hl-smi ended with the run: nothing of it is left (the supervisor has exited).
    assert _hl_smi_children(tmp_path) == []

    # The launch asked the bridge for its compile meter in the run's own folder (Gaudi only).
    recorded = json.loads((run / "env.json").read_text())["set_by_gaudi_gui"]
    assert recorded["PT_HPU_METRICS_FILE"] == str(run / "hpu-metrics" / "metrics.json")
    assert recorded["PT_HPU_METRICS_FILE_FORMAT"] == "json"
    assert recorded["PT_HPU_METRICS_DUMP_TRIGGERS"] == "metric_change"

    # The ranks' throughput beside steps/s; no device memory on the CPU, said once.
    events = [json.loads(line) for line in (run / "events.jsonl").read_text().splitlines()]
    steps = [e for e in events if e["type"] == "metrics" and not e.get("summary")]
    assert steps and all(e["samples_per_second"] > 0 and e["tokens_per_second"] > 0 for e in steps)
    log = (run / "log.txt").read_text()
    assert log.count("device memory: not measured on cpu") == 1

    shown = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(tmp_path / "runs"),
                            "show", run.name, "--json"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["meter"]["energy_j"] == summary["energy_j"]
    text = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(tmp_path / "runs"),
                           "show", run.name], capture_output=True, text=True, timeout=60).stdout
    assert "meter: modules 2 and 3" in text and "hl-smi power integrated" in text
    assert "module 3 power" in text and "% of the run)" in text

    # runs export: the real run's metrics and meter, read back by TensorBoard's own reader.
    exported = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir",
                               str(tmp_path / "runs"), "export", run.name,
                               "--tensorboard", str(tmp_path / "tb")],
                              capture_output=True, text=True, timeout=60)
    assert exported.returncode == 0, exported.stderr
    assert f"tensorboard --logdir {tmp_path / 'tb'}" in exported.stdout
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
    acc = EventAccumulator(str(tmp_path / "tb" / run.name), size_guidance={SCALARS: 0})
    acc.Reload()
    assert [e.step for e in acc.Scalars("train/loss")] == [e["step"] for e in steps]
    assert [e.value for e in acc.Scalars("meter/power_w/module 2")] == [102.0] * len(samples)
    assert acc.Scalars("meter/energy_wh")[-1].value == pytest.approx(summary["energy_j"] / 3600, rel=1e-4)
    tags = set(acc.Tags()["scalars"])
    assert {"train/tokens_per_s", "meter/utilization/module 3", "meter/card_hours"} <= tags
    assert {e.value for e in acc.Scalars("meter/throttled/module 3")} == {1.0}


@pytest.mark.usefixtures("demo_model")
def test_cpu_run_without_rapl_is_not_measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    empty = tmp_path / "no-powercap"
    empty.mkdir()
    monkeypatch.setenv("GAUDI_GUI_RAPL_ROOT", str(empty))
    _res, run = _train(tmp_path, "--device", "cpu")
    summary = json.loads((run / meter.SUMMARY_NAME).read_text())
    assert summary["energy_source"] == "not measured"
    assert summary["energy_j"] is None and summary["energy_kwh"] is None
    assert summary["card_hours"] is None and summary["wall_s"] > 0
    assert "no readable RAPL counter" in summary["note"]
    assert (run / "env.json").read_text().count("PT_HPU_METRICS") == 0  # not a Gaudi launch
    text = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(tmp_path / "runs"),
                           "show", run.name], capture_output=True, text=True, timeout=60).stdout
    assert "energy not measured" in text and " 0 J" not in text


@pytest.mark.usefixtures("demo_model")
def test_cpu_run_reports_what_this_machine_offers(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The real powercap of this machine: RAPL when it is readable here, "not measured" otherwise."""
    monkeypatch.delenv("GAUDI_GUI_RAPL_ROOT", raising=False)
    readable = bool(meter.rapl_zones())
    _res, run = _train(tmp_path, "--device", "cpu")
    summary = json.loads((run / meter.SUMMARY_NAME).read_text())
    if readable:
        assert summary["energy_source"] == "rapl" and summary["energy_j"] is not None
    else:
        assert summary["energy_source"] == "not measured" and summary["energy_j"] is None

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

from gaudi_gui.core import meter, meter_account, meter_counters, meter_files, meter_words
from gaudi_gui.core.jobconfig import JobConfig


def _train(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess[str], Path]:
    job = JobConfig(training_args={"output_dir": str(tmp_path / "out"), "max_steps": 3,
                                   "per_device_train_batch_size": 2, "logging_steps": 1})
    job.save(tmp_path / "job.json")
    res = subprocess.run([sys.executable, "-m", "gaudi_gui", "train", "--config", str(tmp_path / "job.json"),
                          "--runs-dir", str(tmp_path / "runs"), "--no-agent", *extra],
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
    lines = [json.loads(line) for line in (run / meter_files.METER_NAME).read_text().splitlines()]
    samples = [s for s in lines if "cards" in s]
    reads = [s["throttle"] for s in lines if "throttle" in s]
    assert reads and all(r == {"module 2": [], "module 3": ["power"]} for r in reads)
    assert len(samples) >= 5, samples  # FAKE_HLSMI_PERIOD=0.1 over a run of several seconds
    modules = {c["module_id"] for s in samples for c in s["cards"]}
    assert modules == {2, 3}  # the fake server has 8 cards: the others are not the run's
    assert all(len(s["cards"]) == 2 for s in samples)
    # The recorded HL-205 server: module 2 is index 0 (102 W), module 3 index 2 (103 W).
    assert {c["module_id"]: c["power_w"] for c in samples[0]["cards"]} == {2: 102.0, 3: 103.0}

    summary = json.loads((run / meter_files.SUMMARY_NAME).read_text())
    assert summary["energy_source"] == "hl-smi power integrated"
    assert summary["samples_from"] == "own hl-smi loop (GAUDI_GUI_NO_AGENT=1)"  # in-process: --no-agent
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
    summary = json.loads((run / meter_files.SUMMARY_NAME).read_text())
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
    readable = bool(meter_counters.rapl_zones())
    _res, run = _train(tmp_path, "--device", "cpu")
    summary = json.loads((run / meter_files.SUMMARY_NAME).read_text())
    if readable:
        assert summary["energy_source"] == "rapl" and summary["energy_j"] is not None
    else:
        assert summary["energy_source"] == "not measured" and summary["energy_j"] is None


def _run_with_failing_hl_smi(tmp_path: Path, works: int, restarts: int) -> tuple[Path, dict[str, Any]]:
    """A run's meter (the supervisor's own ``Meter``, its real hl-smi child) with an hl-smi that
    answers ``works`` snapshots and then fails on every restart (a driver that went away), until it
    was restarted ``restarts`` times: the field's 30 s run whose hl-smi worked 2 s (1 s snapshots,
    restarts 5 s apart: 6 restarts) at a tenth of its scale (0.1 s snapshots, restarts 0.5 s apart)."""
    from tests.helpers import wait_until
    folder = tmp_path / "runs" / "run-metered"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    env = {**os_environ(), "HABANA_VISIBLE_MODULES": "2,3", "FAKE_HLSMI_MODE": f"once_then_fail:{works}",
           "FAKE_HLSMI_STATE": str(tmp_path / "driver-gone"), "GAUDI_GUI_METER_RESTART_S": "0.5"}
    m = meter.Meter(folder, device="hpu", env=env)
    started = m.clock()
    m.start()
    try:
        assert wait_until(lambda: m.restarts >= restarts, timeout=120), m.summary()
    finally:
        summary = m.stop()
    (folder / "status.json").write_text(json.dumps({"state": "finished", "summary": "Finished",
                                                    "started_at": started}))
    assert _hl_smi_children(tmp_path) == []
    return folder, summary


def os_environ() -> dict[str, str]:
    import os
    return dict(os.environ)


def _cli(tmp_path: Path, *args: str) -> str:
    res = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(tmp_path / "runs"),
                          *args], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    return res.stdout


def _tensorboard_coverage(tmp_path: Path, run: Path) -> tuple[list[float], str]:
    said = _cli(tmp_path, "export", run.name, "--tensorboard", str(tmp_path / "tb"))
    from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator
    acc = EventAccumulator(str(tmp_path / "tb" / run.name), size_guidance={SCALARS: 0})
    acc.Reload()
    return [e.value for e in acc.Scalars("meter/energy_coverage")], said


def test_an_hl_smi_that_fails_after_2_s_of_30_is_not_the_runs_energy(tmp_path: Path,
                                                                     fake_hl_smi: Path) -> None:
    """Issue 37 item 4: the field's run said "453 J (hl-smi power integrated)" for ~6.8 kJ, its only
    hint "hl-smi restarted 6 times". Readings over under a tenth of the run are "not measured"."""
    run, summary = _run_with_failing_hl_smi(tmp_path, works=3, restarts=6)
    samples = [s for s in map(json.loads,
                              (run / meter_files.METER_NAME).read_text().splitlines()) if "cards" in s]
    read = _trapezoid(samples, 2) + _trapezoid(samples, 3)
    assert read > 0, samples  # hl-smi did answer, for its first 0.2 s
    assert summary["energy_j"] is None and summary["energy_kwh"] is None
    assert summary["energy_status"] == meter_account.NOT_MEASURED
    assert summary["energy_read_j"] == pytest.approx(read, rel=1e-3)
    assert 0 < summary["energy_coverage"] < meter_account.PARTIAL_SHARE, summary
    assert "restarted 6 time(s)" in summary["note"] and "power read over" in summary["note"]

    shown = _cli(tmp_path, "show", run.name)
    assert "energy not measured" in shown and "power read over" in shown, shown
    assert f"{summary['energy_read_j']:.4g} J" not in shown  # no bare figure said as the run's
    assert "energy not measured" in _cli(tmp_path, "list")
    coverage, said = _tensorboard_coverage(tmp_path, run)
    assert coverage[-1] == pytest.approx(summary["energy_coverage"], abs=1e-4)
    assert "not the run's" in said and "energy not measured" in said


def test_an_hl_smi_that_fails_half_way_gives_a_partial_energy_with_its_share(tmp_path: Path,
                                                                            fake_hl_smi: Path) -> None:
    run, summary = _run_with_failing_hl_smi(tmp_path, works=20, restarts=2)
    assert summary["energy_j"] is None and summary["energy_status"] == meter_account.PARTIAL
    share = summary["energy_coverage"]
    assert meter_account.PARTIAL_SHARE <= share < meter_account.MEASURED_SHARE, summary
    partial = (f"energy partial: {meter_words.joules_text(summary['energy_read_j'])} over "
               f"{meter_account.share_text(share)} of the run")
    shown = _cli(tmp_path, "show", run.name)
    assert partial in shown and "J (" not in shown.split("energy partial")[0], shown
    assert f"partial: {meter_words.figure(summary['energy_read_j'] / 3.6e6)} kWh" in _cli(tmp_path, "list")
    assert partial in meter_words.outcome_words(summary)  # Serve's and Evaluate's stopped line
    assert json.loads(_cli(tmp_path, "show", run.name, "--json"))["meter"]["energy_j"] is None
    coverage, said = _tensorboard_coverage(tmp_path, run)
    assert coverage[-1] == pytest.approx(share, abs=1e-4) and max(coverage) > share
    assert "energy partial" in said

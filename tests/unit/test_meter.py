"""The run meter's arithmetic (core/meter.py): trapezoids, gaps, missing and negative readings,
card-hours, "not measured" never 0, the run's own cards only, and the RAPL counter (with its wrap)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from gaudi_gui.core import meter, meter_account, meter_counters, meter_files, meter_words
from gaudi_gui.core.devices import DeviceSample


def test_trapezoid_of_a_known_curve_is_exact_for_a_line() -> None:
    # P(t) = 100 + 10 t over 20 s, read every 0.5 s: the integral is 100*20 + 5*20^2 = 4000 J.
    power = meter_account.PowerIntegrator()
    for i in range(41):
        t = 0.5 * i
        power.add(1000.0 + t, 100 + 10 * t)
    assert power.energy_j == pytest.approx(4000.0, rel=1e-12)
    assert power.covered_s == pytest.approx(20.0)
    assert power.mean_w == pytest.approx(200.0)
    assert power.peak_w == 300.0 and power.gaps == 0 and power.missing == 0


def test_trapezoid_of_a_curve_within_one_percent() -> None:
    # A curve the trapezoid does not hit exactly: 200 + 50 sin(t/3) over 60 s at 1 Hz.
    import math
    power = meter_account.PowerIntegrator()
    for t in range(61):
        power.add(float(t), 200 + 50 * math.sin(t / 3))
    exact = 200 * 60 + 150 * (1 - math.cos(20))
    assert power.energy_j == pytest.approx(exact, rel=0.01)


def test_a_gap_longer_than_ten_seconds_holds_the_last_reading_and_is_counted() -> None:
    power = meter_account.PowerIntegrator()
    power.add(0.0, 100)
    power.add(1.0, 100)
    power.add(16.0, 300)  # 15 s without a reading: 100 W held, not a ramp up to 300 W
    assert power.energy_j == pytest.approx(100 + 100 * 15)
    assert power.gaps == 1 and power.gap_seconds == pytest.approx(15.0)
    power.add(17.0, 300)  # back to trapezoids
    assert power.energy_j == pytest.approx(1600 + 300)


def test_missing_and_negative_readings_are_missing_not_zero() -> None:
    power = meter_account.PowerIntegrator()
    for t, w in ((0.0, 100), (1.0, None), (2.0, -5.0), (3.0, float("nan")), (4.0, 100)):
        power.add(t, w)
    # Read as 0 W they would have taken energy away; skipped, the 4 s hold 100 W.
    assert power.missing == 3
    assert power.energy_j == pytest.approx(400.0)
    assert power.readings == 2


def test_only_missing_readings_are_not_measured_never_zero() -> None:
    accounts = meter_account.Accounts()
    for t in range(5):
        accounts.add(float(t), [{"name": "module 2", "power_w": None, "utilization": 40}])
    summary = meter_account.summarize(accounts, source="hl-smi", energy_source=meter_account.SOURCE_HLSMI,
                                      wall_s=5.0,
                              card_count=1, cards=[2], kind="hpu")
    assert summary["energy_j"] is None and summary["energy_kwh"] is None
    assert summary["energy_source"] == meter_account.NOT_MEASURED
    assert summary["missing_power_readings"] == 5
    assert summary["utilization_mean"] == 40
    line = meter_words.describe(summary)
    assert "energy not measured" in line and " 0 J" not in line


def test_summary_card_hours_energy_power_utilization_memory() -> None:
    accounts = meter_account.Accounts()
    for t in range(11):
        accounts.add(100.0 + t, [
            {"name": "module 2", "power_w": 100, "utilization": 10, "memory_used_mib": 1000 + t,
             "memory_total_mib": 98304},
            {"name": "module 3", "power_w": 300 if t == 5 else 200, "utilization": 30,
             "memory_used_mib": 500, "memory_total_mib": 98304}])
    summary = meter_account.summarize(accounts, source="hl-smi", energy_source=meter_account.SOURCE_HLSMI,
                                      wall_s=10.0,
                              card_count=2, cards=[2, 3], kind="hpu")
    assert summary["card_hours"] == pytest.approx(2 * 10 / 3600, abs=1e-6)  # 2 cards x 10 s
    assert summary["energy_status"] == meter_account.MEASURED and summary["energy_coverage"] == 1.0
    # module 2: 100 W x 10 s; module 3: 200 W x 10 s plus the 300 W spike's triangle (100 W x 1 s).
    assert summary["energy_j"] == pytest.approx(1000 + 2000 + 100)
    assert summary["energy_kwh"] == pytest.approx(3100 / 3.6e6)
    assert summary["energy_source"] == "hl-smi power integrated"
    assert summary["power_peak_w"] == 400  # both cards at one moment
    assert summary["power_mean_w"] == pytest.approx(310.0)
    assert summary["utilization_mean"] == pytest.approx(20.0)
    assert summary["memory_used_peak_mib"] == 1010
    assert summary["memory_total_mib"] == 98304
    assert set(summary["per_card"]) == {"module 2", "module 3"}


def test_a_card_without_power_is_named_and_not_counted() -> None:
    accounts = meter_account.Accounts()
    for t in range(3):
        accounts.add(float(t), [{"name": "module 2", "power_w": 100}, {"name": "module 3", "power_w": None}])
    summary = meter_account.summarize(accounts, source="hl-smi", energy_source=meter_account.SOURCE_HLSMI,
                                      wall_s=3.0,
                              card_count=2, cards=[2, 3], kind="hpu")
    # Module 2's 200 J is half the run's cards only: partial, never the run's energy.
    assert summary["energy_j"] is None and summary["energy_read_j"] == pytest.approx(200.0)
    assert summary["energy_status"] == meter_account.PARTIAL
    assert summary["energy_coverage"] == pytest.approx(2 / 6, abs=1e-4)
    assert "module 3" in summary["note"]
    assert summary["power_peak_w"] is None  # never a whole moment: no run total to report


def test_the_meter_keeps_only_the_runs_own_cards(tmp_path: Path) -> None:
    m = meter.Meter(tmp_path, device="hpu", env={"HABANA_VISIBLE_MODULES": "2,3", "PATH": ""})
    m._choose()
    assert m.cards == [2, 3] and m.source == "none"  # no hl-smi on an empty PATH
    samples = [DeviceSample(kind="hpu", index=i, module_id=module, power_w=100.0 + module)
               for i, module in enumerate((2, 6, 3, 7))]
    m.take(0.0, samples)
    m.take(1.0, samples)
    assert set(m.accounts.cards) == {"module 2", "module 3"}
    assert m.accounts.energy()[0] == pytest.approx(102 + 103)


def test_recorded_cards_come_from_env_json(tmp_path: Path) -> None:
    (tmp_path / "env.json").write_text(json.dumps({"cards": {"requested": "4,5", "device": "hpu",
                                                             "applied": True}}))
    m = meter.Meter(tmp_path, device="hpu", env={"PATH": ""})
    m._choose()
    assert m.cards == [4, 5]
    (tmp_path / "env.json").write_text(json.dumps({"cards": {"requested": "4,5", "device": "cpu",
                                                             "applied": False}}))
    assert meter_files.recorded_cards(tmp_path) is None


def test_no_hl_smi_is_not_measured_and_writes_a_summary(tmp_path: Path) -> None:
    m = meter.Meter(tmp_path, device="hpu", env={"HABANA_VISIBLE_MODULES": "0,1", "PATH": ""})
    m.start()
    summary = m.stop()
    assert summary["energy_source"] == meter_account.NOT_MEASURED and summary["energy_j"] is None
    assert "hl-smi not found" in summary["note"]
    assert summary["card_hours"] is not None and summary["card_hours"] >= 0  # 2 cards held, measured or not
    assert meter_files.read_summary(tmp_path) == summary


def _zone(root: Path, name: str, value: int, wrap: int | None = None) -> Path:
    zone = root / name
    zone.mkdir(parents=True, exist_ok=True)
    (zone / "energy_uj").write_text(f"{value}\n")
    if wrap is not None:
        (zone / "max_energy_range_uj").write_text(f"{wrap}\n")
    return zone


def test_rapl_counter_difference_with_its_wrap(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "powercap"
    package = _zone(root, "intel-rapl:0", 999_000_000, wrap=999_999_999)
    _zone(root, "intel-rapl:0:0", 5)  # a subzone (core): inside the package's count, not added
    monkeypatch.setenv("GAUDI_GUI_RAPL_ROOT", str(root))
    now = [1000.0]
    folder = tmp_path / "run"
    folder.mkdir()
    m = meter.Meter(folder, device="cpu", env={}, interval_s=3600, clock=lambda: now[0])
    m.start()
    assert m.energy_source == meter_account.SOURCE_RAPL
    deadline = time.monotonic() + 20
    while not (folder / meter_files.METER_NAME).exists() or not (folder / meter_files.METER_NAME).read_text():
        assert time.monotonic() < deadline, "the first RAPL sample never came"
        time.sleep(0.01)
    (package / "energy_uj").write_text("1000000\n")  # wrapped: 999,000,000 -> 1,000,000
    now[0] = 1010.0
    summary = m.stop()
    assert summary["energy_source"] == "rapl"
    assert summary["energy_j"] == pytest.approx(2.0, abs=1e-6)  # 1,000,000 + 1,000,000 uJ (wrap + 1)
    assert summary["power_mean_w"] == pytest.approx(0.2, abs=1e-6)
    assert summary["card_hours"] is None  # a CPU run holds no cards


def test_unreadable_rapl_is_not_measured(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "powercap"
    zone = root / "intel-rapl:0"
    zone.mkdir(parents=True)
    (zone / "energy_uj").mkdir()  # present but not a readable number
    monkeypatch.setenv("GAUDI_GUI_RAPL_ROOT", str(root))
    assert meter_counters.rapl_zones() == []
    m = meter.Meter(tmp_path, device="cpu", env={})
    m.start()
    summary = m.stop()
    assert summary["energy_source"] == "not measured" and summary["energy_j"] is None
    assert "RAPL" in summary["note"]

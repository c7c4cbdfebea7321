"""What a person reads of the run meter (issue 27): core.meter's words for the Training tab, the Runs
list and ``gaudi-gui runs list`` — an unmeasured energy is "not measured", never 0 — and the ETA from
the steps after warm-up only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gaudi_gui.cli import main
from gaudi_gui.core import meter_account, meter_files, meter_words, meter_work
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, RunStore


def _gaudi_summary(watts: tuple[float, ...] = (100.0, 105.0), seconds: int = 10) -> dict[str, Any]:
    accounts = meter_account.Accounts()
    for k in range(seconds + 1):
        accounts.add(1000.0 + k, [{"name": f"module {2 + i}", "power_w": w, "utilization": 87,
                                   "memory_used_mib": 12595.0} for i, w in enumerate(watts)])
    return meter_account.summarize(accounts, source="hl-smi", energy_source=meter_account.SOURCE_HLSMI,
                                   wall_s=float(seconds),
                           card_count=len(watts), cards=[2 + i for i in range(len(watts))], kind="hpu")


def _unmeasured_summary() -> dict[str, Any]:
    return meter_account.summarize(meter_account.Accounts(), source="none",
                                   energy_source=meter_account.NOT_MEASURED, wall_s=12.0,
                           card_count=None, kind="cpu", note="no readable RAPL counter under /x")


def test_figures_have_two_significant_digits_and_no_exponent() -> None:
    assert [meter_words.figure(x) for x in (0.0113, 12.3, 3.4e-6, 0.25, 1234.5)] == \
        ["0.011", "12", "0.0000034", "0.25", "1234"]
    assert [meter_words.joules_text(j) for j in (4012.0, 850.0, 624_000.0, 7.2e6, 0.5)] == \
        ["4.0 kJ", "850 J", "624 kJ", "2.00 kWh", "0.50 J"]


def test_meter_line_of_a_measured_gaudi_run() -> None:
    summary = _gaudi_summary(seconds=200)
    line = meter_words.meter_line(summary, true_peak_mib=10035.0,
                                  compiled={"compilations": 12, "steady_compilations": 2})
    assert line == ("2 cards · 0.11 card-hours · 41.0 kJ (hl-smi power integrated) · mean 205 W · "
                    "util 87 % · peak device memory 12.3 GiB (true: 9.8 GiB) · "
                    "12 graph compilations (2 after warm-up)")
    assert meter_words.short(summary) == "0.11 card-h · 0.011 kWh"
    assert meter_words.kwh_text(summary) == "0.011 kWh"


def test_unmeasured_energy_is_said_so_never_zero() -> None:
    summary = _unmeasured_summary()
    line = meter_words.meter_line(summary)
    assert line == "CPU · energy not measured (no readable RAPL counter under /x)"
    assert meter_words.short(summary) == "energy not measured"
    assert meter_words.kwh_text(summary) == "not measured"
    # A Gaudi run whose hl-smi gave fewer than two power readings: not measured either, and no mean W.
    accounts = meter_account.Accounts()
    accounts.add(1.0, [{"name": "module 0", "power_w": None, "utilization": 50}])
    broken = meter_account.summarize(accounts, source="hl-smi", energy_source=meter_account.SOURCE_HLSMI,
                                     wall_s=5.0,
                             card_count=1, cards=[0], kind="hpu")
    line = meter_words.meter_line(broken)
    assert "energy not measured (hl-smi power integrated: fewer than two power readings)" in line
    for text in (meter_words.meter_line(summary), line, meter_words.short(summary),
                 meter_words.short(broken)):
        assert " 0 J" not in text and "0.0 kWh" not in text and "0 kWh" not in text and " 0 W" not in text
    assert meter_words.short(None) == "–"


def _records(durations: list[float], *, tokens: int = 100, batch: int = 2) -> list[dict[str, Any]]:
    out, elapsed = [], 0.0
    for step, seconds in enumerate(durations, 1):
        elapsed += seconds
        out.append({"step": step, "elapsed": elapsed, "throughput": step / elapsed,
                    "samples_per_second": batch * step / elapsed, "tokens_seen": tokens * step,
                    "tokens_per_second": tokens * step / elapsed})
    return out


def test_eta_comes_from_steady_state_steps_only() -> None:
    # 100 steps; the first 10 (warm-up: graph compilation) take 30 s each, then 0.5 s a step.
    records = _records([30.0] * 10 + [0.5] * 20)
    rates = meter_work.rates(records, max_steps=100)
    assert rates.steady and rates.warmup_steps == 10 and rates.from_step == 10
    assert rates.steps_per_s == pytest.approx(2.0)
    assert rates.samples_per_s == pytest.approx(4.0) and rates.tokens_per_s == pytest.approx(200.0)
    assert rates.eta_s == pytest.approx(70 * 0.5)  # the average pace would say ~220 s
    assert meter_words.rates_text(rates) == "2 steps/s · 4 samples/s · 200 tokens/s"
    # During warm-up: the worker's averages, and no ETA.
    early = meter_work.rates(records[:5], max_steps=100)
    assert not early.steady and early.eta_s is None and early.steps_per_s == pytest.approx(5 / 150)
    # A resumed launch starting at step 40: its own first steps are its warm-up.
    resumed = [{**r, "step": r["step"] + 40} for r in records]
    assert meter_work.rates(resumed, max_steps=100, start_step=40).from_step == 50
    # A summary record at the last step changes nothing.
    assert meter_work.rates([*records, {"step": 30, "elapsed": 400.0, "summary": True}],
                            max_steps=100) == rates


def _run(store: RunStore, tmp_path: Path, name: str, summary: dict[str, Any] | None) -> Run:
    run = store.create(JobConfig(name=name, training_args={"output_dir": str(tmp_path / name)}))
    run.update_status(state="finished", step=3, max_steps=3, summary="Finished 3 steps")
    if summary is not None:
        (run.folder / meter_files.SUMMARY_NAME).write_text(json.dumps(summary))
    return run


def test_runs_list_has_a_meter_column_and_json(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    store = RunStore(tmp_path / "runs")
    gaudi = _run(store, tmp_path, "gaudi", _gaudi_summary(seconds=200))
    cpu = _run(store, tmp_path, "cpu", _unmeasured_summary())
    older = _run(store, tmp_path, "older", None)
    assert main(["runs", "--runs-dir", str(store.root), "list"]) == 0
    lines = {line.split()[0]: line for line in capsys.readouterr().out.splitlines()}
    assert "0.11 card-h · 0.011 kWh" in lines[gaudi.name]
    assert "energy not measured" in lines[cpu.name]
    assert " 0 J" not in lines[cpu.name] and "kWh" not in lines[cpu.name]
    assert "step 3/3  –" in lines[older.name] and "Finished 3 steps" in lines[older.name]
    # The status summary starts in one column whatever the meter says.
    assert len({line.index("Finished 3 steps") - len(line.split()[0]) for line in lines.values()}) == 1

    assert main(["runs", "--runs-dir", str(store.root), "list", "--json"]) == 0
    items = {item["name"]: item for item in json.loads(capsys.readouterr().out)}
    assert items[gaudi.name]["meter"]["card_hours"] == pytest.approx(0.111111, rel=1e-4)
    assert items[gaudi.name]["meter"]["energy_source"] == "hl-smi power integrated"
    assert items[cpu.name]["meter"]["energy_j"] is None and items[cpu.name]["meter"]["energy_source"] == \
        "not measured"
    assert items[older.name]["meter"] is None

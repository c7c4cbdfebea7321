"""Issue 40, parts 3-4 without torch: the profile's job key, its reader (with the meter's view of the
profiled window) and each rule, which fires on its evidence only."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from gaudi_gui.core import profile
from gaudi_gui.core.jobconfig import JobConfig, JobConfigError
from gaudi_gui.core.profile_rules import card_rule, collective_rule, compile_rule, host_rule, sentences


def _summary(**extra: Any) -> dict[str, Any]:
    """A CPU profile of 3 steps of 100 ms each, nothing remarkable in it."""
    return {"steps": 3, "step_total_ms": 300.0, "host_ms": 290.0, "device_ms": None, "dataloader_ms": 3.0,
            "collective_ms": 0.0, "top_operators": [{"name": "aten::mm", "calls": 9, "self_host_ms": 120.0}],
            **extra}


def test_a_plain_profile_says_nothing() -> None:
    assert sentences(_summary()) == []


def test_compile_rule_fires_on_the_meters_compilations_only() -> None:
    said = compile_rule(_summary(compilations={"count": 3, "seconds": 0.126}))
    assert said is not None and said.startswith("42 % of step time is graph compilation")
    assert "pad_to_multiple_of" in said and "(3 in 3 steps)" in said
    # Every step recompiles, even quickly: still said, by count.
    said = compile_rule(_summary(compilations={"count": 3, "seconds": 0.001}))
    assert said is not None and said.startswith("3 graph compilations in 3 profiled steps")
    assert compile_rule(_summary(compilations={"count": 0, "seconds": 0.0})) is None
    assert compile_rule(_summary(compilations={"count": 1, "seconds": 0.001})) is None
    assert compile_rule(_summary()) is None  # no meter figures (CPU): nothing


def test_host_rule_data_loader_and_idle_card() -> None:
    said = host_rule(_summary(dataloader_ms=120.0))
    assert said is not None and "data loader takes 40 % of step time" in said
    assert "dataloader_num_workers" in said
    said = host_rule(_summary(device_ms=90.0))
    assert said is not None and "busy only 30 % of each step" in said
    assert host_rule(_summary(device_ms=250.0)) is None
    assert host_rule(_summary()) is None


def test_card_rule_throttle_and_a_hot_slow_card() -> None:
    cards: list[dict[str, Any]] = [
        {"name": f"module {i}", "power_w": 400.0, "temperature_c": 60.0, "throttle": []} for i in range(8)]
    assert card_rule(_summary(cards=cards)) is None
    cards[5] = {"name": "module 5", "power_w": 328.0, "temperature_c": 88.0, "throttle": []}
    said = card_rule(_summary(cards=cards))
    assert said is not None and said.startswith("module 5 draws 18 % less power than its neighbours")
    assert "88 °C" in said and "thermal slowdown" in said
    # Less power but not the hottest: no evidence of heat.
    cards[5]["temperature_c"] = 55.0
    assert card_rule(_summary(cards=cards)) is None
    cards[2]["throttle"] = ["Thermal"]
    said = card_rule(_summary(cards=cards))
    assert said is not None and said.startswith("module 2 was throttled during the profiled steps (Thermal)")
    # One card: no neighbours to compare with.
    assert card_rule(_summary(cards=[{"name": "module 0", "power_w": 100.0, "temperature_c": 90.0}])) is None


def test_collective_rule() -> None:
    said = collective_rule(_summary(collective_ms=90.0))
    assert said is not None and said.startswith("all-reduce takes 30 % of the step")
    assert "gradient_accumulation_steps" in said
    assert collective_rule(_summary(collective_ms=30.0)) is None
    assert collective_rule(_summary()) is None


def test_job_key_round_trip_and_refusals() -> None:
    job = JobConfig(training_args={"max_steps": 10})
    assert "profile_steps" not in job.to_dict()  # off: the file stays as it was
    job.profile_steps = 3
    assert JobConfig.from_dict(job.to_dict()).profile_steps == 3
    assert not [p for p in job.validate() if p[0] == "profile_steps"]
    job.training_args["max_steps"] = 4
    (problem,) = [m for f, m in job.validate() if f == "profile_steps"]
    assert "need 5 training steps" in problem and "max_steps is 4" in problem
    for bad in (-1, "3", True, 2.5):
        with pytest.raises(JobConfigError, match="profile_steps"):
            JobConfig.from_dict({"profile_steps": bad})


def _write_run(tmp: Path, t0: float, t1: float) -> Path:
    run = tmp / "run"
    (run / "profile").mkdir(parents=True)
    (run / "profile" / "summary.json").write_text(json.dumps(_summary(t0=t0, t1=t1)))
    (run / "profile" / "rank0.1.pt.trace.json").write_text(json.dumps({"traceEvents": [
        {"name": f"ProfilerStep#{i}", "ph": "X", "ts": i, "dur": 1} for i in (3, 4, 5)]
        + [{"name": "aten::mm", "ph": "X", "ts": 1, "dur": 1}]}))
    return run


def test_read_adds_the_meters_window(tmp_path: Path) -> None:
    import datetime as dt
    t0, t1 = 1_800_000_000.0, 1_800_000_000.3
    run = _write_run(tmp_path, t0, t1)
    # The bridge's running totals: 10 compilations (2 s) before the window, 13 (2.126 s) after it.
    iso = [dt.datetime.fromtimestamp(t).isoformat() for t in (t0 - 1, t0 + 0.1, t1 + 1)]
    metrics = run / "hpu-metrics"
    metrics.mkdir()
    totals = zip(iso, (10, 13, 13), (2000, 2126, 2126), strict=True)
    dumps = [{"metric_name": "graph_compilation", "generated_on": when,
              "statistics": {"TotalNumber": n, "TotalTime": ms}} for when, n, ms in totals]
    (metrics / "metrics-rank0.json").write_text("[" + ",".join(json.dumps(d) for d in dumps))
    meter = [{"t": t0 + 0.1, "source": "hl-smi", "cards": [
        {"name": f"module {i}", "power_w": 328.0 if i == 5 else 400.0, "temperature_c": 88 if i == 5 else 60}
        for i in range(8)]}, {"t": t0 - 60, "cards": [{"name": "module 5", "power_w": 1.0}]}]
    (run / "meter.jsonl").write_text("\n".join(json.dumps(m) for m in meter) + "\n")
    summary = profile.read(run)
    assert summary is not None
    assert summary["compilations"] == {"count": 3, "seconds": 0.126, "source": "hpu-metrics"}
    assert {c["name"]: c["power_w"] for c in summary["cards"]}["module 5"] == 328.0  # the old sample is out
    assert summary["trace"].endswith("rank0.1.pt.trace.json")
    assert profile.profiler_steps(summary["trace"]) == [f"ProfilerStep#{i}" for i in (3, 4, 5)]
    said = sentences(summary)
    assert said[0].startswith("42 % of step time is graph compilation")
    assert said[1].startswith("module 5 draws 18 % less power")
    lines = profile.describe(summary)
    assert lines[0].startswith("profile: 3 step(s)") and "no device activity recorded" in lines[0]
    assert lines[1] == "graph compilations in the profiled steps: 3 (126.0 ms)"
    assert lines[2] == "top operators (self time): aten::mm 120.0 ms ×9"
    assert lines[3:5] == said and lines[-1] == f"trace: {summary['trace']}"


def test_read_of_a_run_without_profile(tmp_path: Path) -> None:
    assert profile.read(tmp_path) is None
    assert profile.trace_files(tmp_path) == []

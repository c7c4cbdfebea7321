"""One job run as several parts (a multi-host run: a supervisor and a meter per host): its meter is the
parts' card-hours and energy summed, a part that measured nothing named and left out, never 0."""

from __future__ import annotations

import pytest

from gaudi_gui.core import meter, meter_account, meter_files, meter_words


def _part(card_hours: float | None, energy_j: float | None, wall: float, *, mean: float | None = None,
          throttled: float | None = None) -> dict:
    out: dict = {"card_hours": card_hours, "energy_j": energy_j, "wall_s": wall, "power_mean_w": mean,
           "energy_source": meter_account.SOURCE_HLSMI if energy_j is not None
           else meter_account.NOT_MEASURED,
           "memory_used_peak_mib": 512.0}
    if throttled is not None:
        out["throttle"] = {"throttled_s": throttled}
    return out


def test_parts_summed() -> None:
    job = meter_account.combine([("a", _part(0.02, 3600.0, 36.0, mean=100.0)),
                                 ("b", _part(0.03, 7200.0, 40.0, mean=180.0, throttled=12.0))])
    assert job["card_hours"] == pytest.approx(0.05) and job["energy_j"] == pytest.approx(10800.0)
    assert job["energy_kwh"] == pytest.approx(0.003) and job["energy_complete"] is True
    assert job["wall_s"] == 40.0 and job["power_mean_w"] == 280.0 and job["throttled_s"] == 12.0
    assert job["energy_source"] == meter_account.SOURCE_HLSMI and job["note"] == ""
    assert [p["name"] for p in job["parts"]] == ["a", "b"]
    assert meter_words.combined_line(job) == ("the whole job (2 parts: a, b) · 0.050 card-hours · 10.8 kJ "
                                              "(hl-smi power integrated) · mean 280 W · 40.0 s · "
                                              "throttled up to 12 s on one card")


def test_an_unmeasured_or_missing_part_is_named_never_zero() -> None:
    job = meter_account.combine([("a", _part(0.02, 3600.0, 36.0)), ("b", _part(0.03, None, 40.0)), ("c",
                                                                                                    None)])
    # Part a's 3.6 kJ is a's only: the job's energy is partial (a's card-hours of the job's, c
    # weighing as the others on average), never said as the whole job's.
    assert job["energy_j"] is None and job["energy_complete"] is False
    assert job["energy_status"] == meter_account.PARTIAL and job["energy_read_j"] == 3600.0
    assert job["energy_coverage"] == pytest.approx(0.02 / 0.075, abs=1e-4)
    assert "energy partial: 3.6 kJ over 27 % of the run" in meter_words.combined_line(job)
    assert job["note"] == "no meter summary from c; energy not measured on b: not in the sum"
    assert job["card_hours"] == pytest.approx(0.05)
    nothing = meter_account.combine([("a", _part(None, None, 5.0)), ("b", _part(None, None, 6.0))])
    assert nothing["energy_j"] is None and nothing["energy_source"] == meter_account.NOT_MEASURED
    assert nothing["card_hours"] is None  # CPU parts hold no cards
    line = meter_words.combined_line(nothing)
    assert "energy not measured" in line and " 0 J" not in line and "card-hours" not in line


def _compiled(total: int, steady: int, ops: dict[str, int]) -> dict:
    return {"rank": 0, "compilations": total, "compile_s": total * 0.9,
            "warmup_compilations": total - steady,
            "steady_compilations": steady, "cpu_fallbacks": sum(ops.values()), "cpu_fallback_ops": ops,
            "fallback_ops_all_ranks": sorted(ops), "ranks": [{"rank": 0}], "truncated": False}


def test_four_nodes_compile_meters_the_slowest_sets_the_pace_and_every_warning_is_named() -> None:
    """A 4-node Slurm job (or 4 hosts): the node that compiled most is the job's figure (every rank waits
    for it at each collective), each node's figures kept; each node's warning named; a node without a
    compile meter (its bridge wrote nothing) named, never 0."""
    rise = {"kind": "compile_rise", "steady_compilations": 40, "from_step": 50,
            "message": "graph compilations keep rising after warm-up: 40 in the 100 steps after step 50"}
    parts = [("n1", {**_part(0.01, 100.0, 10.0), "compile": _compiled(12, 2, {"aten::digamma": 1})}),
             ("n2", {**_part(0.01, 100.0, 10.0), "compile": _compiled(52, 40, {"aten::lgamma": 3}),
                     "compile_warning": rise}),
             ("n3", _part(0.01, 100.0, 10.0)),
             ("n4", {**_part(0.01, 100.0, 10.0), "compile": _compiled(47, 36, {}),
                     "compile_warning": {**rise, "steady_compilations": 36, "part": "n4",
                                         "message": "n4: graph compilations keep rising"}})]
    job = meter_account.combine(parts)
    compiled = job["compile"]
    assert compiled["part"] == "n2" and compiled["compilations"] == 52
    assert compiled["steady_compilations"] == 40
    assert "ranks" not in compiled  # a part's ranks stay in its own summary
    assert compiled["per_part"]["n1"]["compilations"] == 12
    assert set(compiled["per_part"]) == {"n1", "n2", "n4"}
    assert compiled["fallback_ops_all_ranks"] == ["aten::digamma", "aten::lgamma"]
    assert compiled["parts_without"] == ["n3"]
    assert [p.get("compilations") for p in job["parts"]] == [12, 52, None, 47]
    assert [w["part"] for w in job["compile_warnings"]] == ["n2", "n4"]
    assert job["compile_warning"]["message"].startswith("n2: graph compilations keep rising")
    assert job["compile_warnings"][1]["message"] == "n4: graph compilations keep rising"  # named once
    assert meter_words.combined_line(job).endswith("52 graph compilations (40 after warm-up) on n2")
    assert meter_words.compile_text(meter_files.run_compile("/nonexistent", job)) == \
        "52 graph compilations (40 after warm-up)"  # the Runs list's and the Training tab's figure
    from gaudi_gui.core.compile_rise import findings, rise_text
    assert [rise_text(f).split(":")[0] for f in findings(job)] == ["⚠ n2", "⚠ n4"]
    # No part with a compile meter (CPU parts): nothing said of compilations.
    plain = meter_account.combine([("a", _part(0.02, 3600.0, 36.0)), ("b", _part(0.03, 100.0, 40.0))])
    assert "compile" not in plain and "compile_warning" not in plain


def test_another_hosts_part_is_timed_by_its_own_step_events(tmp_path) -> None:
    """Host B of a multi-host run has no rank 0: its folder's steps are its first rank's "step" events
    (workers/train.py). The part's compile meter splits at the first of them, and its meter's watch
    judges the rise by them; without them everything would read as warm-up."""
    import subprocess
    import sys
    from pathlib import Path

    from gaudi_gui.core import hpu_metrics
    from gaudi_gui.core.events import read_events
    folder = tmp_path / "run-b"
    (folder / "hpu-metrics").mkdir(parents=True)
    env = {"PATH": "", "PT_HPU_METRICS_FILE": str(folder / "hpu-metrics" / "metrics.json"),
           "GAUDI_GUI_METER_RISE_WARMUP": "10"}
    writer = Path(__file__).resolve().parents[1] / "fake_hpu_bridge.py"
    m = meter.Meter(folder, device="hpu", env=env)
    m.start()
    subprocess.run([sys.executable, str(writer), str(folder / "events.jsonl"), "60", "--step-event", "step"],
                   check=True, env={**env, "PATH": "/usr/bin:/bin"}, timeout=60)
    events = read_events(folder / "events.jsonl")
    assert hpu_metrics.logged_steps(events)[:2] == [(events[0]["time"], 1), (events[1]["time"], 2)]
    from gaudi_gui.core import supervisor
    said: list[str] = []
    summary = supervisor.stop_meter(m, events, said.append)
    assert summary is not None
    assert summary["compile"]["warmup_compilations"] == 6 and summary["compile"]["steady_compilations"] == 25
    assert summary["compile"]["steady_steps"] == 59
    assert summary["compile_warning"]["from_step"] == 11 and "part" not in summary["compile_warning"]
    assert any(line.startswith("⚠ graph compilations keep rising") for line in said)


def test_runs_follow_ends_with_the_runs_meter(tmp_path) -> None:
    """`runs follow` of an ended run: its last line carries the meter summary the supervisor wrote
    (how the app learns each host's part of a multi-host job)."""
    import json
    import subprocess
    import sys
    folder = tmp_path / "runs" / "run-x"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "status.json").write_text(json.dumps({"state": "finished", "summary": "Finished"}))
    (folder / "events.jsonl").write_text(json.dumps({"type": "finished", "rank": 0, "global_step": 1}) + "\n")
    (folder / "log.txt").write_text("")
    summary = _part(0.02, 3600.0, 36.0)
    (folder / meter_files.SUMMARY_NAME).write_text(json.dumps(summary))
    res = subprocess.run([sys.executable, "-m", "gaudi_gui", "runs", "follow", str(folder)],
                         stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    last = json.loads(res.stdout.strip().splitlines()[-1])
    assert last["t"] == "end" and last["meter"] == summary


def test_runs_show_of_a_running_run_says_its_meter_so_far(tmp_path) -> None:
    import json
    import subprocess
    import sys
    folder = tmp_path / "runs" / "run-live"
    folder.mkdir(parents=True)
    (folder / "config.json").write_text("{}")
    (folder / "status.json").write_text(json.dumps({"state": "running"}))
    cards = [{"name": "module 2", "power_w": 150.0}, {"name": "module 3", "power_w": 250.0}]
    # Read moments ago (a last reading older than the gap would not be "now").
    import time
    now = time.time()
    lines = [json.dumps({"t": now - 18 + t, "source": "hl-smi", "cards": cards}) + "\n"
             for t in (0.0, 9.0, 18.0)]
    (folder / meter_files.METER_NAME).write_text("".join(lines))
    base = [sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(tmp_path / "runs"), "show",
            "run-live"]
    text = subprocess.run(base, capture_output=True, text=True, timeout=60).stdout
    assert "meter so far: ⚡ 400 W now · 2.0 Wh so far · 0.010 card-hours" in text, text
    shown = json.loads(subprocess.run([*base, "--json"], capture_output=True, text=True, timeout=60).stdout)
    assert shown["meter"] is None and shown["meter_so_far"]["energy_j"] == 7200.0

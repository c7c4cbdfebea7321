"""One job run as several parts (a multi-host run: a supervisor and a meter per host): its meter is the
parts' card-hours and energy summed, a part that measured nothing named and left out, never 0."""

from __future__ import annotations

import pytest

from gaudi_gui.core import meter


def _part(card_hours: float | None, energy_j: float | None, wall: float, *, mean: float | None = None,
          throttled: float | None = None) -> dict:
    out: dict = {"card_hours": card_hours, "energy_j": energy_j, "wall_s": wall, "power_mean_w": mean,
           "energy_source": meter.SOURCE_HLSMI if energy_j is not None else meter.NOT_MEASURED,
           "memory_used_peak_mib": 512.0}
    if throttled is not None:
        out["throttle"] = {"throttled_s": throttled}
    return out


def test_parts_summed() -> None:
    job = meter.combine([("a", _part(0.02, 3600.0, 36.0, mean=100.0)),
                         ("b", _part(0.03, 7200.0, 40.0, mean=180.0, throttled=12.0))])
    assert job["card_hours"] == pytest.approx(0.05) and job["energy_j"] == pytest.approx(10800.0)
    assert job["energy_kwh"] == pytest.approx(0.003) and job["energy_complete"] is True
    assert job["wall_s"] == 40.0 and job["power_mean_w"] == 280.0 and job["throttled_s"] == 12.0
    assert job["energy_source"] == meter.SOURCE_HLSMI and job["note"] == ""
    assert [p["name"] for p in job["parts"]] == ["a", "b"]
    assert meter.combined_line(job) == ("the whole job (2 parts: a, b) · 0.050 card-hours · 10.8 kJ "
                                        "(hl-smi power integrated) · mean 280 W · 40.0 s · throttled up to "
                                        "12 s on one card")


def test_an_unmeasured_or_missing_part_is_named_never_zero() -> None:
    job = meter.combine([("a", _part(0.02, 3600.0, 36.0)), ("b", _part(0.03, None, 40.0)), ("c", None)])
    assert job["energy_j"] == 3600.0 and job["energy_complete"] is False
    assert job["note"] == "no meter summary from c; energy not measured on b: not in the sum"
    assert job["card_hours"] == pytest.approx(0.05)
    nothing = meter.combine([("a", _part(None, None, 5.0)), ("b", _part(None, None, 6.0))])
    assert nothing["energy_j"] is None and nothing["energy_source"] == meter.NOT_MEASURED
    assert nothing["card_hours"] is None  # CPU parts hold no cards
    line = meter.combined_line(nothing)
    assert "energy not measured" in line and " 0 J" not in line and "card-hours" not in line


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
    (folder / meter.SUMMARY_NAME).write_text(json.dumps(summary))
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
    lines = [json.dumps({"t": t, "source": "hl-smi", "cards": cards}) + "\n" for t in (0.0, 9.0, 18.0)]
    (folder / meter.METER_NAME).write_text("".join(lines))
    base = [sys.executable, "-m", "gaudi_gui", "runs", "--runs-dir", str(tmp_path / "runs"), "show",
            "run-live"]
    text = subprocess.run(base, capture_output=True, text=True, timeout=60).stdout
    assert "meter so far: ⚡ 400 W now · 2.0 Wh so far · 0.010 card-hours" in text, text
    shown = json.loads(subprocess.run([*base, "--json"], capture_output=True, text=True, timeout=60).stdout)
    assert shown["meter"] is None and shown["meter_so_far"]["energy_j"] == 7200.0

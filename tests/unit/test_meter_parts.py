"""One job run as several parts (a multi-host run: a supervisor and a meter per host): its meter is the
parts' card-hours and energy summed, a part that measured nothing named and left out, never 0."""

from __future__ import annotations

import pytest

from gaudi_gui.core import meter


def _part(card_hours: float | None, energy_j: float | None, wall: float, *, mean: float | None = None,
          throttled: float | None = None) -> dict:
    out = {"card_hours": card_hours, "energy_j": energy_j, "wall_s": wall, "power_mean_w": mean,
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

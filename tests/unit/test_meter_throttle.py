"""Throttle time (issue 27): the seconds each of a run's cards spent with a power / thermal slowdown
active, from hl-smi -q's "Clocks Throttle Reasons" read by the run meter."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from gaudi_gui.core import meter, meter_account, meter_files, meter_words


def test_throttle_clock_counts_each_reads_state_until_the_next() -> None:
    clock = meter_account.ThrottleClock()
    clock.add(0.0, [])
    clock.add(5.0, ["power"])          # 0-5: not throttled
    clock.add(10.0, ["power", "thermal"])  # 5-10: power
    clock.add(15.0, None)              # 10-15: power + thermal; this read could not tell
    clock.add(20.0, [])                # 15-20: unknown: counted for nothing
    clock.close(60.0, cap=5.0)         # the last state holds for at most one interval
    assert clock.seconds == {"power": 10.0, "thermal": 5.0}
    assert clock.any_s == 10.0  # two reasons at once count once
    assert clock.covered_s == 20.0 and clock.polls == 5


def test_throttle_summary_and_words() -> None:
    slow, fine = meter_account.ThrottleClock(), meter_account.ThrottleClock()
    for t in range(0, 25, 5):
        slow.add(float(t), ["power"] if t >= 10 else [])
        fine.add(float(t), [])
    out = meter_account.throttle_summary({"module 2": fine, "module 3": slow}, interval_s=5.0, wall_s=40.0)
    assert out["throttled_s"] == 10.0 and out["worst_card"] == "module 3" and out["fraction"] == 0.25
    assert meter_words.throttle_text(out) == "throttled 10 s (25 % of the run): module 3 power 10 s"
    calm = meter_account.throttle_summary({"module 2": fine}, interval_s=5.0, wall_s=40.0)
    assert meter_words.throttle_text(calm) == "not throttled (hl-smi -q every 5 s)"
    unread = meter_account.throttle_summary({}, interval_s=5.0, wall_s=40.0,
                                            note="hl-smi -q gave no answer in 30 s")
    assert meter_words.throttle_text(unread) == "throttling not measured (hl-smi -q gave no answer in 30 s)"
    assert meter_words.throttle_text(None) == ""
    summary = {"kind": "hpu", "cards": [2, 3], "wall_s": 40.0, "energy_j": None, "throttle": out}
    assert "throttled 10 s (25 % of the run)" in meter_words.describe(summary)
    assert "module 3 power 10 s" in meter_words.meter_line(summary)


def test_throttle_reasons_of_a_query_card() -> None:
    card = {"module id": "3", "clocks throttle reasons/hw slowdown": "Not Active",
            "clocks throttle reasons/thermal slowdown": "Active",
            "clocks throttle reasons/power slowdown": "Not Active"}
    assert meter.throttle_reasons(card) == ["thermal"]
    assert meter.query_card_name(card) == ("module 3", 3)
    assert meter.throttle_reasons({"module id": "3"}) is None  # a release that prints no reasons


@pytest.mark.usefixtures("fake_hl_smi")
def test_meter_reads_throttle_reasons_of_its_own_cards(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """A real Meter over the fake hl-smi: modules 2 and 3 of an 8-card server, module 3 in power
    slowdown and module 5 (not the run's) in thermal slowdown: only module 3's time is counted."""
    monkeypatch.setenv("FAKE_HLSMI_THROTTLE", "3=power,5=thermal")
    folder = tmp_path / "run"
    folder.mkdir()
    env = {**os.environ, "HABANA_VISIBLE_MODULES": "2,3", "GAUDI_GUI_METER_THROTTLE_S": "0.2"}
    m = meter.Meter(folder, device="hpu", env=env)
    m.start()

    def reads() -> list[dict]:
        path = folder / meter_files.METER_NAME
        lines = path.read_text().splitlines() if path.exists() else []
        return [r for r in map(json.loads, lines) if "throttle" in r]

    while len(reads()) < 3:
        time.sleep(0.05)
    summary = m.stop()
    assert all(r["throttle"] == {"module 2": [], "module 3": ["power"]} for r in reads())
    throttle = summary["throttle"]
    assert set(throttle["per_card"]) == {"module 2", "module 3"}
    assert throttle["per_card"]["module 2"]["throttled_s"] == 0
    module3 = throttle["per_card"]["module 3"]
    assert module3["by_reason_s"]["power"] == module3["throttled_s"] > 0
    assert throttle["worst_card"] == "module 3" and throttle["throttled_s"] == module3["throttled_s"]
    assert "module 3 power" in meter_words.describe(summary)
    assert (meter_files.read_summary(folder) or {})["throttle"] == throttle


def test_live_reader_reads_only_new_samples_and_waits_for_a_cut_line(tmp_path: Path) -> None:
    """The Training tab's strip: power now, energy and card-hours so far, from meter.jsonl as it grows;
    a throttle read is not a power sample; a line cut mid-write waits for its end."""
    path = tmp_path / meter_files.METER_NAME
    reader = meter_files.LiveReader(tmp_path)
    assert not reader.read() and reader.text() == ""  # no file yet

    def sample(t: float, watts: list[float | None]) -> str:
        cards = [{"name": f"module {i}", "power_w": w} for i, w in enumerate(watts)]
        return json.dumps({"t": t, "source": "hl-smi", "cards": cards}) + "\n"

    path.write_text(sample(0.0, [100.0, 200.0]) + sample(3600.0, [100.0, 200.0])
                    + json.dumps({"t": 3600.5, "source": "hl-smi -q", "throttle": {"module 0": []}}) + "\n"
                    + sample(7200.0, [100.0, None])[:20])
    assert reader.read()
    assert reader.text() == "⚡ 300 W now · 300 Wh so far · 2.0 card-hours"
    with open(path, "a") as fh:
        fh.write(sample(7200.0, [100.0, None])[20:])
    assert reader.read()
    assert reader.watts is None  # module 1 read nothing: no total 'now'
    assert reader.text().startswith("⚡ power now unknown · 400 Wh so far")  # module 1's hour not counted
    assert not reader.read()  # nothing new


def test_a_query_that_lists_none_of_the_runs_cards_is_given_up(tmp_path: Path, fake_hl_smi: Path) -> None:
    """Modules 8 and 9 are not on the fake server: three reads that find none of them, then the meter
    stops asking and says so (it does not ask every 5 s for the whole run)."""
    folder = tmp_path / "run"
    folder.mkdir()
    env = {**os.environ, "HABANA_VISIBLE_MODULES": "8,9", "GAUDI_GUI_METER_THROTTLE_S": "0.05"}
    m = meter.Meter(folder, device="hpu", env=env)
    m.start()
    assert m._throttle_thread is not None
    m._throttle_thread.join(timeout=60)
    assert not m._throttle_thread.is_alive()
    summary = m.stop()
    assert summary["throttle"]["throttled_s"] is None
    assert "not read after 3 failed reads in a row" in summary["throttle"]["note"]
    assert meter_words.throttle_text(summary["throttle"]).startswith("throttling not measured (")

"""core.alerts without Qt: thresholds with hysteresis over samples and the doctor's findings."""

from __future__ import annotations

from gaudi_gui.core.alerts import (
    CLEARED,
    ECC,
    IDLE_HELD,
    LOWERED,
    RAISED,
    SLOWDOWN,
    TEMPERATURE,
    AlertEngine,
    Thresholds,
    ecc_count,
)
from gaudi_gui.core.devices import DeviceSample, ProcessInfo
from gaudi_gui.core.health import Finding

T = Thresholds(temperature_warning_c=85, temperature_critical_c=95, temperature_margin_c=5,
               slowdown_clear_s=60, idle_held_s=600, idle_utilization=5)


def card(temp: float | None = 40.0, util: float | None = 50.0, module: int = 3,
         held_by: int | None = None) -> DeviceSample:
    s = DeviceSample(kind="hpu", index=module, module_id=module, temperature_c=temp, utilization=util)
    if held_by is not None:
        s.processes = [ProcessInfo(index=module, pid=held_by, name="python")]
    return s


def actions(events: list) -> list[tuple[str, str, str]]:
    return [(e.action, e.alert.kind, e.alert.severity) for e in events]


def test_temperature_raises_at_warning_and_clears_only_below_the_margin() -> None:
    engine = AlertEngine(T)
    assert engine.on_samples("local", [card(84.9)], 0) == []
    raised = engine.on_samples("local", [card(85)], 1)
    assert actions(raised) == [(RAISED, TEMPERATURE, "warning")]
    assert "module 3 is hot: 85 C" in raised[0].alert.text  # the card's one name (its module id)
    # Hovering just under the threshold changes nothing (no clear, no second raise).
    for i, t in enumerate((84, 86, 81, 80.5, 85.5)):
        assert engine.on_samples("local", [card(t)], 2 + i) == []
    assert engine.worst("local") == "warning"
    cleared = engine.on_samples("local", [card(79.9)], 10)
    assert actions(cleared) == [(CLEARED, TEMPERATURE, "warning")]
    assert engine.active == {} and engine.worst("local") == "ok"


def test_temperature_critical_lowers_then_clears() -> None:
    engine = AlertEngine(T)
    assert actions(engine.on_samples("local", [card(96)], 0)) == [(RAISED, TEMPERATURE, "error")]
    assert engine.on_samples("local", [card(92)], 1) == []  # within the margin under critical
    assert actions(engine.on_samples("local", [card(89)], 2)) == [(LOWERED, TEMPERATURE, "warning")]
    assert actions(engine.on_samples("local", [card(95)], 3)) == [(RAISED, TEMPERATURE, "error")]
    assert actions(engine.on_samples("local", [card(70)], 4)) == [(CLEARED, TEMPERATURE, "error")]


def test_unknown_or_zero_temperature_changes_nothing() -> None:
    engine = AlertEngine(T)
    engine.on_samples("local", [card(90)], 0)
    assert engine.on_samples("local", [card(None)], 1) == []
    assert engine.on_samples("local", [card(0)], 2) == []  # failed init is the doctor's finding
    assert engine.worst("local") == "warning"


def test_hosts_and_cards_are_separate() -> None:
    engine = AlertEngine(T)
    engine.on_samples("a", [card(90, module=1), card(40, module=2)], 0)
    engine.on_samples("b", [card(40, module=1)], 0)
    assert [a.card for a in engine.alerts("a")] == ["hpu:m1"] and engine.alerts("b") == []
    assert actions(engine.forget("a")) == [(CLEARED, TEMPERATURE, "warning")]


def ecc(severity: str, seen: str, module: int = 2) -> Finding:
    return Finding("card.ecc", severity, seen, "", module_id=module, index=module)


def test_ecc_rising_raises_each_rise_and_clears_after_a_reset() -> None:
    engine = AlertEngine(T)
    assert engine.on_findings("local", [ecc("ok", "no ECC errors")], 0) == []
    up = engine.on_findings("local", [ecc("warning", "single-bit ECC 1")], 1)
    assert actions(up) == [(RAISED, ECC, "warning")] and "rising to 1" in up[0].alert.text
    assert engine.on_findings("local", [ecc("warning", "single-bit ECC 1")], 2) == []  # not rising
    more = engine.on_findings("local", [ecc("error", "double-bit ECC 2, row replacement pending: Yes")], 3)
    assert actions(more) == [(RAISED, ECC, "error")]
    # Unreadable this time: neither a rise nor a clear.
    assert engine.on_findings("local", [ecc("warning", "ECC / replaced rows could not be read")], 4) == []
    assert actions(engine.on_findings("local", [ecc("ok", "no ECC errors")], 5)) == [(CLEARED, ECC, "error")]
    assert ecc_count(ecc("error", "double-bit ECC 2, row replacement pending: Yes")) == 2


def throttle(active: bool) -> Finding:
    if active:
        return Finding("card.throttle", "warning", "power slowdown active", "check", module_id=5, index=5)
    return Finding("card.throttle", "ok", "no slowdown", module_id=5, index=5)


def test_slowdown_becoming_active_and_clearing_after_it_stays_off() -> None:
    engine = AlertEngine(T)
    assert engine.on_findings("local", [throttle(False)], 0) == []
    assert actions(engine.on_findings("local", [throttle(True)], 10)) == [(RAISED, SLOWDOWN, "warning")]
    assert engine.on_findings("local", [throttle(True)], 20) == []
    assert engine.on_findings("local", [throttle(False)], 30) == []  # off, but not for long yet
    assert engine.on_findings("local", [throttle(True)], 40) == []  # flickered on: still the same alert
    assert engine.on_findings("local", [throttle(False)], 50) == []
    assert engine.on_findings("local", [throttle(False)], 100) == []
    assert actions(engine.on_findings("local", [throttle(False)], 110)) == [(CLEARED, SLOWDOWN, "warning")]
    unreadable = Finding("card.throttle", "warning", "throttle reasons could not be read", module_id=5)
    assert engine.on_findings("local", [unreadable], 120) == []


def test_idle_but_held_after_the_set_time() -> None:
    engine = AlertEngine(T)
    assert engine.on_samples("local", [card(util=0, held_by=42)], 0) == []
    assert engine.on_samples("local", [card(util=1, held_by=42)], 599) == []
    late = engine.on_samples("local", [card(util=0, held_by=42)], 600)
    assert actions(late) == [(RAISED, IDLE_HELD, "warning")]
    assert "pid 42" in late[0].alert.text and "idle for 10 min" in late[0].alert.text
    assert engine.on_samples("local", [card(util=0, held_by=42)], 900) == []  # raised once
    assert engine.on_samples("local", [card(util=None, held_by=42)], 950) == []  # unknown: no change
    assert actions(engine.on_samples("local", [card(util=60, held_by=42)], 1000)) == [
        (CLEARED, IDLE_HELD, "warning")]


def test_idle_timer_restarts_when_busy_or_released_and_counts_doctor_holders() -> None:
    engine = AlertEngine(T)
    engine.on_samples("local", [card(util=0, held_by=42)], 0)
    engine.on_samples("local", [card(util=30, held_by=42)], 300)  # busy: the timer starts again
    assert engine.on_samples("local", [card(util=0, held_by=42)], 700) == []
    engine.on_samples("local", [card(util=0)], 800)  # released
    assert engine.on_samples("local", [card(util=0)], 2000) == []  # idle and free is fine
    # Held by a process outside this view (the doctor's busy.held), not in hl-smi's list.
    engine.on_samples("local", [card(util=0)], 3000, held={"hpu:m3"})
    assert actions(engine.on_samples("local", [card(util=0)], 3600, held={"hpu:m3"})) == [
        (RAISED, IDLE_HELD, "warning")]

"""Alerts: thresholds with hysteresis over device samples and the doctor's findings.

Qt-free and torch-free. ``AlertEngine`` is fed the live samples of a host (1 Hz from hl-smi) and, now
and then, the doctor's findings for it; it answers with the alerts to raise and the alerts to clear.
An alert is raised once when its condition starts and cleared once when it ends, never repeated while
it lasts, so a card hovering around a threshold does not flood the user:

- temperature: raised at ``temperature_warning_c`` (warning) / ``temperature_critical_c`` (error),
  lowered or cleared only once the card is ``temperature_margin_c`` below the threshold it crossed;
  an unknown or 0 C reading changes nothing (0 C is a card that failed to initialise: the doctor's
  ``card.init`` finding says so, not a cool card);
- ECC: raised when a card's ECC count (single + double bit, from ``card.ecc``) is higher than the last
  count seen (a first sight counts from 0), cleared when the count falls back to 0 (a reset);
- slowdown: raised when ``card.throttle`` says a slowdown is active, cleared only after it has been
  inactive for ``slowdown_clear_s`` (power slowdown flickers on and off);
- idle but held: a card some process holds while its utilization stays below ``idle_utilization``
  for ``idle_held_s``; cleared when it is busy again or released.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    # Types only: core.health loads importlib.metadata (~0.1 s), and this module is loaded before the
    # window's first paint.
    from gaudi_gui.core.devices import DeviceSample
    from gaudi_gui.core.health import Finding

RAISED = "raised"
#: An alert still in effect at a lower severity (a card cooled from critical to hot).
LOWERED = "lowered"
CLEARED = "cleared"
#: Alert kinds.
TEMPERATURE, ECC, SLOWDOWN, IDLE_HELD = "temperature", "ecc", "slowdown", "idle_held"


@dataclass(frozen=True)
class Thresholds:
    temperature_warning_c: float = 85.0
    temperature_critical_c: float = 95.0
    #: How far below a threshold a card must cool before its alert is lowered or cleared.
    temperature_margin_c: float = 5.0
    #: A slowdown must stay inactive this long before its alert clears.
    slowdown_clear_s: float = 60.0
    #: A held card whose utilization stays below ``idle_utilization`` this long is reported.
    idle_held_s: float = 1800.0
    idle_utilization: float = 5.0


@dataclass(frozen=True)
class Alert:
    """One condition on one card of one host (``card`` is the sample's key, "hpu:m3")."""

    host: str
    card: str
    kind: str
    severity: str  # "warning" | "error"
    text: str

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.host, self.card, self.kind)


@dataclass(frozen=True)
class AlertEvent:
    action: str  # RAISED | LOWERED | CLEARED
    alert: Alert


def card_key(module_id: int | None, index: int | None) -> str:
    """The key a finding's card has among the samples (``DeviceSample.key``)."""
    if module_id is not None:
        return f"hpu:m{module_id}"
    return f"hpu:{index}"


def card_name(key: str) -> str:
    """A sample key's card by ``core.devices.card_name`` (the one naming): 'hpu:m3' -> 'module 3',
    'hpu:2' (no module id) -> 'index 2', 'cuda:1' -> 'GPU 1'."""
    from gaudi_gui.core.devices import card_name as name

    kind, _, rest = key.partition(":")
    if kind == "hpu" and rest.startswith("m") and rest[1:].isdigit():
        return name(int(rest[1:]), None, "hpu")
    number = int(rest) if rest.isdigit() else None
    return name(None, number, kind)


_ECC = re.compile(r"(single|double)-bit ECC (\d+)")


def ecc_count(finding: Finding) -> int | None:
    """Single + double bit ECC errors from a ``card.ecc`` finding (None when it could not be read)."""
    if finding.severity == "ok":
        return 0
    counts = [int(n) for _kind, n in _ECC.findall(finding.seen)]
    return sum(counts) if counts else None


@dataclass
class _Card:
    temp_level: str = ""  # "" | "warning" | "error"
    ecc: int = 0
    slowdown: bool = False
    slowdown_off_since: float | None = None
    idle_since: float | None = None
    idle_alerted: bool = False


@dataclass
class AlertEngine:
    thresholds: Thresholds = field(default_factory=Thresholds)
    #: The alerts in effect, by key.
    active: dict[tuple[str, str, str], Alert] = field(default_factory=dict)
    _cards: dict[tuple[str, str], _Card] = field(default_factory=dict)

    def _card(self, host: str, key: str) -> _Card:
        return self._cards.setdefault((host, key), _Card())

    def _raise(self, out: list[AlertEvent], alert: Alert) -> None:
        old = self.active.get(alert.key)
        if old == alert:
            return
        self.active[alert.key] = alert
        lowered = old is not None and old.severity == "error" and alert.severity != "error"
        out.append(AlertEvent(LOWERED if lowered else RAISED, alert))

    def _clear(self, out: list[AlertEvent], host: str, card: str, kind: str) -> None:
        old = self.active.pop((host, card, kind), None)
        if old is not None:
            out.append(AlertEvent(CLEARED, old))

    def alerts(self, host: str | None = None) -> list[Alert]:
        return [a for a in self.active.values() if host is None or a.host == host]

    def worst(self, host: str) -> str:
        """'error', 'warning' or 'ok' over the host's active alerts."""
        levels = {a.severity for a in self.alerts(host)}
        return "error" if "error" in levels else "warning" if levels else "ok"

    # -- samples ----------------------------------------------------------------------------------

    def on_samples(self, host: str, samples: Sequence[DeviceSample], now: float,
                   held: Iterable[str] = ()) -> list[AlertEvent]:
        """One snapshot of a host's cards. ``held``: keys of cards held by some process besides the
        processes attached to the samples (the doctor's ``busy.held``)."""
        t = self.thresholds
        out: list[AlertEvent] = []
        held_keys = set(held)
        for s in samples:
            if s.kind == "host":
                continue
            state = self._card(host, s.key)
            name = card_name(s.key)
            temp = s.temperature_c
            if temp is not None and temp > 0:
                level = state.temp_level
                if temp >= t.temperature_critical_c:
                    level = "error"
                elif temp >= t.temperature_warning_c:
                    # Down from critical only once cool enough; up from nothing at the threshold.
                    if level != "error" or temp < t.temperature_critical_c - t.temperature_margin_c:
                        level = "warning"
                elif level == "error" and temp < t.temperature_critical_c - t.temperature_margin_c:
                    level = "" if temp < t.temperature_warning_c - t.temperature_margin_c else "warning"
                elif level == "warning" and temp < t.temperature_warning_c - t.temperature_margin_c:
                    level = ""
                if level != state.temp_level:
                    state.temp_level = level
                    if level:
                        limit = t.temperature_critical_c if level == "error" else t.temperature_warning_c
                        word = "critical" if level == "error" else "hot"
                        self._raise(out, Alert(host, s.key, TEMPERATURE, level,
                                               f"{name} is {word}: {temp:.0f} C (threshold {limit:.0f} C)"))
                    else:
                        self._clear(out, host, s.key, TEMPERATURE)
            is_held = bool(s.processes) or s.key in held_keys
            idle = s.utilization is not None and s.utilization < t.idle_utilization
            if is_held and idle:
                if state.idle_since is None:
                    state.idle_since = now
                elif not state.idle_alerted and now - state.idle_since >= t.idle_held_s:
                    state.idle_alerted = True
                    minutes = (now - state.idle_since) / 60
                    who = ", ".join(f"pid {p.pid}" for p in s.processes[:3]) or "a process"
                    self._raise(out, Alert(host, s.key, IDLE_HELD, "warning",
                                           f"{name} is held by {who} but idle for {minutes:.0f} min"))
            elif s.utilization is not None or not is_held:
                state.idle_since = None
                if state.idle_alerted:
                    state.idle_alerted = False
                    self._clear(out, host, s.key, IDLE_HELD)
        return out

    # -- findings ---------------------------------------------------------------------------------

    def on_findings(self, host: str, findings: Sequence[Finding], now: float) -> list[AlertEvent]:
        """The doctor's findings for one host (ECC and slowdown come from its ``hl-smi -q``)."""
        t = self.thresholds
        out: list[AlertEvent] = []
        for f in findings:
            if f.module_id is None and f.index is None:
                continue
            key = card_key(f.module_id, f.index)
            state = self._card(host, key)
            name = card_name(key)
            if f.check == "card.ecc":
                count = ecc_count(f)
                if count is None:
                    continue  # unreadable this time: neither rising nor cleared
                if count > state.ecc:
                    self._raise(out, Alert(host, key, ECC, "error" if f.severity == "error" else "warning",
                                           f"{name}: ECC errors rising to {count} ({f.seen})"))
                elif count == 0:
                    self._clear(out, host, key, ECC)
                state.ecc = count
            elif f.check == "card.throttle":
                active = f.severity != "ok" and "active" in f.seen
                if active:
                    state.slowdown_off_since = None
                    if not state.slowdown:
                        state.slowdown = True
                        self._raise(out, Alert(host, key, SLOWDOWN, "warning", f"{name}: {f.seen}"))
                elif f.severity == "ok" and state.slowdown:
                    if state.slowdown_off_since is None:
                        state.slowdown_off_since = now
                    if now - state.slowdown_off_since >= t.slowdown_clear_s:
                        state.slowdown = False
                        state.slowdown_off_since = None
                        self._clear(out, host, key, SLOWDOWN)
        return out

    def forget(self, host: str) -> list[AlertEvent]:
        """A host removed: clear its alerts."""
        out: list[AlertEvent] = []
        for alert in self.alerts(host):
            self._clear(out, alert.host, alert.card, alert.kind)
        for key in [k for k in self._cards if k[0] == host]:
            del self._cards[key]
        return out

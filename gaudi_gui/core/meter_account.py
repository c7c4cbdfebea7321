"""The run meter's energy accounting: power readings turned into each card's energy, card-hours and
the share of the run they cover, and the summary a run's meter-summary.json holds (``summarize``); the
parts of a job (hosts, Slurm nodes) summed into the job's meter (``combine``); the time each card was
throttled (``ThrottleClock``).

Pure functions of the readings: no thread, no child, no file (``core.meter`` samples, ``core.meter_files``
reads and writes). Energy from power readings is integrated per card with the trapezoid rule; a stretch
longer than ``GAP_S`` between two readings holds the earlier reading (and is counted as a gap); a
missing (N/A), non-finite or negative reading is counted as missing, never as 0 W. A run whose energy
could not be measured says "not measured" with ``energy_j`` None, never 0. Qt-free and torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: Two readings further apart than this: the earlier one is held over the stretch, and it is a gap.
GAP_S = 10.0


#: Seconds between two reads of the cards' clocks throttle reasons (``hl-smi -q``: a whole report of
#: every card, much heavier than the CSV loop); ``GAUDI_GUI_METER_THROTTLE_S`` in the launch's
#: environment overrides it (tests).
THROTTLE_INTERVAL_S = 5.0


#: How much of the run the power readings must cover for the energy to be the run's (the share of the
#: run's card-seconds between each card's first and last good reading, held gaps included):
#: at least MEASURED_SHARE, the figure is the run's energy ("measured"); from PARTIAL_SHARE, it is the
#: energy of that share only ("partial": said with the share, never as the run's total, and not in
#: any sum, price or Wh per 1,000 tokens); below, "not measured". The first reading comes a period
#: after hl-smi starts and the last one up to a period before the run ends, so a short run that
#: misses at most three of its readings' periods (at most EDGE_S) per card is "measured" too,
#: provided half of it is covered.
MEASURED_SHARE = 0.95
PARTIAL_SHARE = 0.10
EDGE_S = 3.0
MEASURED = "measured"
PARTIAL = "partial"
SOURCE_HLSMI = "hl-smi power integrated"
SOURCE_NVIDIA = "nvidia-smi power integrated"
SOURCE_RAPL = "rapl"
NOT_MEASURED = "not measured"


def finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def clean(value: float | None) -> float | None:
    """A finite reading rounded to 3 decimals for the files, else None."""
    v = finite(value)
    return None if v is None else round(v, 3)


@dataclass
class PowerIntegrator:
    """Energy of one card from its power readings: trapezoids between readings at most ``gap_s``
    apart, the earlier reading held over a longer stretch (counted in ``gaps``/``gap_seconds``);
    a missing, non-finite or negative reading is counted in ``missing`` and skipped (the next good
    reading joins the last good one), never read as 0 W."""

    gap_s: float = GAP_S
    energy_j: float = 0.0
    #: Seconds between the first and the last good reading (what the energy covers).
    covered_s: float = 0.0
    readings: int = 0
    missing: int = 0
    gaps: int = 0
    gap_seconds: float = 0.0
    peak_w: float | None = None
    last_t: float | None = None
    last_w: float | None = None

    def add(self, t: float, watts: Any) -> None:
        w = finite(watts)
        if w is None or w < 0:
            self.missing += 1
            return
        if self.last_t is not None and self.last_w is not None:
            dt = t - self.last_t
            if dt <= 0:
                return  # the clock went back, or a repeated stamp: nothing to integrate
            if dt > self.gap_s:
                self.energy_j += self.last_w * dt
                self.gaps += 1
                self.gap_seconds += dt
            else:
                self.energy_j += (self.last_w + w) / 2 * dt
            self.covered_s += dt
        self.readings += 1
        self.peak_w = w if self.peak_w is None else max(self.peak_w, w)
        self.last_t, self.last_w = t, w

    @property
    def measured(self) -> bool:
        """At least two good readings: an energy over a stretch of time (of how much of the run:
        ``covered_s``; see ``coverage``)."""
        return self.covered_s > 0

    @property
    def mean_w(self) -> float | None:
        return self.energy_j / self.covered_s if self.covered_s > 0 else None


@dataclass
class _Stat:
    """Count, sum and maximum of the good values of one quantity."""

    count: int = 0
    total: float = 0.0
    peak: float | None = None

    def add(self, value: Any) -> None:
        v = finite(value)
        if v is None or v < 0:
            return
        self.count += 1
        self.total += v
        self.peak = v if self.peak is None else max(self.peak, v)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


def rounded(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)


@dataclass
class ThrottleClock:
    """How long one card spent throttled, by reason, from reads of its throttle reasons: the state
    read at one poll is taken to hold until the next (so the resolution is the poll interval); a
    read that could not tell (no throttle lines) counts for nothing, neither throttled nor not."""

    seconds: dict[str, float] = field(default_factory=dict)
    #: Seconds throttled for any reason (two reasons at once count once).
    any_s: float = 0.0
    #: Seconds the reads cover.
    covered_s: float = 0.0
    polls: int = 0
    last_t: float | None = None
    last: tuple[str, ...] | None = None

    def add(self, t: float, reasons: Sequence[str] | None) -> None:
        self.close(t)
        self.polls += 1
        self.last_t, self.last = t, (tuple(reasons) if reasons is not None else None)

    def close(self, t: float, cap: float | None = None) -> None:
        """Count the last read's state up to ``t`` (at most ``cap`` seconds of it)."""
        if self.last_t is None or self.last is None or t <= self.last_t:
            return
        dt = t - self.last_t if cap is None else min(cap, t - self.last_t)
        for reason in self.last:
            self.seconds[reason] = self.seconds.get(reason, 0.0) + dt
        if self.last:
            self.any_s += dt
        self.covered_s += dt
        self.last_t = t

    def to_dict(self) -> dict[str, Any]:
        return {"throttled_s": round(self.any_s, 3), "covered_s": round(self.covered_s, 3),
                "by_reason_s": {r: round(s, 3) for r, s in sorted(self.seconds.items())}, "polls": self.polls}


def throttle_summary(clocks: Mapping[str, ThrottleClock], *, interval_s: float, wall_s: float,
                     note: str = "") -> dict[str, Any]:
    """The summary's "throttle": per card, and the card throttled longest (it sets the run's pace)."""
    per_card = {name: c.to_dict() for name, c in clocks.items()}
    worst = max(clocks.items(), key=lambda kv: kv[1].any_s, default=None)
    out: dict[str, Any] = {"source": "hl-smi -q", "interval_s": interval_s, "per_card": per_card,
                           "throttled_s": round(worst[1].any_s, 3) if worst else None,
                           "worst_card": worst[0] if worst and worst[1].any_s > 0 else None,
                           "fraction": (round(worst[1].any_s / wall_s, 4) if worst and wall_s > 0 else None),
                           "note": note}
    if not any(c.polls for c in clocks.values()):
        out["throttled_s"] = None
        out["note"] = note or "no throttle reasons could be read"
    return out


@dataclass
class CardAccount:
    """Everything the summary needs of one card."""

    name: str
    power: PowerIntegrator = field(default_factory=PowerIntegrator)
    utilization: _Stat = field(default_factory=_Stat)
    memory_used: _Stat = field(default_factory=_Stat)
    memory_total_mib: float | None = None
    temperature: _Stat = field(default_factory=_Stat)

    def to_dict(self) -> dict[str, Any]:
        return {"energy_j": rounded(self.power.energy_j) if self.power.measured else None,
                "power_mean_w": rounded(self.power.mean_w), "power_peak_w": rounded(self.power.peak_w),
                "power_readings": self.power.readings, "missing_power_readings": self.power.missing,
                "gaps": self.power.gaps, "gap_seconds": rounded(self.power.gap_seconds),
                "covered_s": rounded(self.power.covered_s),
                "utilization_mean": rounded(self.utilization.mean),
                "memory_used_peak_mib": rounded(self.memory_used.peak),
                "memory_used_mean_mib": rounded(self.memory_used.mean),
                "memory_total_mib": self.memory_total_mib,
                "temperature_peak_c": rounded(self.temperature.peak)}


class Accounts:
    """The run's cards' accounts, fed one snapshot at a time (the sampler's and the tests' entry)."""

    def __init__(self, gap_s: float = GAP_S) -> None:
        self.gap_s = gap_s
        self.cards: dict[str, CardAccount] = {}
        self.samples = 0
        self.peak_total_w: float | None = None

    def add(self, t: float, cards: Sequence[Mapping[str, Any]]) -> None:
        """One snapshot at ``t``: each card a dict with "name" and any of power_w, utilization,
        memory_used_mib, memory_total_mib, temperature_c (None: unknown)."""
        self.samples += 1
        total, whole = 0.0, bool(cards)
        for card in cards:
            name = str(card.get("name"))
            account = self.cards.get(name)
            if account is None:
                account = self.cards[name] = CardAccount(name, PowerIntegrator(gap_s=self.gap_s))
            account.power.add(t, card.get("power_w"))
            watts = finite(card.get("power_w"))
            if watts is None or watts < 0:
                whole = False
            else:
                total += watts
            account.utilization.add(card.get("utilization"))
            account.memory_used.add(card.get("memory_used_mib"))
            account.temperature.add(card.get("temperature_c"))
            memory_total = finite(card.get("memory_total_mib"))
            if memory_total is not None and memory_total > 0:
                account.memory_total_mib = memory_total
        if whole:
            # The run's power at one moment: only when every card of the snapshot read a power.
            self.peak_total_w = total if self.peak_total_w is None else max(self.peak_total_w, total)

    def energy(self) -> tuple[float | None, list[str]]:
        """(joules over the cards that were measured or None when none was, the cards that were not)."""
        measured = [a for a in self.cards.values() if a.power.measured]
        unmeasured = [a.name for a in self.cards.values() if not a.power.measured]
        return (sum(a.power.energy_j for a in measured) if measured else None), unmeasured


def coverage_status(share: float | None, uncovered_s: float = math.inf, edge_s: float = EDGE_S) -> str:
    """MEASURED, PARTIAL or NOT_MEASURED for readings that cover ``share`` of the run (missing
    ``uncovered_s`` seconds per card; ``edge_s`` of it allowed to a short run): see MEASURED_SHARE."""
    if share is None or share <= 0:
        return NOT_MEASURED
    if share >= MEASURED_SHARE or (uncovered_s <= edge_s and share >= 0.5):
        return MEASURED
    return PARTIAL if share >= PARTIAL_SHARE else NOT_MEASURED


def share_text(share: float) -> str:
    """'7 %', '<1 %', '100 %' (of the run)."""
    return "<1 %" if 0 < share < 0.005 else f"{100 * share:.0f} %"


def summarize(accounts: Accounts, *, source: str, energy_source: str, wall_s: float,
              card_count: int | None, cards: Sequence[int] = (), kind: str = "", note: str = "",
              counter_energy_j: float | None = None,
              counter_covered_s: float | None = None) -> dict[str, Any]:
    """The meter's summary (what meter-summary.json holds and ``runs show`` prints).

    ``energy_source``: SOURCE_HLSMI / SOURCE_NVIDIA (``accounts``' integrated power), SOURCE_RAPL
    (``counter_energy_j``, from a counter read over ``counter_covered_s``) or NOT_MEASURED.
    ``card_count`` None: no cards (a CPU run), card-hours unknown.

    ``energy_coverage``: the share of the run (of its card-seconds: every card of the run counts,
    one never read counts 0) the readings cover; ``energy_status`` MEASURED, PARTIAL or NOT_MEASURED
    by it (``coverage_status``). Only a measured energy is ``energy_j`` (what sums, prices and
    per-token figures use); what the readings of a partial or too short coverage add up to is
    ``energy_read_j``, never the run's energy."""
    unmeasured: list[str] = []
    energy_j: float | None = None
    covered_s = 0.0
    if energy_source == SOURCE_RAPL:
        energy_j = counter_energy_j
        covered_s = counter_covered_s or 0.0
    elif energy_source != NOT_MEASURED:
        energy_j, unmeasured = accounts.energy()
        covered_s = sum(a.power.covered_s for a in accounts.cards.values() if a.power.measured)
    notes = [note] if note else []
    counted = 1 if energy_source == SOURCE_RAPL else max(card_count or 0, len(accounts.cards), 1)
    share = min(1.0, covered_s / (counted * wall_s)) if wall_s > 0 and energy_j is not None else None
    # A short run's edges: up to three periods of its readings (at most EDGE_S) are not a gap.
    periods = [a.power.covered_s / (a.power.readings - 1) for a in accounts.cards.values()
               if a.power.readings > 1]
    edge = min(EDGE_S, 3 * max(periods)) if periods and energy_source != SOURCE_RAPL else EDGE_S
    status = coverage_status(share, (1 - share) * wall_s if share is not None else math.inf, edge)
    read_j: float | None = None
    if energy_j is None and energy_source != NOT_MEASURED:
        notes.append(f"{energy_source}: fewer than two power readings")
        energy_source = NOT_MEASURED
    elif energy_j is not None and status != MEASURED:
        read_j, energy_j = energy_j, None
        said = (f"power read over {share_text(share or 0.0)} of the run ({covered_s / counted:.1f} of "
                f"{wall_s:.1f} s")
        said += " per card)" if counted > 1 else ")"
        notes.append(said + (": what it read is not the run's energy" if status == PARTIAL else
                             f": under {share_text(PARTIAL_SHARE)}, too little to say"))
        if status == NOT_MEASURED:
            energy_source = NOT_MEASURED
    if unmeasured and (energy_j is not None or read_j is not None):
        notes.append(f"no power readings from {', '.join(unmeasured)}: its energy is not counted")
    per_card = {name: a.to_dict() for name, a in accounts.cards.items()}
    utilization, memory = _Stat(), _Stat()
    for account in accounts.cards.values():
        utilization.count += account.utilization.count
        utilization.total += account.utilization.total
        memory.count += account.memory_used.count
        memory.total += account.memory_used.total
        peak = account.memory_used.peak
        if peak is not None:
            memory.peak = peak if memory.peak is None else max(memory.peak, peak)
    means = [a.power.mean_w for a in accounts.cards.values() if a.power.mean_w is not None]
    totals = [a.memory_total_mib for a in accounts.cards.values() if a.memory_total_mib]
    return {
        "version": 1,
        "source": source,
        "kind": kind,
        "cards": list(cards),
        "wall_s": round(wall_s, 3),
        "card_hours": None if card_count is None else round(card_count * wall_s / 3600, 6),
        "energy_j": rounded(energy_j),
        "energy_kwh": None if energy_j is None else round(energy_j / 3.6e6, 9),
        "energy_source": energy_source,
        "energy_status": status if energy_source != NOT_MEASURED else NOT_MEASURED,
        "energy_coverage": None if share is None else round(share, 4),
        "energy_read_j": rounded(read_j),
        "power_mean_w": rounded(sum(means)) if means and energy_source != SOURCE_RAPL else (
            rounded(energy_j / wall_s) if energy_j is not None and wall_s > 0 else None),
        "power_peak_w": rounded(accounts.peak_total_w),
        "utilization_mean": rounded(utilization.mean),
        "memory_used_peak_mib": rounded(memory.peak),
        "memory_used_mean_mib": rounded(memory.mean),
        "memory_total_mib": max(totals) if totals else None,
        "samples": accounts.samples,
        "missing_power_readings": sum(a.power.missing for a in accounts.cards.values()),
        "gaps": sum(a.power.gaps for a in accounts.cards.values()),
        "note": "; ".join(notes),
        "per_card": per_card,
    }
_PART_KEYS = ("card_hours", "energy_j", "energy_kwh", "energy_source", "energy_status", "energy_coverage",
              "energy_read_j", "wall_s")


def combine(parts: Sequence[tuple[str, Mapping[str, Any] | None]]) -> dict[str, Any]:
    """The meter of one job run as several parts (one supervisor and meter per host of a multi-host
    run): card-hours and energy summed over the parts, wall time the longest part's, the peaks the
    highest. A part whose energy was not measured (or that has no summary) is named in the note and
    left out of the sum, never counted as 0; no part measured: energy None, "not measured"."""
    have = [(name, s) for name, s in parts if s]
    missing = [name for name, s in parts if not s]
    hours = [finite(s.get("card_hours")) for _n, s in have]
    measured = [(name, s) for name, s in have if finite(s.get("energy_j")) is not None]
    unmeasured = [name for name, s in have if finite(s.get("energy_j")) is None]
    energy = sum(float(s["energy_j"]) for _n, s in measured) if measured else None
    read = [finite(s.get("energy_j")) or finite(s.get("energy_read_j")) for _n, s in have]
    sources = sorted({str(s.get("energy_source")) for _n, s in have
                      if finite(s.get("energy_j")) is not None
                      or finite(s.get("energy_read_j")) is not None})
    # The job's coverage: each part's share weighted by its card-hours (its wall time without cards);
    # a part without a summary weighs as the others do on average and covers nothing.
    weights = [(finite(s.get("card_hours")) or finite(s.get("wall_s")) or 0.0, _part_share(s))
               for _n, s in have]
    mean_weight = sum(w for w, _c in weights) / len(weights) if weights else 0.0
    total_weight = sum(w for w, _c in weights) + mean_weight * len(missing)
    share = (sum(w * c for w, c in weights) / total_weight) if total_weight > 0 else (
        1.0 if measured and not unmeasured and not missing else 0.0)
    if measured and not unmeasured and not missing and all(
            s.get("energy_status", MEASURED) == MEASURED for _n, s in have):
        status = MEASURED
    else:
        status = PARTIAL if coverage_status(share) != NOT_MEASURED and any(r is not None for r in read) \
            else NOT_MEASURED
    read_j = sum(r for r in read if r is not None) if status == PARTIAL else None
    if status != MEASURED:
        energy = None
    walls = [w for w in (finite(s.get("wall_s")) for _n, s in have) if w is not None]
    means = [finite(s.get("power_mean_w")) for _n, s in measured]
    peaks = [p for p in (finite(s.get("memory_used_peak_mib")) for _n, s in have) if p is not None]
    notes = []
    if missing:
        notes.append(f"no meter summary from {', '.join(missing)}")
    if unmeasured and measured:
        notes.append(f"energy not measured on {', '.join(unmeasured)}: not in the sum")
    elif unmeasured:
        notes.append(f"energy not measured on any part ({', '.join(unmeasured)})")
    throttled = [t for t in (finite((s.get("throttle") or {}).get("throttled_s")) for _n, s in have)
                 if t is not None]
    from gaudi_gui.core.compile_rise import named
    warnings = [named(s["compile_warning"], name) for name, s in have
                if isinstance(s.get("compile_warning"), Mapping)]
    compiled = combined_compile(have)
    out: dict[str, Any] = {
        "version": 1, "kind": "parts", "parts": [
            {"name": name, **{k: (s or {}).get(k) for k in _PART_KEYS},
             **_part_compile((s or {}).get("compile"))} for name, s in parts],
        "wall_s": max(walls) if walls else None,
        "card_hours": round(sum(h for h in hours if h is not None), 6) if any(h is not None for h in hours)
        else None,
        "energy_j": rounded(energy), "energy_kwh": None if energy is None else round(energy / 3.6e6, 9),
        "energy_source": " + ".join(sources) if status != NOT_MEASURED else NOT_MEASURED,
        "energy_complete": status == MEASURED,
        "energy_status": status, "energy_coverage": round(share, 4), "energy_read_j": rounded(read_j),
        "power_mean_w": rounded(sum(m for m in means if m is not None)) if any(m is not None for m in means)
        else None,
        "memory_used_peak_mib": max(peaks) if peaks else None,
        "throttled_s": max(throttled) if throttled else None,
        "note": "; ".join(notes)}
    if compiled is not None:
        out["compile"] = compiled
    if warnings:
        # The first part's finding is the job's (what the Training tab and runs show say); each
        # part's, named, is kept.
        out["compile_warning"] = warnings[0]
        out["compile_warnings"] = warnings
    return out


def _part_share(summary: Mapping[str, Any]) -> float:
    """The share of its run a part's energy covers (a summary from before shares were kept: all of
    it when it has an energy, none otherwise)."""
    share = finite(summary.get("energy_coverage"))
    if finite(summary.get("energy_j")) is not None:
        return 1.0 if share is None else share
    return share or 0.0 if summary.get("energy_status") == PARTIAL else 0.0


def _part_compile(compiled: Any) -> dict[str, Any]:
    """A part's compile figures in the job's list of parts (nothing for a part without them)."""
    if not isinstance(compiled, Mapping) or "compilations" not in compiled:
        return {}
    return {"compilations": compiled.get("compilations"),
            "steady_compilations": compiled.get("steady_compilations")}


def combined_compile(have: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any] | None:
    """The job's Gaudi compile meter from its parts': the part whose slowest rank compiled most sets
    the pace of all (every rank waits for it at each collective), named in ``part``; the CPU
    fallbacks' ops of every part; the parts without one named."""
    found = [(name, s["compile"]) for name, s in have
             if isinstance(s.get("compile"), Mapping) and "compilations" in s["compile"]]
    if not found:
        return None
    name, worst = max(found, key=lambda p: (finite(p[1].get("compilations")) or 0,
                                            finite(p[1].get("compile_s")) or 0))
    out = {k: v for k, v in worst.items() if k != "ranks"}
    out["part"] = name
    out["per_part"] = {n: {k: c.get(k) for k in ("compilations", "compile_s", "warmup_compilations",
                                                  "steady_compilations", "cpu_fallbacks",
                                                  "steady_compilations_per_100_steps") if k in c}
                       for n, c in found}
    ops: list[str] = []
    for _n, c in found:
        for op in [*(c.get("cpu_fallback_ops") or {}), *(c.get("fallback_ops_all_ranks") or [])]:
            if str(op) not in ops:
                ops.append(str(op))
    out["fallback_ops_all_ranks"] = ops
    without = [n for n, s in have if not (isinstance(s.get("compile"), Mapping)
                                         and "compilations" in s["compile"])]
    if without:
        out["parts_without"] = without
    return out


def energy_measured(summary: Mapping[str, Any]) -> bool:
    return finite(summary.get("energy_j")) is not None

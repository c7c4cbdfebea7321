"""The run meter: what a run's own cards did while it ran, sampled by the run's supervisor.

The supervisor (``core.supervisor.supervise``, the one loop of every placement: this machine, a host,
each machine of a multi-host run) starts a :class:`Meter` for the run's own cards before its launcher
and stops it when the run has ended. The meter lives with the run, not with a window: a run that
nobody watches is metered the same.

Sources, by the run's device:

- **hpu**: one long-running ``hl-smi -Q index,module_id,utilization.aip,memory.used,memory.total,
  power.draw,temperature.aip -f csv,noheader,nounits -l 1`` (the arguments from
  ``core.hlsmi.query_args``, the rows parsed by ``core.hlsmi.CsvStream``: the same code as the
  Devices poller), keeping the run's modules only (``HABANA_VISIBLE_MODULES`` of the launch, else the
  cards env.json records, else every card). hl-smi's ``timestamp`` field is not asked for: its
  value is free text (a locale's date could hold a comma and break the row); each snapshot is stamped
  with this machine's clock when its rows arrive.
- **cuda**: ``nvidia-smi --query-gpu=... -l 1`` (``core.host.nvidia_args``/``parse_nvidia``), the
  GPUs of ``CUDA_VISIBLE_DEVICES`` (indices; else every GPU).
- **cpu**: the package counters ``<root>/intel-rapl:N/energy_uj`` (root ``RAPL_ROOT``, or
  ``GAUDI_GUI_RAPL_ROOT``), when readable (since 2020 kernels make them root-only): a counter, so
  the energy is its difference (with its wrap at ``max_energy_range_uj``), not an integral.

Every sample is one JSON line in ``<run>/meter.jsonl``, written with one ``os.write`` on an
``O_APPEND`` file. Energy from power readings is integrated per card with the trapezoid rule; a
stretch longer than ``GAP_S`` between two readings holds the earlier reading (and is counted as a
gap); a missing (N/A), non-finite or negative reading is counted as missing, never as 0 W. A run
whose energy could not be measured says "not measured" with ``energy_j`` None, never 0.

Cost: one thread blocked on hl-smi's pipe (a few rows a second) or waking once a second for RAPL;
hl-smi's child is ended with its whole tree (``core.proctree.ProcessTree``) when the meter stops.
Qt-free and torch-free.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import re
import shutil
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from gaudi_gui.core import atomic, hlsmi
from gaudi_gui.core.devices import DeviceSample, cards_name
from gaudi_gui.core.events import EventType

METER_NAME = "meter.jsonl"
SUMMARY_NAME = "meter-summary.json"
#: A job of several hosts: the whole job's meter (``combine`` of every host's part), kept in host 0's
#: run folder beside its own part's SUMMARY_NAME once the job has ended (``keep_job_summary``).
JOB_SUMMARY_NAME = "meter-job.json"
#: A Slurm job's parts: <run folder>/nodes/<node>/ (core.slurm's meter-node writes them).
NODES_DIR = "nodes"
#: Two readings further apart than this: the earlier one is held over the stretch, and it is a gap.
GAP_S = 10.0
#: Seconds between two samples (hl-smi's ``-l`` takes whole seconds; 1 is its least).
INTERVAL_S = 1.0
#: When hl-smi / nvidia-smi ends by itself while the run goes on, it is started again after this;
#: ``GAUDI_GUI_METER_RESTART_S`` in the launch's environment overrides it (tests: a run at a tenth of
#: the real scale).
RESTART_S = 5.0
#: Where the package energy counters live; ``GAUDI_GUI_RAPL_ROOT`` overrides it (tests).
RAPL_ROOT = "/sys/class/powercap"
#: What the Gaudi meter asks hl-smi for.
HLSMI_FIELDS = ("index", "module_id", "utilization.aip", "memory.used", "memory.total", "power.draw",
                "temperature.aip")

#: Seconds between two reads of the cards' clocks throttle reasons (``hl-smi -q``: a whole report of
#: every card, much heavier than the CSV loop); ``GAUDI_GUI_METER_THROTTLE_S`` in the launch's
#: environment overrides it (tests).
THROTTLE_INTERVAL_S = 5.0
#: Seconds between two looks at a Gaudi run's compile meter for compilations that keep rising after
#: warm-up (``core.compile_rise``); ``GAUDI_GUI_METER_COMPILE_S`` in the launch's environment overrides it.
COMPILE_WATCH_S = 10.0
#: A ``hl-smi -q`` that has not answered after this long is ended (and that read is lost).
THROTTLE_TIMEOUT_S = 30.0
#: The throttle reasons hl-smi -q lists under "Clocks Throttle Reasons", by the word the meter uses.
THROTTLE_REASONS = {"power": "power slowdown", "thermal": "thermal slowdown", "hw": "hw slowdown"}

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


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


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
        w = _finite(watts)
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
        v = _finite(value)
        if v is None or v < 0:
            return
        self.count += 1
        self.total += v
        self.peak = v if self.peak is None else max(self.peak, v)

    @property
    def mean(self) -> float | None:
        return self.total / self.count if self.count else None


def _r(value: float | None, digits: int = 3) -> float | None:
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


def throttle_reasons(card: Mapping[str, str]) -> list[str] | None:
    """The active throttle reasons of one ``hl-smi -q`` card (``hlsmi.parse_query``): ["power"], [],
    or None when the card's report has no throttle lines (the release does not print them)."""
    found: list[str] | None = None
    for reason, label in THROTTLE_REASONS.items():
        for key, value in card.items():
            if key == f"clocks throttle reasons/{label}" or key.endswith(f"/{label}"):
                found = found if found is not None else []
                if value.strip().lower() == "active":
                    found.append(reason)
                break
    return found


def query_card_name(card: Mapping[str, str]) -> tuple[str, int | None]:
    """('module 3', 3) of a ``hl-smi -q`` card (its index when the report has no module id)."""
    module = next((v for k, v in card.items() if k == "module id" or k.endswith("/module id")), "")
    if module.strip().isdigit():
        return f"module {int(module)}", int(module)
    index = card.get("_index", "")
    return f"index {index}", None


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


def throttle_text(throttle: Mapping[str, Any] | None) -> str:
    """'throttled 12 s (40 % of the run): module 3 power 12 s' / 'not throttled (hl-smi -q every 5 s)'
    / '' when the run has no throttle reads (not a Gaudi run)."""
    if not throttle:
        return ""
    seconds = _finite(throttle.get("throttled_s"))
    if seconds is None:
        return f"throttling not measured ({throttle.get('note') or 'no reads'})"
    every = _finite(throttle.get("interval_s")) or THROTTLE_INTERVAL_S
    if seconds <= 0:
        return f"not throttled (hl-smi -q every {every:g} s)"
    parts = []
    for name, card in (throttle.get("per_card") or {}).items():
        reasons = card.get("by_reason_s") or {}
        said = ", ".join(f"{r} {v:.0f} s" for r, v in reasons.items() if v > 0)
        if said:
            parts.append(f"{name} {said}")
    share = _finite(throttle.get("fraction"))
    text = f"throttled {seconds:.0f} s" + (f" ({100 * share:.0f} % of the run)" if share is not None else "")
    return f"{text}: {'; '.join(parts)}" if parts else text


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
        return {"energy_j": _r(self.power.energy_j) if self.power.measured else None,
                "power_mean_w": _r(self.power.mean_w), "power_peak_w": _r(self.power.peak_w),
                "power_readings": self.power.readings, "missing_power_readings": self.power.missing,
                "gaps": self.power.gaps, "gap_seconds": _r(self.power.gap_seconds),
                "covered_s": _r(self.power.covered_s), "utilization_mean": _r(self.utilization.mean),
                "memory_used_peak_mib": _r(self.memory_used.peak),
                "memory_used_mean_mib": _r(self.memory_used.mean),
                "memory_total_mib": self.memory_total_mib, "temperature_peak_c": _r(self.temperature.peak)}


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
            watts = _finite(card.get("power_w"))
            if watts is None or watts < 0:
                whole = False
            else:
                total += watts
            account.utilization.add(card.get("utilization"))
            account.memory_used.add(card.get("memory_used_mib"))
            account.temperature.add(card.get("temperature_c"))
            memory_total = _finite(card.get("memory_total_mib"))
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
        "energy_j": _r(energy_j),
        "energy_kwh": None if energy_j is None else round(energy_j / 3.6e6, 9),
        "energy_source": energy_source,
        "energy_status": status if energy_source != NOT_MEASURED else NOT_MEASURED,
        "energy_coverage": None if share is None else round(share, 4),
        "energy_read_j": _r(read_j),
        "power_mean_w": _r(sum(means)) if means and energy_source != SOURCE_RAPL else (
            _r(energy_j / wall_s) if energy_j is not None and wall_s > 0 else None),
        "power_peak_w": _r(accounts.peak_total_w),
        "utilization_mean": _r(utilization.mean),
        "memory_used_peak_mib": _r(memory.peak),
        "memory_used_mean_mib": _r(memory.mean),
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
    hours = [_finite(s.get("card_hours")) for _n, s in have]
    measured = [(name, s) for name, s in have if _finite(s.get("energy_j")) is not None]
    unmeasured = [name for name, s in have if _finite(s.get("energy_j")) is None]
    energy = sum(float(s["energy_j"]) for _n, s in measured) if measured else None
    read = [_finite(s.get("energy_j")) or _finite(s.get("energy_read_j")) for _n, s in have]
    sources = sorted({str(s.get("energy_source")) for _n, s in have
                      if _finite(s.get("energy_j")) is not None
                      or _finite(s.get("energy_read_j")) is not None})
    # The job's coverage: each part's share weighted by its card-hours (its wall time without cards);
    # a part without a summary weighs as the others do on average and covers nothing.
    weights = [(_finite(s.get("card_hours")) or _finite(s.get("wall_s")) or 0.0, _part_share(s))
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
    walls = [w for w in (_finite(s.get("wall_s")) for _n, s in have) if w is not None]
    means = [_finite(s.get("power_mean_w")) for _n, s in measured]
    peaks = [p for p in (_finite(s.get("memory_used_peak_mib")) for _n, s in have) if p is not None]
    notes = []
    if missing:
        notes.append(f"no meter summary from {', '.join(missing)}")
    if unmeasured and measured:
        notes.append(f"energy not measured on {', '.join(unmeasured)}: not in the sum")
    elif unmeasured:
        notes.append(f"energy not measured on any part ({', '.join(unmeasured)})")
    throttled = [t for t in (_finite((s.get("throttle") or {}).get("throttled_s")) for _n, s in have)
                 if t is not None]
    from gaudi_gui.core.compile_rise import named
    warnings = [named(s["compile_warning"], name) for name, s in have
                if isinstance(s.get("compile_warning"), Mapping)]
    compiled = _combined_compile(have)
    out: dict[str, Any] = {
        "version": 1, "kind": "parts", "parts": [
            {"name": name, **{k: (s or {}).get(k) for k in _PART_KEYS},
             **_part_compile((s or {}).get("compile"))} for name, s in parts],
        "wall_s": max(walls) if walls else None,
        "card_hours": round(sum(h for h in hours if h is not None), 6) if any(h is not None for h in hours)
        else None,
        "energy_j": _r(energy), "energy_kwh": None if energy is None else round(energy / 3.6e6, 9),
        "energy_source": " + ".join(sources) if status != NOT_MEASURED else NOT_MEASURED,
        "energy_complete": status == MEASURED,
        "energy_status": status, "energy_coverage": round(share, 4), "energy_read_j": _r(read_j),
        "power_mean_w": _r(sum(m for m in means if m is not None)) if any(m is not None for m in means)
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
    share = _finite(summary.get("energy_coverage"))
    if _finite(summary.get("energy_j")) is not None:
        return 1.0 if share is None else share
    return share or 0.0 if summary.get("energy_status") == PARTIAL else 0.0


def _part_compile(compiled: Any) -> dict[str, Any]:
    """A part's compile figures in the job's list of parts (nothing for a part without them)."""
    if not isinstance(compiled, Mapping) or "compilations" not in compiled:
        return {}
    return {"compilations": compiled.get("compilations"),
            "steady_compilations": compiled.get("steady_compilations")}


def _combined_compile(have: Sequence[tuple[str, Mapping[str, Any]]]) -> dict[str, Any] | None:
    """The job's Gaudi compile meter from its parts': the part whose slowest rank compiled most sets
    the pace of all (every rank waits for it at each collective), named in ``part``; the CPU
    fallbacks' ops of every part; the parts without one named."""
    found = [(name, s["compile"]) for name, s in have
             if isinstance(s.get("compile"), Mapping) and "compilations" in s["compile"]]
    if not found:
        return None
    name, worst = max(found, key=lambda p: (_finite(p[1].get("compilations")) or 0,
                                            _finite(p[1].get("compile_s")) or 0))
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


def combined_line(summary: Mapping[str, Any]) -> str:
    """'the whole job (2 parts): 0.011 card-hours · 4.0 kJ (hl-smi power integrated) · mean 410 W · 3.1 s'."""
    parts = summary.get("parts") or []
    words = [f"the whole job ({len(parts)} part{'' if len(parts) == 1 else 's'}: "
             f"{', '.join(str(p.get('name')) for p in parts)})"]
    hours = card_hours_text(summary)
    if hours:
        words.append(f"{hours} card-hours")
    joules = _finite(summary.get("energy_j"))
    words.append(energy_text(summary, why=False))
    mean = _finite(summary.get("power_mean_w"))
    if mean is not None and joules is not None:
        words.append(f"mean {mean:.0f} W")
    wall = _finite(summary.get("wall_s"))
    if wall is not None:
        words.append(f"{wall:.1f} s")
    throttled = _finite(summary.get("throttled_s"))
    if throttled:
        words.append(f"throttled up to {throttled:.0f} s on one card")
    compiled = summary.get("compile")
    if isinstance(compiled, Mapping) and compile_text(compiled):
        words.append(f"{compile_text(compiled)} on {compiled.get('part')}")
    text = " · ".join(words)
    return f"{text} ({summary['note']})" if summary.get("note") else text


def describe(summary: Mapping[str, Any]) -> str:
    """One line for a person: 'modules 2 and 3 · 12.3 s · 0.0068 card-hours · 2512 J (0.000698 kWh,
    hl-smi power integrated) · mean 205 W, peak 206 W · utilization 48 % · hl-smi memory peak 512 MiB'.
    A job's summary of several parts (a Slurm job's nodes): ``combined_line``."""
    if summary.get("kind") == "parts":
        return combined_line(summary)
    parts: list[str] = []
    cards = summary.get("cards") or []
    kind = str(summary.get("kind") or "hpu")
    if cards:
        parts.append(cards_name([int(c) for c in cards], kind))
    elif kind == "cpu":
        parts.append("CPU package")
    else:
        parts.append("all cards")
    wall = _finite(summary.get("wall_s"))
    if wall is not None:
        parts.append(f"{wall:.1f} s")
    card_hours = _finite(summary.get("card_hours"))
    if card_hours is not None:
        parts.append(f"{card_hours:.4g} card-hours")
    energy = _finite(summary.get("energy_j"))
    source = summary.get("energy_source") or NOT_MEASURED
    share = _finite(summary.get("energy_coverage"))
    if energy is None:
        parts.append(energy_text(summary, why=False))  # the why is the note, at the line's end
    else:
        parts.append(f"{energy:.4g} J ({_finite(summary.get('energy_kwh')) or 0:.3g} kWh, {source}"
                     f"{covers_text(share)})")
    if counter_text(summary):
        parts.append(counter_text(summary))
    mean, peak = _finite(summary.get("power_mean_w")), _finite(summary.get("power_peak_w"))
    if mean is not None or peak is not None:
        parts.append(" ".join(p for p in (f"mean {mean:.0f} W" if mean is not None else "",
                                          f"peak {peak:.0f} W" if peak is not None else "") if p))
    util = _finite(summary.get("utilization_mean"))
    if util is not None:
        parts.append(f"utilization {util:.0f} %")
    mem_peak = _finite(summary.get("memory_used_peak_mib"))
    mem_mean = _finite(summary.get("memory_used_mean_mib"))
    if mem_peak is not None:
        parts.append(f"memory (as hl-smi sees it) peak {mem_peak:.0f} MiB, mean {mem_mean or 0:.0f} MiB")
    throttled = throttle_text(summary.get("throttle"))
    if throttled:
        parts.append(throttled)
    pace = rates_of(summary)
    if pace:
        parts.append(pace)
    tokens = tokens_text(summary)
    if tokens:
        parts.append(tokens)
    text = " · ".join(parts)
    note = summary.get("note")
    return f"{text} ({note})" if note else text


# -- Serve and Evaluate: what the energy bought --------------------------------------------------------


def generated_tokens(kind: str, events: Iterable[Mapping[str, Any]]) -> dict[str, Any]:
    """What a Serve or Evaluate job generated, from its events: Serve's engine's own count where it
    keeps one (``serve_tokens``: ``transformers serve`` through workers/transformers_serve, vLLM's
    Prometheus counters read by ``gaudi-gui serve``; exact), else its request log (each
    ``serve_request`` to a completions endpoint, its ``completion_tokens``); Evaluate's answers (each
    ``answer``'s ``new_tokens``). A request or answer without a count is counted as such, never as 0
    tokens; ``generated_tokens`` None when none had one, with why in ``tokens_note`` where the engine
    said it."""
    events = list(events)
    if kind == "serve":
        engine = _engine_count(events)
        if engine is not None:
            return engine
    total, counted, without = 0, 0, 0
    for event in events:
        if kind == "serve" and event.get("type") == EventType.SERVE_REQUEST:
            if "completions" not in str(event.get("path") or ""):
                continue  # /v1/models and the like generate nothing
            value = event.get("completion_tokens")
        elif kind == "eval" and event.get("type") == EventType.ANSWER:
            value = event.get("new_tokens")
        else:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
            total, counted = total + value, counted + 1
        else:
            without += 1
    source = "completion_tokens of the request log" if kind == "serve" else "new tokens of the answers"
    return {"generated_tokens": total if counted else None, "tokens_source": source,
            "token_items": counted, "token_items_without_count": without}


def _engine_count(events: list[Mapping[str, Any]]) -> dict[str, Any] | None:
    """Serve's tokens as its engine counted them (its last ``serve_tokens``: running totals), or None
    when the engine said nothing (a vLLM run of an earlier gaudi-gui: the request log's counts then).
    An engine that counts but saw no token of the requests it answered is not believed: "not
    measured", never 0."""
    last: Mapping[str, Any] | None = None
    answered = 0
    for event in events:
        if event.get("type") == EventType.SERVE_TOKENS:
            last = event
        elif event.get("type") == EventType.SERVE_REQUEST and "completions" in str(event.get("path") or "") \
                and event.get("status") == 200:
            answered += 1
    if last is None:
        return None
    source = str(last.get("source") or "the engine's own count")
    out: dict[str, Any] = {"generated_tokens": None, "tokens_source": source, "token_items": answered,
                           "token_items_without_count": 0}
    generated, prompt = last.get("completion_tokens"), last.get("prompt_tokens")
    if last.get("counting") is False:
        out["tokens_note"] = f"the engine's tokens were not counted: {last.get('why') or 'no reason given'}"
    elif not isinstance(generated, int) or isinstance(generated, bool) or generated < 0:
        out["tokens_note"] = "the engine's token count was unreadable"
    elif generated == 0 and answered:
        out["tokens_note"] = (f"the engine's token counter saw no token of the {answered} request(s) it "
                              "answered")
    else:
        out["generated_tokens"] = generated
        if isinstance(prompt, int) and not isinstance(prompt, bool) and prompt >= 0:
            out["prompt_tokens"] = prompt
    return out


def token_figures(summary: Mapping[str, Any]) -> dict[str, Any]:
    """Energy per 1,000 generated tokens (Wh) and generated tokens per second of wall time, from a
    summary holding ``generated_tokens``; each None (not measured) when its parts are missing, with
    why in ``per_1k_tokens_note``."""
    tokens = _finite(summary.get("generated_tokens"))
    joules, wall = _finite(summary.get("energy_j")), _finite(summary.get("wall_s"))
    per_1k: float | None = None
    why = ""
    if tokens is None:
        why = str(summary.get("tokens_note") or "") or (
            "no token counts in the request log (the engine's access log gives none)"
            if str(summary.get("tokens_source") or "").startswith("completion")
            else "no token counts in the answers")
    elif tokens <= 0:
        why = "no tokens generated"
    elif joules is None:
        share = _finite(summary.get("energy_coverage"))
        why = (f"energy {PARTIAL}: read over {share_text(share or 0.0)} of the run only"
               if summary.get("energy_status") == PARTIAL else "energy not measured")
    else:
        per_1k = joules / 3600 / tokens * 1000
    return {"energy_per_1k_tokens_wh": None if per_1k is None else round(per_1k, 9),
            "tokens_per_s": None if tokens is None or not wall else round(tokens / wall, 3),
            "per_1k_tokens_note": why}


def tokens_text(summary: Mapping[str, Any] | None) -> str:
    """'1,234 tokens generated · 0.31 Wh per 1,000 tokens · 12 tokens/s (over the run)'; 'Wh per
    1,000 tokens not measured (why)'; '' for a summary without tokens (a training run)."""
    if not summary or "generated_tokens" not in summary:
        return ""
    words = []
    tokens = _finite(summary.get("generated_tokens"))
    if tokens is not None:
        words.append(f"{tokens:,.0f} tokens generated")
    per_1k = _finite(summary.get("energy_per_1k_tokens_wh"))
    words.append(f"{figure(per_1k)} Wh per 1,000 tokens" if per_1k is not None else
                 f"Wh per 1,000 tokens {NOT_MEASURED} ({summary.get('per_1k_tokens_note') or 'no tokens'})")
    rate = _finite(summary.get("tokens_per_s"))
    if rate is not None and tokens:
        words.append(f"{rate:.3g} tokens/s over the run")
    return " · ".join(words)


def outcome_words(summary: Mapping[str, Any] | None) -> str:
    """What a Serve or Evaluate run's outcome says it cost, short (the whys are in ``runs show``):
    '0.011 card-hours · 4.0 kJ (hl-smi power integrated) · 200 tokens generated · 0.31 Wh per 1,000
    tokens'; 'energy not measured', 'Wh per 1,000 tokens not measured' where nobody measured it."""
    if not summary:
        return ""
    words = []
    hours = card_hours_text(summary)
    if hours:
        words.append(f"{hours} card-hours")
    words.append(energy_text(summary, why=False))
    if "generated_tokens" in summary:
        tokens = _finite(summary.get("generated_tokens"))
        if tokens is not None:
            words.append(f"{tokens:,.0f} tokens generated")
        per_1k = _finite(summary.get("energy_per_1k_tokens_wh"))
        words.append(f"{figure(per_1k)} Wh per 1,000 tokens" if per_1k is not None
                     else f"Wh per 1,000 tokens {NOT_MEASURED}")
    return " · ".join(words)


def read_summary(folder: str | Path) -> dict[str, Any] | None:
    """The run's meter summary, or None when it has none (an older run, or one still running)."""
    try:
        data = json.loads((Path(folder) / SUMMARY_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def read_job_summary(folder: str | Path) -> dict[str, Any] | None:
    """What a run's meter says of its whole job: host 0's run of a multi-host job, the job's meter
    (every host's part summed, ``JOB_SUMMARY_NAME``); any other run, its own (``read_summary``)."""
    try:
        data = json.loads((Path(folder) / JOB_SUMMARY_NAME).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return read_summary(folder)
    return data if is_job_summary(data) else read_summary(folder)


def is_job_summary(data: Any) -> bool:
    """A whole job's meter as ``combine`` makes it (its parts, named)."""
    return isinstance(data, dict) and data.get("kind") == "parts" and isinstance(data.get("parts"), list) \
        and all(isinstance(p, dict) and isinstance(p.get("name"), str) for p in data["parts"])


def keep_job_summary(folder: str | Path, summary: Any) -> Path:
    """Keep a multi-host job's meter (``combine``'s) in host 0's run ``folder``, beside the folder's
    own part; ValueError for anything else, OSError when the disk refuses."""
    if not is_job_summary(summary):
        raise ValueError("not a job's meter (a JSON object of kind 'parts' naming its parts)")
    path = Path(folder) / JOB_SUMMARY_NAME
    atomic.write_json(path, summary)
    return path


def parse_ids(text: str | None) -> list[int] | None:
    """'2,3' -> [2, 3]; None for no selection or anything that is not a list of ids (a UUID list)."""
    if not text or not text.strip():
        return None
    parts = [p.strip() for p in text.split(",") if p.strip()]
    if not parts or not all(p.isascii() and p.isdigit() for p in parts):
        return None
    return sorted({int(p) for p in parts})


def recorded_cards(folder: str | Path) -> list[int] | None:
    """The cards env.json records the run was given (``train --cards``), when applied."""
    try:
        data = json.loads((Path(folder) / "env.json").read_text(encoding="utf-8"))
        cards = data.get("cards") or {}
        if not cards.get("applied"):
            return None
        return parse_ids(str(cards.get("requested") or ""))
    except (OSError, ValueError, AttributeError):
        return None


def rapl_root() -> Path:
    return Path(os.environ.get("GAUDI_GUI_RAPL_ROOT") or RAPL_ROOT)


def rapl_zones(root: Path | None = None) -> list[tuple[Path, int | None]]:
    """The package zones (``intel-rapl:N``, not their ``intel-rapl:N:M`` subzones) whose energy_uj
    can be read now, each with its wrap (``max_energy_range_uj``, None when unreadable)."""
    root = root or rapl_root()
    zones = []
    try:
        entries = sorted(root.iterdir())
    except OSError:
        return []
    for entry in entries:
        if not re.fullmatch(r"intel-rapl:\d+", entry.name):
            continue
        try:
            int((entry / "energy_uj").read_text().strip())
        except (OSError, ValueError):
            continue  # root-only on kernels since 2020: not readable is not measured
        wrap: int | None = None
        with contextlib.suppress(OSError, ValueError):
            wrap = int((entry / "max_energy_range_uj").read_text().strip())
        zones.append((entry, wrap))
    return zones


# -- the vendors' energy counters: a cross-check of the integrated power --------------------------------

SOURCE_NVML = "nvml"
SOURCE_HLML = "hlml"


class EnergyCounter:
    """A vendor library's total-energy counter (mJ since the driver was loaded) of the run's own cards,
    read when the run starts and when it ends: NVML's ``nvmlDeviceGetTotalEnergyConsumption`` on CUDA
    (pynvml), HLML's ``hlmlDeviceGetTotalEnergyConsumption`` on Gaudi (pyhlml). ``module``: the
    library's module object (tests give a fake one); found by import otherwise."""

    def __init__(self, source: str, module: Any, cards: Sequence[int] | None) -> None:
        self.source = source
        self.lib = module
        prefix = "nvml" if source == SOURCE_NVML else "hlml"
        self._call = lambda name, *args: getattr(module, f"{prefix}{name}")(*args)
        self._call("Init")
        try:
            handles: dict[str, Any] = {}
            for index in range(int(self._call("DeviceGetCount"))):
                handle = self._call("DeviceGetHandleByIndex", index)
                # Gaudi: the run's cards are module ids (HABANA_VISIBLE_MODULES); CUDA: nvidia-smi's index.
                ident = int(self._call("DeviceGetModuleID", handle)) if source == SOURCE_HLML else index
                if not cards or ident in cards:
                    handles[f"module {ident}" if source == SOURCE_HLML else f"GPU {ident}"] = handle
        except Exception:
            self.close()
            raise
        if not handles:
            self.close()
            raise LookupError(f"{source}: none of the run's cards {list(cards or [])} found")
        self.handles = handles
        self.start: dict[str, float] = {}
        self.end: dict[str, float] = {}
        self.errors: list[str] = []

    def read(self) -> dict[str, float]:
        """Each card's counter now, in mJ (a card whose read fails is left out and its error kept)."""
        out: dict[str, float] = {}
        for name, handle in self.handles.items():
            try:
                value = float(self._call("DeviceGetTotalEnergyConsumption", handle))
            except Exception as exc:  # one card's failing counter is that card's, not the run's
                self.errors.append(f"{name}: {exc}")
                continue
            if math.isfinite(value) and value >= 0:
                out[name] = value
        return out

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._call("Shutdown")

    def result(self) -> dict[str, Any]:
        """The energy between the two reads: {"source", "energy_j", "per_card", "note"}; energy None
        (never 0) when no card was read at both ends, or a counter went backwards (a driver reload)."""
        per_card: dict[str, float] = {}
        skipped: list[str] = []
        for name in self.handles:
            a, b = self.start.get(name), self.end.get(name)
            if a is None or b is None or b < a:
                skipped.append(name)
            else:
                per_card[name] = round((b - a) / 1000, 3)
        notes = []
        if skipped:
            notes.append(f"no counter difference from {', '.join(skipped)}")
        notes += self.errors[-2:]
        return {"source": self.source, "energy_j": round(sum(per_card.values()), 3) if per_card else None,
                "per_card": per_card, "complete": not skipped, "cards": len(self.handles),
                "note": "; ".join(notes)}


def energy_counter(device: str, cards: Sequence[int] | None, module: Any = None) -> EnergyCounter | None:
    """The run's vendor energy counter where its library imports (cuda: pynvml; hpu: pyhlml), else
    None (not an error: most machines have neither)."""
    source = SOURCE_NVML if device == "cuda" else SOURCE_HLML if device == "hpu" else ""
    if not source:
        return None
    if module is None:
        import importlib
        try:
            module = importlib.import_module("pynvml" if source == SOURCE_NVML else "pyhlml")
        except Exception:  # ImportError, or a library that fails to load its shared object
            return None
    try:
        return EnergyCounter(source, module, cards)
    except Exception:
        return None


def with_counter(summary: Mapping[str, Any], counter: Mapping[str, Any]) -> dict[str, Any]:
    """The summary's keys given by a counter's result: ``energy_counter`` beside the integrated
    figure (with how far the integral is from it); where the power could not be integrated, the
    counter's energy becomes the run's (its source named: "nvml" / "hlml")."""
    found = dict(counter)
    joules, integrated = _finite(found.get("energy_j")), _finite(summary.get("energy_j"))
    if joules is not None and integrated is not None and joules > 0:
        found["integrated_diff_pct"] = round((integrated - joules) / joules * 100, 2)
    out: dict[str, Any] = {"energy_counter": found}
    if integrated is None and joules is not None:
        # The counter is read at the run's start and end: it covers the whole run, on the cards it
        # read at both ends (a card skipped lowers the share, as an unread card does the integral's).
        wall = _finite(summary.get("wall_s"))
        read = len(found.get("per_card") or {})
        cards = _finite(found.get("cards")) or read
        share = min(1.0, read / cards) if cards else 0.0
        status = coverage_status(share)
        out.update(energy_source=str(found["source"]), energy_status=status, energy_coverage=round(share, 4))
        if status == MEASURED:
            out.update(energy_j=joules, energy_kwh=round(joules / 3.6e6, 9), energy_read_j=None,
                       power_mean_w=_r(joules / wall) if wall else None)
        else:
            out.update(energy_read_j=joules)
    return out


def counter_text(summary: Mapping[str, Any]) -> str:
    """'NVML counter 2.1 kJ (integrated +1.2 %)' beside the integrated figure ('' without a counter)."""
    counter = summary.get("energy_counter")
    if not isinstance(counter, Mapping):
        return ""
    name = str(counter.get("source") or "").upper()
    joules = _finite(counter.get("energy_j"))
    if joules is None:
        return f"{name} counter: {NOT_MEASURED}" + (f" ({counter['note']})" if counter.get("note") else "")
    text = f"{name} counter {joules_text(joules)}"
    diff = _finite(counter.get("integrated_diff_pct"))
    if diff is not None:
        text += f" (integrated {diff:+.1f} %)"
    return text


class Meter:
    """The sampler of one run. ``start()`` it before the launcher, ``stop()`` it once the run has
    ended: stop ends the tool's child tree, joins the thread and returns (and writes) the summary.

    ``device``: the run's device ('hpu', 'cuda', 'cpu'); ``env``: the launch's environment (its
    ``HABANA_VISIBLE_MODULES`` / ``CUDA_VISIBLE_DEVICES`` and PATH are the run's)."""

    def __init__(self, folder: str | Path, *, device: str, env: Mapping[str, str] | None = None,
                 interval_s: float = INTERVAL_S, gap_s: float = GAP_S,
                 clock: Callable[[], float] = time.time, events_path: str | Path | None = None,
                 part: str = "") -> None:
        self.folder = Path(folder)
        #: The run's events (its logged steps; the compile warning goes there): ``folder``'s own, or
        #: a Slurm node's part's run folder's (the folder every node shares).
        self.events_path = Path(events_path) if events_path is not None else self.folder / "events.jsonl"
        #: The part of a job this meter is (a Slurm node's name): its warning names it.
        self.part = part
        self.device = device
        self.env = dict(os.environ if env is None else env)
        self.interval_s = interval_s
        self.clock = clock
        self.accounts = Accounts(gap_s)
        self.source = "none"
        self.energy_source = NOT_MEASURED
        self.note = ""
        self.cards: list[int] | None = None
        self.errors: list[str] = []
        self.restarts = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._proc: subprocess.Popen[str] | None = None
        self._fd = -1
        self._started_at = 0.0
        self._rapl_energy_uj = 0
        #: (first, last) time the RAPL counters were read: what their difference covers.
        self._rapl_span: tuple[float, float] | None = None
        self._summary: dict[str, Any] | None = None
        #: The vendor's energy counter of the run's cards (NVML / HLML where their library imports).
        self.counter: EnergyCounter | None = None
        #: A module object standing in for pynvml / pyhlml (tests); None: imported when present.
        self.counter_module: Any = None
        self._program: list[str] = []
        self._parse: Callable[[str], tuple[list[DeviceSample] | None, bool]] | None = None
        #: Each card's time throttled (hpu: ``hl-smi -q`` every ``throttle_interval_s``), by card name.
        self.throttle: dict[str, ThrottleClock] = {}
        self.throttle_interval_s = THROTTLE_INTERVAL_S
        with contextlib.suppress(ValueError):
            wanted = float(self.env.get("GAUDI_GUI_METER_THROTTLE_S") or THROTTLE_INTERVAL_S)
            if math.isfinite(wanted) and wanted > 0:
                self.throttle_interval_s = wanted
        self.restart_s = RESTART_S
        with contextlib.suppress(ValueError):
            wanted = float(self.env.get("GAUDI_GUI_METER_RESTART_S") or RESTART_S)
            if math.isfinite(wanted) and wanted > 0:
                self.restart_s = wanted
        self._throttle_program: list[str] = []
        self._throttle_thread: threading.Thread | None = None
        self._throttle_proc: subprocess.Popen[str] | None = None
        self._throttle_errors: list[str] = []
        #: Gaudi: the bridge's metrics file the launch was given, watched for compilations that keep
        #: rising after warm-up; the finding once made (also written as a "warning" event).
        self.compile_base = self.env.get("PT_HPU_METRICS_FILE", "") if device == "hpu" else ""
        self.compile_interval_s = COMPILE_WATCH_S
        with contextlib.suppress(ValueError):
            wanted = float(self.env.get("GAUDI_GUI_METER_COMPILE_S") or COMPILE_WATCH_S)
            if math.isfinite(wanted) and wanted > 0:
                self.compile_interval_s = wanted
        self.compile_warning: dict[str, Any] | None = None
        #: Steps of warm-up before compilations count (``GAUDI_GUI_METER_RISE_WARMUP``: tests).
        self.rise_warmup_steps: int | None = None
        with contextlib.suppress(ValueError):
            self.rise_warmup_steps = max(1, int(self.env["GAUDI_GUI_METER_RISE_WARMUP"])) \
                if self.env.get("GAUDI_GUI_METER_RISE_WARMUP") else None
        self._steps: list[tuple[float, int]] = []
        self._step_follower: Any = None
        self._compile_thread: threading.Thread | None = None

    # -- what to meter --------------------------------------------------------------------------------

    def _choose(self) -> None:
        if self.device == "hpu":
            self.cards = parse_ids(self.env.get("HABANA_VISIBLE_MODULES")) or recorded_cards(self.folder)
            chosen, named = hlsmi.hl_smi_program(env=self.env)
            program: str | None = chosen if named else hlsmi.find_hl_smi(env=self.env)
            if not program:
                self.note = "hl-smi not found: the cards' energy is not measured"
                return
            self._program = [program, *hlsmi.query_args(HLSMI_FIELDS, loop_s=max(1, round(self.interval_s)),
                                                        header=False, units=False)]
            self.source, self.energy_source = "hl-smi", SOURCE_HLSMI
            self._parse = self._hlsmi_parser(hlsmi.CsvStream(HLSMI_FIELDS))
            self._throttle_program = [program, "-q"]
        elif self.device == "cuda":
            self.cards = parse_ids(self.env.get("CUDA_VISIBLE_DEVICES")) or recorded_cards(self.folder)
            program = shutil.which("nvidia-smi", path=self.env.get("PATH"))
            if not program:
                self.note = "nvidia-smi not found: the GPUs' energy is not measured"
                return
            from gaudi_gui.core import host
            self._program = [program, *host.nvidia_args(), "-l", str(max(1, round(self.interval_s)))]
            self.source, self.energy_source = "nvidia-smi", SOURCE_NVIDIA
            self._parse = self._nvidia_parser()
        else:
            self.cards = None
            if rapl_zones():
                self.source, self.energy_source = "rapl", SOURCE_RAPL
            else:
                self.note = f"no readable RAPL counter under {rapl_root()}"

    def _wanted(self, sample: DeviceSample) -> bool:
        if not self.cards:
            return True
        ident = sample.module_id if sample.kind == "hpu" and sample.module_id is not None else sample.index
        return ident in self.cards

    # -- start / stop ---------------------------------------------------------------------------------

    def start(self) -> None:
        self._started_at = self.clock()
        self._choose()
        with contextlib.suppress(Exception):  # a cross-check: whatever it meets, the meter goes on
            self.counter = energy_counter(self.device, self.cards, self.counter_module)
            if self.counter is not None:
                self.counter.start = self.counter.read()
        try:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC
            self._fd = os.open(self.folder / METER_NAME, flags, 0o600)
        except OSError as exc:
            self.errors.append(f"cannot write {METER_NAME}: {exc}")
        if self.compile_base:  # the bridge writes its file whether or not hl-smi can be read
            self._compile_thread = threading.Thread(target=self._run_compile_watch, name="run-meter-compile",
                                                    daemon=True)
            self._compile_thread.start()
        if self.source in ("hl-smi", "nvidia-smi"):
            target: Callable[[], None] = self._run_tool
        elif self.source == "rapl":
            target = self._run_rapl
        else:
            return
        self._thread = threading.Thread(target=target, name="run-meter", daemon=True)
        self._thread.start()
        if self._throttle_program:
            self._throttle_thread = threading.Thread(target=self._run_throttle, name="run-meter-throttle",
                                                     daemon=True)
            self._throttle_thread.start()

    def stop(self, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """End the sampler (and hl-smi's whole tree), write meter-summary.json (with ``extra``'s
        keys added: the compile meter), return the summary."""
        if self._summary is not None:
            return self._summary
        self._stop.set()
        self._end_child()
        self._end_child(self._throttle_proc)
        if self._thread is not None:
            self._thread.join(timeout=10)
        if self._throttle_thread is not None:
            self._throttle_thread.join(timeout=10)
        if self._compile_thread is not None:
            self._compile_thread.join(timeout=10)
        if self.compile_base:
            with contextlib.suppress(Exception):  # an observer: nothing here may fail the summary
                self.check_compiles()  # the last steps and dumps, after the ranks have ended
        with self._lock:
            # The last read's state holds until the run's end, for at most one poll interval.
            end = self.clock()
            for clock in self.throttle.values():
                clock.close(end, cap=self.throttle_interval_s)
        if self.source == "rapl":
            self._sample_rapl()  # the last stretch up to the end
        if self._fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1
        summary = self.summary(final=True)
        summary.update(extra or {})
        if self.counter is not None:
            with contextlib.suppress(Exception):
                self.counter.end = self.counter.read()
                self.counter.close()
                summary.update(with_counter(summary, self.counter.result()))
        if "generated_tokens" in summary:  # a Serve or Evaluate run: what the energy bought
            summary.update(token_figures(summary))
        if self.compile_warning is not None:
            summary["compile_warning"] = self.compile_warning
        with contextlib.suppress(Exception):  # an observer: the summary is written whatever this meets
            pace = self.pace()
            if pace is not None:
                summary["rates"] = pace
        try:
            atomic.write_json(self.folder / SUMMARY_NAME, summary)
        except OSError as exc:
            summary["note"] = (summary["note"] + "; " if summary["note"] else "") + f"not saved: {exc}"
        self._summary = summary
        return summary

    def summary(self, final: bool = False) -> dict[str, Any]:
        """The summary so far (a live strip may ask while it runs)."""
        with self._lock:
            wall = self.clock() - self._started_at
            count = None if self.device == "cpu" else (
                len(self.cards) if self.cards else len(self.accounts.cards) or None)
            note = "; ".join(x for x in (self.note, *self.errors[-3:]) if x)
            if self.restarts:
                note = "; ".join(x for x in (note, f"{self.source} restarted {self.restarts} time(s)") if x)
            out = summarize(self.accounts, source=self.source, energy_source=self.energy_source,
                            wall_s=wall, card_count=count, cards=self.cards or (), kind=self.device,
                            note=note, counter_energy_j=self._rapl_energy_uj / 1e6
                            if self.source == "rapl" and self.accounts.samples > 1 else None,
                            counter_covered_s=self._rapl_span[1] - self._rapl_span[0]
                            if self._rapl_span else None)
            if self._throttle_program:
                out["throttle"] = throttle_summary(self.throttle, interval_s=self.throttle_interval_s,
                                                   wall_s=wall, note="; ".join(self._throttle_errors[-2:]))
        out["final"] = final
        # When the meter started (this machine's clock): what the run's share of coverage is counted
        # from, for a reader of meter.jsonl (the export's coverage series).
        out["started_t"] = round(self._started_at, 3)
        return out

    def _end_child(self, proc: subprocess.Popen[str] | None = None) -> None:
        """SIGKILL the tool (or ``proc``), its group and every descendant, then reap it. Only while it
        is not yet reaped: an unreaped child (a zombie included) still owns its pid and group id, so
        nobody else's process can be hit."""
        proc = proc or self._proc
        if proc is None or proc.returncode is not None:
            return
        from gaudi_gui.core.proctree import ProcessTree
        ProcessTree(proc.pid).kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)

    # -- writing --------------------------------------------------------------------------------------

    def _write(self, record: Mapping[str, Any]) -> None:
        if self._fd < 0:
            return
        data = (json.dumps(record, separators=(",", ":"), allow_nan=False, default=str) + "\n").encode()
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(self._fd, view):]
        except (OSError, ValueError) as exc:  # a full disk must not end the run
            self.errors.append(f"cannot write {METER_NAME}: {exc}")
            with contextlib.suppress(OSError):
                os.close(self._fd)
            self._fd = -1

    def take(self, t: float, samples: Iterable[DeviceSample]) -> None:
        """One snapshot of the tool: the run's cards are accounted and written as one line."""
        # The time as written (ms): the summary's energy and every reader of meter.jsonl (the export,
        # a follower) integrate the same instants (full precision here, ms in the file, once made
        # them differ by up to 1e-4 of the energy: a fresh clone's failure).
        t = round(t, 3)
        cards = []
        for s in samples:
            if not self._wanted(s):
                continue
            cards.append({"name": f"module {s.module_id}" if s.kind == "hpu" and s.module_id is not None
                          else f"{'GPU' if s.kind == 'cuda' else 'index'} {s.index}",
                          "module_id": s.module_id, "index": s.index,
                          "power_w": _clean(s.power_w), "utilization": _clean(s.utilization),
                          "memory_used_mib": _clean(s.memory_used_mib),
                          "memory_total_mib": _clean(s.memory_total_mib),
                          "temperature_c": _clean(s.temperature_c)})
        if not cards:
            return
        with self._lock:
            self.accounts.add(t, cards)
        self._write({"t": t, "source": self.source, "cards": cards})

    # -- hl-smi / nvidia-smi --------------------------------------------------------------------------

    @staticmethod
    def _hlsmi_parser(stream: hlsmi.CsvStream) -> Callable[[str], tuple[list[DeviceSample] | None, bool]]:
        def feed(line: str) -> tuple[list[DeviceSample] | None, bool]:
            # Before the card set is known, a snapshot ends only when the next period's first row
            # comes (the index wraps); after, on its own last row.
            by_wrap = stream.known is None
            return stream.feed_line(line), by_wrap
        return feed

    @staticmethod
    def _nvidia_parser() -> Callable[[str], tuple[list[DeviceSample] | None, bool]]:
        from gaudi_gui.core import host
        pending: dict[int, DeviceSample] = {}

        def feed(line: str) -> tuple[list[DeviceSample] | None, bool]:
            found = host.parse_nvidia(line)
            if not found:
                return None, True
            sample = found[0]
            done = None
            if sample.index in pending:  # the index wrapped: one loop period is whole
                done = sorted(pending.values(), key=lambda s: s.index)
                pending.clear()
            pending[sample.index] = sample
            return done, True
        return feed

    def _run_tool(self) -> None:
        while not self._stop.is_set():
            try:
                proc = subprocess.Popen(self._program, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                        stdin=subprocess.DEVNULL, text=True, errors="replace", bufsize=1,
                                        env=self.env, start_new_session=True, close_fds=True)
            except OSError as exc:
                self.errors.append(f"cannot start {self._program[0]}: {exc}")
                return
            self._proc = proc
            if self._stop.is_set():  # stop() came while it started: it may have missed this child
                self._end_child()
            assert proc.stdout is not None
            with proc.stdout:
                self._read(proc.stdout)
            self._end_child()  # EOF: it ended or closed its output; its helpers go too, then it is reaped
            if self._stop.is_set():
                return
            self.restarts += 1
            self._stop.wait(self.restart_s)

    def _read(self, stdout: IO[str]) -> None:
        parse = self._parse
        assert parse is not None
        last_line_t = self.clock()
        for line in stdout:
            now = self.clock()
            snapshot, by_wrap = parse(line)
            if snapshot:
                # A snapshot ended by the next period's first row is stamped with its own last row.
                self.take(last_line_t if by_wrap else now, snapshot)
            last_line_t = now

    def pace(self) -> dict[str, Any] | None:
        """The run's steady-state pace from its logged steps (``rates``: warm-up left out), kept in the
        summary so the Runs list and Compare read it without the events; None without steps."""
        from gaudi_gui.core.events import read_events
        from gaudi_gui.core.metrics import metric_record
        records = [r for r in (metric_record(e) for e in read_events(self.folder / "events.jsonl"))
                   if r is not None]
        if not records:
            return None
        max_steps = max((int(r["max_steps"]) for r in records if isinstance(r.get("max_steps"), int)),
                        default=0)
        start = records[0].get("start_step")
        r = rates(records, max_steps=max_steps, start_step=start if isinstance(start, int) else 0)
        return {"steps_per_s": _clean(r.steps_per_s), "samples_per_s": _clean(r.samples_per_s),
                "tokens_per_s": _clean(r.tokens_per_s), "steady": r.steady, "from_step": r.from_step}

    # -- throttle reasons (hl-smi -q) -----------------------------------------------------------------

    #: Reads of the throttle reasons that fail in a row before the meter stops asking (a release
    #: whose -q lists no card, or no reasons: asking every 5 s for hours would only cost).
    THROTTLE_GIVE_UP = 3

    def _run_throttle(self) -> None:
        failed = 0
        while not self._stop.is_set():
            before = len(self._throttle_errors)
            self.read_throttle()
            failed = failed + 1 if len(self._throttle_errors) > before else 0
            if failed >= self.THROTTLE_GIVE_UP:
                self._throttle_errors.append(
                    f"throttle reasons not read after {failed} failed reads in a row")
                return
            if self._stop.wait(self.throttle_interval_s):
                return

    def read_throttle(self) -> None:
        """One ``hl-smi -q``: the run's cards' active throttle reasons, accounted and written as one
        line ``{"t", "source": "hl-smi -q", "throttle": {card: [reasons]}}``."""
        try:
            proc = subprocess.Popen(self._throttle_program, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                    stdin=subprocess.DEVNULL, text=True, errors="replace", env=self.env,
                                    start_new_session=True, close_fds=True)
        except OSError as exc:
            self._throttle_errors.append(f"cannot start hl-smi -q: {exc}")
            return
        self._throttle_proc = proc
        try:
            out, _ = proc.communicate(timeout=THROTTLE_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            self._end_child(proc)  # with its whole tree
            self._throttle_errors.append(f"hl-smi -q gave no answer in {THROTTLE_TIMEOUT_S:g} s")
            return
        if self._stop.is_set() and proc.returncode and proc.returncode < 0:
            return  # ended by stop(): not a read
        t = self.clock()
        seen: dict[str, list[str] | None] = {}
        for card in hlsmi.parse_query(out)[1]:
            name, module = query_card_name(card)
            if self.cards and module not in self.cards:
                continue
            seen[name] = throttle_reasons(card)
        if not seen:
            self._throttle_errors.append("hl-smi -q listed none of the run's cards")
            return
        with self._lock:
            for name, reasons in seen.items():
                self.throttle.setdefault(name, ThrottleClock()).add(t, reasons)
        self._write({"t": round(t, 3), "source": "hl-smi -q", "throttle": seen})

    # -- compilations that keep rising after warm-up (Gaudi) ------------------------------------------

    def _run_compile_watch(self) -> None:
        while not self._stop.wait(self.compile_interval_s):
            try:
                self.check_compiles()
            except Exception as exc:  # an observer: the run goes on, and this is said in its note
                self.errors.append(f"compile watch: {exc}")
                return

    def check_compiles(self) -> dict[str, Any] | None:
        """Read the run's new logged steps and its compile meter; the first time compilations are
        found rising after warm-up, write a "warning" event into the run's events.jsonl (once)."""
        from gaudi_gui.core import compile_rise
        from gaudi_gui.core.events import EventFollower, EventWriter
        if self._step_follower is None:
            self._step_follower = EventFollower(self.events_path)
        for event in self._step_follower.read():
            step, when = event.get("step"), _finite(event.get("time"))
            if (event.get("type") in (EventType.METRICS, EventType.STEP) and isinstance(step, int)
                    and not isinstance(step, bool) and when is not None and not event.get("summary")
                    and (not self._steps or step > self._steps[-1][1])):
                self._steps.append((when, step))
        if self.compile_warning is not None:
            return self.compile_warning
        warmup = self.rise_warmup_steps or compile_rise.RISE_WARMUP_STEPS
        finding = compile_rise.compile_rise(compile_rise.compile_timeline(self.compile_base), self._steps,
                                            warmup_steps=warmup)
        if finding is None:
            return None
        finding = compile_rise.named(finding, self.part)
        self.compile_warning = finding
        with contextlib.suppress(OSError), EventWriter(self.events_path) as events:
            events.write(EventType.WARNING, **finding)
        return finding

    # -- RAPL -----------------------------------------------------------------------------------------

    def _run_rapl(self) -> None:
        self._rapl_prev: dict[Path, int] = {}
        self._rapl_t = 0.0
        self._sample_rapl()
        while not self._stop.wait(self.interval_s):
            self._sample_rapl()

    def _sample_rapl(self) -> None:
        prev: dict[Path, int] = getattr(self, "_rapl_prev", {})
        now = self.clock()
        delta_uj, values = 0, {}
        for zone, wrap in rapl_zones():
            try:
                value = int((zone / "energy_uj").read_text().strip())
            except (OSError, ValueError):
                continue
            values[zone] = value
            if zone in prev:
                step = value - prev[zone]
                if step < 0 and wrap:  # the counter wrapped at max_energy_range_uj
                    step += wrap + 1
                delta_uj += max(0, step)  # a wrap of unknown range: that second is lost, not negative
        first = not prev
        self._rapl_prev = values
        watts = None
        if not first and now > self._rapl_t:
            watts = delta_uj / 1e6 / (now - self._rapl_t)
        self._rapl_t = now
        with self._lock:
            self._rapl_energy_uj += delta_uj
            if values:
                self._rapl_span = (self._rapl_span[0] if self._rapl_span else now, now)
            self.accounts.add(now, [{"name": "CPU package", "power_w": watts}] if not first else [])
        record: dict[str, Any] = {"t": round(now, 3), "source": "rapl",
                                  "energy_uj": {z.name: v for z, v in values.items()}}
        if watts is not None:
            record["power_w"] = round(watts, 3)
        self._write(record)



# -- what a person reads (the Training tab, the Runs list, ``runs list``) ------------------------------

class LiveReader:
    """The run's meter.jsonl read as it grows (only the new bytes each time): its power now, the
    energy so far (the same integration as the summary's) and card-hours so far, for the Training
    tab's live strip. A cut last line waits for its end."""

    def __init__(self, folder: str | Path, gap_s: float = GAP_S, started_t: float | None = None) -> None:
        self.path = Path(folder) / METER_NAME
        self.accounts = Accounts(gap_s)
        #: When the run started (its status' ``started_at``): what "the run so far" counts from; None
        #: when unknown (the share covered so far is then not said).
        self.started_t = started_t or None
        self.offset = 0
        self._partial = b""
        self.first_t: float | None = None
        self.last_t: float | None = None
        #: The run's power at the last sample (every card read one), or None.
        self.watts: float | None = None
        self.source = ""
        self.cards: set[str] = set()

    def read(self) -> bool:
        """Take the new samples; True when there were any."""
        try:
            with open(self.path, "rb") as fh:
                fh.seek(self.offset)
                data = fh.read(1 << 22)
        except OSError:
            return False
        if not data:
            return False
        self.offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        took = False
        for line in lines:
            try:
                sample = json.loads(line)
            except ValueError:
                continue
            t = _finite(sample.get("t")) if isinstance(sample, dict) else None
            if t is None:
                continue
            cards = sample.get("cards")
            if isinstance(cards, list):
                cards = [c for c in cards if isinstance(c, dict)]
                self.accounts.add(t, cards)
                powers = [_finite(c.get("power_w")) for c in cards]
                good = [p for p in powers if p is not None and p >= 0]
                self.watts = sum(good) if cards and len(good) == len(cards) else None
                self.cards.update(str(c.get("name")) for c in cards)
            elif sample.get("source") == "rapl":
                watts = _finite(sample.get("power_w"))
                self.accounts.add(t, [{"name": "CPU package", "power_w": watts}] if watts is not None else [])
                self.watts = watts
            else:
                continue  # a throttle read: not power
            self.source = str(sample.get("source") or self.source)
            self.first_t = t if self.first_t is None else self.first_t
            self.last_t = t
            took = True
        return took

    @property
    def energy_j(self) -> float | None:
        return self.accounts.energy()[0]

    @property
    def card_hours(self) -> float | None:
        if not self.cards or self.first_t is None or self.last_t is None or self.source == "rapl":
            return None
        return len(self.cards) * (self.last_t - self.first_t) / 3600

    def coverage(self, now: float) -> float | None:
        """The share of the run so far (``started_t`` to ``now``) its cards' power readings cover, or
        None when the run's start is unknown."""
        if self.started_t is None or now <= self.started_t:
            return None
        count = max(len(self.cards), len(self.accounts.cards), 1)
        covered = sum(a.power.covered_s for a in self.accounts.cards.values())
        return min(1.0, covered / (count * (now - self.started_t)))

    def text(self, now: float | None = None) -> str:
        """'⚡ 205 W now · 1.2 Wh so far · 0.0057 card-hours (hl-smi power integrated)', or '' before the
        first sample. With ``now``: a last reading older than the gap is not "now" ('⚡ no power
        reading for 25 s'), and where the readings cover too little of the run so far (``coverage``,
        the summary's rule) the energy is what they read, not the run's so far."""
        if self.last_t is None:
            return ""
        stale = now is not None and now - self.last_t > self.accounts.gap_s
        parts = [f"⚡ no power reading for {now - self.last_t:.0f} s" if stale and now is not None else
                 f"⚡ {self.watts:.0f} W now" if self.watts is not None else "⚡ power now unknown"]
        energy = self.energy_j
        share = self.coverage(now) if now is not None else None
        status = MEASURED if share is None or self.started_t is None or now is None else coverage_status(
            share, (1 - share) * (now - self.started_t))
        wh = None if energy is None else (
            figure(energy / 3600) if energy < 3600 * 10 else f"{energy / 3600:.0f}")
        if wh is not None and status == MEASURED:
            parts.append(f"{wh} Wh so far")
        elif wh is not None:
            parts.append(f"{wh} Wh read over {share_text(share or 0.0)} of the run so far (energy "
                         f"{status}: not the run's)")
        else:
            parts.append("energy so far: not yet measured")
        hours = self.card_hours
        if hours is not None:
            parts.append(f"{figure(hours)} card-hours")
        return " · ".join(parts)


#: The first logged steps of a launch that the steady-state rate leaves out (at most this many; a
#: tenth of a short run): graph compilation and warm-up make them slow, and an ETA from them is wrong.
WARMUP_STEPS = 10


def rates_of(summary: Mapping[str, Any] | None) -> str:
    """The summary's pace: '1.9 steps/s · 30720 tokens/s (after warm-up)' ('' without one)."""
    pace = (summary or {}).get("rates")
    if not isinstance(pace, Mapping):
        return ""
    text = rates_text(Rates(_finite(pace.get("steps_per_s")), _finite(pace.get("samples_per_s")),
                            _finite(pace.get("tokens_per_s"))))
    if text and not pace.get("steady"):
        text += " (warm-up included)"
    elif text:
        text += " (after warm-up)"
    return text


def figure(value: float) -> str:
    """Two significant digits without an exponent: 0.0113 -> '0.011', 12.3 -> '12', 3.4e-06 ->
    '0.0000034' (a card-hour or a kWh of a short run is small, and '1.1e-05' is not for people)."""
    if not math.isfinite(value) or value == 0:
        return "0"
    digits = max(0, 1 - math.floor(math.log10(abs(value))))
    return f"{value:.{digits}f}"


def not_measured_why(summary: Mapping[str, Any]) -> str:
    """Why a run's energy was not measured (the meter's note), for the words after "not measured"."""
    note = str(summary.get("note") or "").strip()
    return note or "no power readings"


def energy_measured(summary: Mapping[str, Any]) -> bool:
    return _finite(summary.get("energy_j")) is not None


def joules_text(joules: float) -> str:
    """'850 J', '4.0 kJ', '624 kJ', '1.23 kWh' (a kilowatt-hour and more is said in kWh: what a bill
    says)."""
    if joules >= 3.6e6:
        return f"{joules / 3.6e6:.2f} kWh"
    if joules >= 1000:
        return f"{joules / 1000:.1f} kJ" if joules < 1e5 else f"{joules / 1000:.0f} kJ"
    return f"{joules:.0f} J" if joules >= 10 else f"{figure(joules)} J"


def energy_text(summary: Mapping[str, Any], *, why: bool = True) -> str:
    """'4.0 kJ (hl-smi power integrated, covers 98 % of the run)'; a partial coverage 'energy partial:
    2.1 kJ over 48 % of the run (hl-smi power integrated; the whole run's is more)'; 'energy not
    measured (why)': never '0 J' for a run whose energy nobody measured, never a part of the run's
    energy said as if it were all of it. ``why``: the reason after "not measured" (the meter's note)."""
    joules = _finite(summary.get("energy_j"))
    source = summary.get("energy_source") or "source unknown"
    share = _finite(summary.get("energy_coverage"))
    read = _finite(summary.get("energy_read_j"))
    if joules is None and read is not None and summary.get("energy_status") == PARTIAL:
        return (f"energy {PARTIAL}: {joules_text(read)} over {share_text(share or 0.0)} of the run "
                f"({source}; the whole run's is more)")
    if joules is None:
        return f"energy {NOT_MEASURED}" + (f" ({not_measured_why(summary)})" if why else "")
    return f"{joules_text(joules)} ({source}{covers_text(share)})"


def covers_text(share: float | None) -> str:
    """', covers 85 % of the run' after a measured energy whose readings missed more than the run's
    MEASURED_SHARE allows (a short run's edges); '' from MEASURED_SHARE up (the share is in the
    summary's ``energy_coverage``), or for a summary from before shares were kept."""
    return f", covers {share_text(share)} of the run" if share is not None and share < MEASURED_SHARE else ""


def kwh_text(summary: Mapping[str, Any] | None) -> str:
    """The energy column: '0.00069 kWh', 'partial: 0.00013 kWh (48 % of the run)', or 'not measured'
    (also for a run without a meter summary)."""
    summary = summary or {}
    read, share = _finite(summary.get("energy_read_j")), _finite(summary.get("energy_coverage"))
    if summary.get("energy_status") == PARTIAL and read is not None and not energy_measured(summary):
        return f"{PARTIAL}: {figure(read / 3.6e6)} kWh ({share_text(share or 0.0)} of the run)"
    kwh = _finite(summary.get("energy_kwh"))
    if kwh is None or not energy_measured(summary):
        return NOT_MEASURED
    return f"{figure(kwh)} kWh"


def card_hours_text(summary: Mapping[str, Any] | None) -> str:
    """'0.011', or '' when the run has no cards (a CPU run) or no meter summary."""
    hours = _finite((summary or {}).get("card_hours"))
    return "" if hours is None else figure(hours)


def memory_text(mib: float) -> str:
    """'512 MiB' under a GiB, '12.3 GiB' from there."""
    return f"{mib:.0f} MiB" if mib < 1024 else f"{mib / 1024:.1f} GiB"


def true_memory_peak(records: Iterable[Mapping[str, Any]]) -> tuple[float | None, float | None]:
    """(the ranks' true device memory peak, its limit) in MiB over a run's metrics records: what the
    allocator really held (torch.hpu.memory_stats / torch.cuda), not hl-smi's pool; None unmeasured."""
    peak = limit = None
    for record in records:
        value = _finite(record.get("memory_peak_mib"))
        if value is not None and value > 0:
            peak = value if peak is None else max(peak, value)
        cap = _finite(record.get("memory_limit_mib"))
        if cap is not None and cap > 0:
            limit = cap
    return peak, limit


def compile_text(compiled: Mapping[str, Any] | None) -> str:
    """'12 graph compilations (2 after warm-up)' of the Gaudi compile meter ('' without one)."""
    if not compiled or "compilations" not in compiled:
        return ""
    total = int(_finite(compiled.get("compilations")) or 0)
    steady = int(_finite(compiled.get("steady_compilations")) or 0)
    return f"{total} graph compilation{'' if total == 1 else 's'} ({steady} after warm-up)"


def fallback_ops(compiled: Mapping[str, Any] | None) -> list[str]:
    """The ops that fell back to the CPU on any rank (most frequent first where counted)."""
    if not compiled:
        return []
    ops = compiled.get("cpu_fallback_ops")
    names = list(ops) if isinstance(ops, Mapping) else []
    for op in compiled.get("fallback_ops_all_ranks") or []:
        if str(op) not in names:
            names.append(str(op))
    return names


def run_compile(folder: str | Path, summary: Mapping[str, Any] | None = None,
                events: Sequence[Mapping[str, Any]] = ()) -> dict[str, Any] | None:
    """The run's Gaudi compile meter: the one its supervisor put in the summary, else read now from
    the bridge's files in the run folder (a run whose supervisor could not finish, or still running);
    None when the run has none (not a Gaudi run, or the bridge wrote nothing)."""
    compiled = (summary or {}).get("compile")
    if isinstance(compiled, dict) and "compilations" in compiled:
        return compiled
    from gaudi_gui.core import hpu_metrics
    base = Path(folder) / hpu_metrics.FOLDER_NAME / hpu_metrics.FILE_NAME
    found = hpu_metrics.run_summary(base, events) if base.parent.is_dir() else None
    if found and "compilations" in found:
        return found
    # A Slurm job not combined yet (still running, or ended before its batch shell did): each node's
    # ranks wrote into nodes/<node>/hpu-metrics/; the node that compiled most sets the pace.
    nodes: list[tuple[str, Mapping[str, Any]]] = []
    with contextlib.suppress(OSError):
        for part in sorted(p for p in (Path(folder) / NODES_DIR).iterdir() if p.is_dir()):
            node_base = part / hpu_metrics.FOLDER_NAME / hpu_metrics.FILE_NAME
            if node_base.parent.is_dir():
                nodes.append((part.name, {"compile": hpu_metrics.run_summary(node_base, events)}))
    return _combined_compile(nodes) if nodes else None


def meter_line(summary: Mapping[str, Any], *, true_peak_mib: float | None = None,
               compiled: Mapping[str, Any] | None = None) -> str:
    """The Training tab's line under a run's status: '2 cards · 0.011 card-hours · 4.0 kJ (hl-smi power
    integrated) · mean 205 W · util 87 % · peak device memory 12.3 GiB (true: 9.8 GiB) · 12 graph
    compilations (2 after warm-up)'; 'energy not measured (why)' where nobody measured it."""
    parts: list[str] = []
    kind = str(summary.get("kind") or "hpu")
    cards = summary.get("cards") or list(summary.get("per_card") or {})
    if kind == "cpu":
        parts.append("CPU")
    elif cards:
        noun = "GPU" if kind == "cuda" else "card"
        parts.append(f"{len(cards)} {noun}{'' if len(cards) == 1 else 's'}")
    hours = card_hours_text(summary)
    if hours:
        parts.append(f"{hours} card-hours")
    parts.append(energy_text(summary))
    mean = _finite(summary.get("power_mean_w"))
    if mean is not None and energy_measured(summary):
        parts.append(f"mean {mean:.0f} W")
    util = _finite(summary.get("utilization_mean"))
    if util is not None:
        parts.append(f"util {util:.0f} %")
    seen = _finite(summary.get("memory_used_peak_mib"))
    if seen is not None or true_peak_mib is not None:
        words = "peak device memory " + (memory_text(seen) if seen is not None else "–")
        if true_peak_mib is not None:
            words += f" (true: {memory_text(true_peak_mib)})"
        parts.append(words)
    throttled = throttle_text(summary.get("throttle"))
    if throttled:
        parts.append(throttled)
    compiled_words = compile_text(compiled)
    if compiled_words:
        parts.append(compiled_words)
    return " · ".join(parts)


def short(summary: Mapping[str, Any] | None) -> str:
    """``runs list``'s meter column: '0.011 card-h · 0.00069 kWh', 'energy not measured', or '–' for a
    run without a meter summary (an older run, or one still running)."""
    if not summary:
        return "–"
    hours = card_hours_text(summary)
    energy = kwh_text(summary)
    words = energy if energy != NOT_MEASURED else f"energy {NOT_MEASURED}"
    per_1k = _finite(summary.get("energy_per_1k_tokens_wh"))
    if per_1k is not None:  # a Serve or Evaluate run: what the energy bought
        words += f" · {figure(per_1k)} Wh/1k tok"
    return f"{hours} card-h · {words}" if hours else words


@dataclass(frozen=True)
class Rates:
    """A run's pace. ``steady``: from the steps after warm-up only (``from_step`` on); otherwise the
    worker's own averages since training began (warm-up included) and no ETA."""

    steps_per_s: float | None = None
    samples_per_s: float | None = None
    tokens_per_s: float | None = None
    eta_s: float | None = None
    steady: bool = False
    warmup_steps: int = 1
    from_step: int | None = None


def warmup_steps(max_steps: int) -> int:
    """How many first steps of a launch the steady rate leaves out: a tenth of the run, 1 to 10."""
    return max(1, min(WARMUP_STEPS, max_steps // 10)) if max_steps > 0 else 1


def _done(record: Mapping[str, Any], rate_key: str, count_key: str = "") -> float | None:
    """How many samples / tokens were done by this record: its own count, else rate x elapsed."""
    if count_key:
        count = _finite(record.get(count_key))
        if count is not None:
            return count
    rate, elapsed = _finite(record.get(rate_key)), _finite(record.get("elapsed"))
    return None if rate is None or elapsed is None else rate * elapsed


def rates(records: Sequence[Mapping[str, Any]], *, max_steps: int = 0, start_step: int = 0) -> Rates:
    """The pace of the launch whose metrics records these are (``elapsed``: seconds since it began
    training; ``start_step``: where it began, a resumed run's checkpoint). The first
    ``warmup_steps(max_steps)`` steps are left out (compilation, warm-up): the rates and the ETA come
    from the records after them; until two such records exist, the worker's averages and no ETA."""
    points: list[Mapping[str, Any]] = []
    for record in records:
        step, elapsed = record.get("step"), _finite(record.get("elapsed"))
        if record.get("summary") or not isinstance(step, int) or isinstance(step, bool) or elapsed is None:
            continue
        if points and (step <= points[-1]["step"] or elapsed <= float(points[-1]["elapsed"])):
            continue  # an evaluation's record at the same step, or a record out of order
        points.append(record)
    skip = warmup_steps(max_steps)
    if not points:
        return Rates(warmup_steps=skip)
    steady = [p for p in points if int(p["step"]) >= start_step + skip]
    last = points[-1]
    if len(steady) < 2:
        return Rates(_finite(last.get("throughput")), _finite(last.get("samples_per_second")),
                     _finite(last.get("tokens_per_second")), None, False, skip)
    a, b = steady[0], steady[-1]
    dt = float(b["elapsed"]) - float(a["elapsed"])
    steps = (int(b["step"]) - int(a["step"])) / dt

    def per_s(rate_key: str, count_key: str = "") -> float | None:
        x, y = _done(a, rate_key, count_key), _done(b, rate_key, count_key)
        return None if x is None or y is None or y < x else (y - x) / dt

    eta = max(0.0, (max_steps - int(b["step"])) / steps) if max_steps > 0 and steps > 0 else None
    return Rates(steps, per_s("samples_per_second"), per_s("tokens_per_second", "tokens_seen"), eta, True,
                 skip, int(a["step"]))


def rates_text(r: Rates) -> str:
    """'2.1 steps/s · 4.2 samples/s · 530 tokens/s' (those the metrics have)."""
    parts = []
    for value, unit in ((r.steps_per_s, "steps/s"), (r.samples_per_s, "samples/s"),
                        (r.tokens_per_s, "tokens/s")):
        if value is not None and value > 0:
            parts.append(f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}")
    return " · ".join(parts)


def _clean(value: float | None) -> float | None:
    v = _finite(value)
    return None if v is None else round(v, 3)


__all__ = ["COMPILE_WATCH_S", "EDGE_S", "GAP_S", "HLSMI_FIELDS", "INTERVAL_S", "JOB_SUMMARY_NAME", "MEASURED",
           "MEASURED_SHARE", "METER_NAME", "NOT_MEASURED", "PARTIAL", "PARTIAL_SHARE", "RAPL_ROOT",
           "SOURCE_HLML", "SOURCE_HLSMI", "SOURCE_NVIDIA", "SOURCE_NVML", "SOURCE_RAPL", "SUMMARY_NAME",
           "THROTTLE_INTERVAL_S", "THROTTLE_REASONS", "WARMUP_STEPS", "Accounts", "CardAccount",
           "EnergyCounter", "LiveReader", "Meter", "PowerIntegrator", "Rates", "ThrottleClock",
           "card_hours_text", "combine", "combined_line", "compile_text", "counter_text", "coverage_status",
           "covers_text", "describe", "energy_counter", "energy_measured", "energy_text", "fallback_ops",
           "figure", "generated_tokens", "is_job_summary", "joules_text", "keep_job_summary", "kwh_text",
           "memory_text", "meter_line", "not_measured_why", "outcome_words", "parse_ids", "query_card_name",
           "rapl_root", "rapl_zones", "rates", "rates_of", "rates_text", "read_job_summary", "read_summary",
           "recorded_cards", "run_compile", "share_text", "short", "summarize", "throttle_reasons",
           "throttle_summary", "throttle_text", "token_figures", "tokens_text", "true_memory_peak",
           "warmup_steps", "with_counter"]

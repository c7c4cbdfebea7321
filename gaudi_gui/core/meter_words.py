"""The run meter in words: what the Training tab, the Runs list, ``runs list`` and the job's views
say of a run's meter summary (its energy with its source and coverage, card-hours, power, throttling,
compilations, tokens, pace). Never '0 J' for a run whose energy nobody measured, never a part of a
run's energy said as if it were all of it. Qt-free and torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from gaudi_gui.core.devices import cards_name
from gaudi_gui.core.meter_account import (
    MEASURED_SHARE,
    NOT_MEASURED,
    PARTIAL,
    THROTTLE_INTERVAL_S,
    energy_measured,
    finite,
    share_text,
)
from gaudi_gui.core.meter_work import Rates


def throttle_text(throttle: Mapping[str, Any] | None) -> str:
    """'throttled 12 s (40 % of the run): module 3 power 12 s' / 'not throttled (hl-smi -q every 5 s)'
    / '' when the run has no throttle reads (not a Gaudi run)."""
    if not throttle:
        return ""
    seconds = finite(throttle.get("throttled_s"))
    if seconds is None:
        return f"throttling not measured ({throttle.get('note') or 'no reads'})"
    every = finite(throttle.get("interval_s")) or THROTTLE_INTERVAL_S
    if seconds <= 0:
        return f"not throttled (hl-smi -q every {every:g} s)"
    parts = []
    for name, card in (throttle.get("per_card") or {}).items():
        reasons = card.get("by_reason_s") or {}
        said = ", ".join(f"{r} {v:.0f} s" for r, v in reasons.items() if v > 0)
        if said:
            parts.append(f"{name} {said}")
    share = finite(throttle.get("fraction"))
    text = f"throttled {seconds:.0f} s" + (f" ({100 * share:.0f} % of the run)" if share is not None else "")
    return f"{text}: {'; '.join(parts)}" if parts else text


def combined_line(summary: Mapping[str, Any]) -> str:
    """'the whole job (2 parts): 0.011 card-hours · 4.0 kJ (hl-smi power integrated) · mean 410 W · 3.1 s'."""
    parts = summary.get("parts") or []
    words = [f"the whole job ({len(parts)} part{'' if len(parts) == 1 else 's'}: "
             f"{', '.join(str(p.get('name')) for p in parts)})"]
    hours = card_hours_text(summary)
    if hours:
        words.append(f"{hours} card-hours")
    joules = finite(summary.get("energy_j"))
    words.append(energy_text(summary, why=False))
    mean = finite(summary.get("power_mean_w"))
    if mean is not None and joules is not None:
        words.append(f"mean {mean:.0f} W")
    wall = finite(summary.get("wall_s"))
    if wall is not None:
        words.append(f"{wall:.1f} s")
    throttled = finite(summary.get("throttled_s"))
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
    wall = finite(summary.get("wall_s"))
    if wall is not None:
        parts.append(f"{wall:.1f} s")
    card_hours = finite(summary.get("card_hours"))
    if card_hours is not None:
        parts.append(f"{card_hours:.4g} card-hours")
    energy = finite(summary.get("energy_j"))
    source = summary.get("energy_source") or NOT_MEASURED
    share = finite(summary.get("energy_coverage"))
    if energy is None:
        parts.append(energy_text(summary, why=False))  # the why is the note, at the line's end
    else:
        parts.append(f"{energy:.4g} J ({finite(summary.get('energy_kwh')) or 0:.3g} kWh, {source}"
                     f"{covers_text(share)})")
    if counter_text(summary):
        parts.append(counter_text(summary))
    mean, peak = finite(summary.get("power_mean_w")), finite(summary.get("power_peak_w"))
    if mean is not None or peak is not None:
        parts.append(" ".join(p for p in (f"mean {mean:.0f} W" if mean is not None else "",
                                          f"peak {peak:.0f} W" if peak is not None else "") if p))
    util = finite(summary.get("utilization_mean"))
    if util is not None:
        parts.append(f"utilization {util:.0f} %")
    mem_peak = finite(summary.get("memory_used_peak_mib"))
    mem_mean = finite(summary.get("memory_used_mean_mib"))
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


def tokens_text(summary: Mapping[str, Any] | None) -> str:
    """'1,234 tokens generated · 0.31 Wh per 1,000 tokens · 12 tokens/s (over the run)'; 'Wh per
    1,000 tokens not measured (why)'; '' for a summary without tokens (a training run)."""
    if not summary or "generated_tokens" not in summary:
        return ""
    words = []
    tokens = finite(summary.get("generated_tokens"))
    if tokens is not None:
        words.append(f"{tokens:,.0f} tokens generated")
    per_1k = finite(summary.get("energy_per_1k_tokens_wh"))
    words.append(f"{figure(per_1k)} Wh per 1,000 tokens" if per_1k is not None else
                 f"Wh per 1,000 tokens {NOT_MEASURED} ({summary.get('per_1k_tokens_note') or 'no tokens'})")
    rate = finite(summary.get("tokens_per_s"))
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
        tokens = finite(summary.get("generated_tokens"))
        if tokens is not None:
            words.append(f"{tokens:,.0f} tokens generated")
        per_1k = finite(summary.get("energy_per_1k_tokens_wh"))
        words.append(f"{figure(per_1k)} Wh per 1,000 tokens" if per_1k is not None
                     else f"Wh per 1,000 tokens {NOT_MEASURED}")
    return " · ".join(words)


def counter_text(summary: Mapping[str, Any]) -> str:
    """'NVML counter 2.1 kJ (integrated +1.2 %)' beside the integrated figure ('' without a counter)."""
    counter = summary.get("energy_counter")
    if not isinstance(counter, Mapping):
        return ""
    name = str(counter.get("source") or "").upper()
    joules = finite(counter.get("energy_j"))
    if joules is None:
        return f"{name} counter: {NOT_MEASURED}" + (f" ({counter['note']})" if counter.get("note") else "")
    text = f"{name} counter {joules_text(joules)}"
    diff = finite(counter.get("integrated_diff_pct"))
    if diff is not None:
        text += f" (integrated {diff:+.1f} %)"
    return text


def rates_of(summary: Mapping[str, Any] | None) -> str:
    """The summary's pace: '1.9 steps/s · 30720 tokens/s (after warm-up)' ('' without one)."""
    pace = (summary or {}).get("rates")
    if not isinstance(pace, Mapping):
        return ""
    text = rates_text(Rates(finite(pace.get("steps_per_s")), finite(pace.get("samples_per_s")),
                            finite(pace.get("tokens_per_s"))))
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
    joules = finite(summary.get("energy_j"))
    source = summary.get("energy_source") or "source unknown"
    share = finite(summary.get("energy_coverage"))
    read = finite(summary.get("energy_read_j"))
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
    read, share = finite(summary.get("energy_read_j")), finite(summary.get("energy_coverage"))
    if summary.get("energy_status") == PARTIAL and read is not None and not energy_measured(summary):
        return f"{PARTIAL}: {figure(read / 3.6e6)} kWh ({share_text(share or 0.0)} of the run)"
    kwh = finite(summary.get("energy_kwh"))
    if kwh is None or not energy_measured(summary):
        return NOT_MEASURED
    return f"{figure(kwh)} kWh"


def card_hours_text(summary: Mapping[str, Any] | None) -> str:
    """'0.011', or '' when the run has no cards (a CPU run) or no meter summary."""
    hours = finite((summary or {}).get("card_hours"))
    return "" if hours is None else figure(hours)


def memory_text(mib: float) -> str:
    """'512 MiB' under a GiB, '12.3 GiB' from there."""
    return f"{mib:.0f} MiB" if mib < 1024 else f"{mib / 1024:.1f} GiB"


def compile_text(compiled: Mapping[str, Any] | None) -> str:
    """'12 graph compilations (2 after warm-up)' of the Gaudi compile meter ('' without one)."""
    if not compiled or "compilations" not in compiled:
        return ""
    total = int(finite(compiled.get("compilations")) or 0)
    steady = int(finite(compiled.get("steady_compilations")) or 0)
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
    mean = finite(summary.get("power_mean_w"))
    if mean is not None and energy_measured(summary):
        parts.append(f"mean {mean:.0f} W")
    util = finite(summary.get("utilization_mean"))
    if util is not None:
        parts.append(f"util {util:.0f} %")
    seen = finite(summary.get("memory_used_peak_mib"))
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
    per_1k = finite(summary.get("energy_per_1k_tokens_wh"))
    if per_1k is not None:  # a Serve or Evaluate run: what the energy bought
        words += f" · {figure(per_1k)} Wh/1k tok"
    return f"{hours} card-h · {words}" if hours else words


def rates_text(r: Rates) -> str:
    """'2.1 steps/s · 4.2 samples/s · 530 tokens/s' (those the metrics have)."""
    parts = []
    for value, unit in ((r.steps_per_s, "steps/s"), (r.samples_per_s, "samples/s"),
                        (r.tokens_per_s, "tokens/s")):
        if value is not None and value > 0:
            parts.append(f"{value:.3g} {unit}" if value < 100 else f"{value:.0f} {unit}")
    return " · ".join(parts)

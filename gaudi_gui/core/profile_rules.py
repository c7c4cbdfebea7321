"""A profile's numbers as sentences a user can act on (issue 40, part 4). Qt-free, torch-free.

Each rule reads a profile summary as ``core.profile.read`` gives it and says one sentence, or nothing:
a rule fires only on evidence the summary holds (a CPU run has no graph compilations to speak of, a
one-card run no neighbours, a one-process run no all-reduce), and then says the number it rests on
and the setting that addresses it. :func:`sentences` runs them all, in the order a user should act.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Callable, Mapping, Sequence
from typing import Any

#: Graph compilation this share of the profiled step time (or more) is worth a sentence.
COMPILE_SHARE = 0.10
#: The data loader's share of step time from which the host is the bottleneck.
DATALOADER_SHARE = 0.20
#: A card busy less than this share of the step leaves the host setting the pace.
DEVICE_BUSY_SHARE = 0.50
#: Collectives (all-reduce …) this share of the step or more.
COLLECTIVE_SHARE = 0.25
#: A card this much below its neighbours' median power, while the hottest of them, is slowed down.
CARD_SLOWER = 0.15
#: Throttle reasons that are heat or power (hl-smi -q's words, lower case; others are said as read).
_THERMAL = ("thermal", "temperature", "power", "hw slowdown", "sw slowdown")


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _pct(share: float) -> str:
    return f"{round(share * 100):d} %"


def _step_s(summary: Mapping[str, Any]) -> float | None:
    total = _num(summary.get("step_total_ms"))
    return total / 1000 if total and total > 0 else None


def compile_rule(summary: Mapping[str, Any]) -> str | None:
    """Graph compilations during the profiled steps (the meter's count and time, Gaudi)."""
    found = summary.get("compilations")
    step_s = _step_s(summary)
    if not isinstance(found, Mapping) or step_s is None:
        return None
    seconds = _num(found.get("seconds")) or 0.0
    count = int(_num(found.get("count")) or 0)
    steps = int(_num(summary.get("steps")) or 0)
    share = seconds / step_s
    if count <= 0 or (share < COMPILE_SHARE and count < max(1, steps)):
        return None
    said = f"{_pct(min(share, 1.0))} of step time is graph compilation" if share >= COMPILE_SHARE else \
        f"{count} graph compilations in {steps} profiled steps"
    return (f"{said} ({count} in {steps} steps): shapes change every step — pad to fixed lengths "
            f"(pad_to_multiple_of, a fixed max_length) and keep padding_free off")


def host_rule(summary: Mapping[str, Any]) -> str | None:
    """The host sets the pace: the data loader's share of the step, or a card idle most of it."""
    step_ms = _num(summary.get("step_total_ms"))
    if not step_ms:
        return None
    loader = (_num(summary.get("dataloader_ms")) or 0.0) / step_ms
    if loader >= DATALOADER_SHARE:
        return (f"host time dominates: the data loader takes {_pct(min(loader, 1.0))} of step time and is "
                f"the bottleneck — load in parallel (dataloader_num_workers, dataloader_pin_memory) or "
                f"tokenize ahead of training")
    device = _num(summary.get("device_ms"))
    if device is not None and device / step_ms < DEVICE_BUSY_SHARE:
        return (f"host time dominates: the card is busy only {_pct(device / step_ms)} of each step — the "
                f"host (Python, the data loader) sets the pace: a larger per_device_train_batch_size, "
                f"dataloader_num_workers")
    return None


def card_rule(summary: Mapping[str, Any]) -> str | None:
    """A card slower than its neighbours (the meter's per-card figures in the profiled window): throttle
    reasons read then, or the hottest card drawing clearly less power than the others' median."""
    cards = [c for c in summary.get("cards") or []
             if isinstance(c, Mapping) and isinstance(c.get("name"), str)]
    for card in cards:
        reasons = [str(r) for r in card.get("throttle") or []]
        thermal = [r for r in reasons if any(word in r.lower() for word in _THERMAL)]
        if thermal:
            return (f"{card['name']} was throttled during the profiled steps ({', '.join(thermal)}): a "
                    f"thermal or power slowdown sets the pace of every card — check its cooling and power "
                    f"limit (gaudi-gui doctor)")
    if len(cards) < 3:
        return None  # one neighbour is no majority to compare with
    for card in cards:
        power, temp = _num(card.get("power_w")), _num(card.get("temperature_c"))
        others = [p for c in cards if c is not card and (p := _num(c.get("power_w"))) is not None]
        temps = [t for c in cards if c is not card and (t := _num(c.get("temperature_c"))) is not None]
        if power is None or temp is None or len(others) < 2 or not temps:
            continue
        median = statistics.median(others)
        if median > 0 and power < median * (1 - CARD_SLOWER) and temp > max(temps):
            return (f"{card['name']} draws {_pct(1 - power / median)} less power than its neighbours while "
                    f"it is the hottest ({temp:.0f} °C): a thermal slowdown — check its cooling "
                    f"(gaudi-gui doctor)")
    return None


def collective_rule(summary: Mapping[str, Any]) -> str | None:
    """All-reduce (and the other collectives) taking a large share of the step."""
    step_ms = _num(summary.get("step_total_ms"))
    collective = _num(summary.get("collective_ms"))
    if not step_ms or not collective:
        return None
    share = collective / step_ms
    if share < COLLECTIVE_SHARE:
        return None
    return (f"all-reduce takes {_pct(min(share, 1.0))} of the step: fewer, larger steps "
            f"(gradient_accumulation_steps) send the gradients less often")


RULES: Sequence[Callable[[Mapping[str, Any]], str | None]] = (compile_rule, host_rule, card_rule,
                                                              collective_rule)


def sentences(summary: Mapping[str, Any]) -> list[str]:
    """What every rule says about ``summary`` (nothing where no rule has evidence)."""
    return [said for rule in RULES if (said := rule(summary))]


__all__ = ["RULES", "card_rule", "collective_rule", "compile_rule", "host_rule", "sentences"]

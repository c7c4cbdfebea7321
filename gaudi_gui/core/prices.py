"""What a run cost in money: its meter's energy and card-hours at the prices the user set.

The prices are the app's settings ``meter/price_per_kwh``, ``meter/price_per_card_hour`` and
``meter/currency`` (``services.settings``, the Runs list's *Prices…*). The command line reads the same
settings file (``settings.ini`` in ``paths.config_dir()``, QSettings' INI format: one source for the app
and ``gaudi-gui runs show``), and ``GAUDI_GUI_PRICE_KWH`` / ``GAUDI_GUI_PRICE_CARD_HOUR`` /
``GAUDI_GUI_CURRENCY`` or ``runs show --price-kwh/--price-card-hour/--currency`` override it.

A price of 0 or none is "not set": no cost is shown. A part whose figure was not measured (the energy
of a run nobody measured) is left out of the cost and said, never counted as 0. Qt-free and
torch-free.
"""

from __future__ import annotations

import configparser
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gaudi_gui.core import paths

SETTINGS_NAME = "settings.ini"


def _price(value: Any) -> float | None:
    """A price: a finite number above 0, else None (not set)."""
    try:
        number = float(value)
    except (TypeError, ValueError):
        return None
    return number if math.isfinite(number) and number > 0 else None


@dataclass(frozen=True)
class Prices:
    per_kwh: float | None = None
    per_card_hour: float | None = None
    currency: str = ""

    @property
    def any(self) -> bool:
        """Whether any price is set (no price: no cost shown anywhere)."""
        return self.per_kwh is not None or self.per_card_hour is not None

    @classmethod
    def of(cls, per_kwh: Any = None, per_card_hour: Any = None, currency: Any = "") -> Prices:
        return cls(_price(per_kwh), _price(per_card_hour), str(currency or "").strip())


def _ini_value(raw: str) -> str:
    """A value as QSettings' INI format writes it: a string with special characters is quoted, with
    backslash escapes inside."""
    raw = raw.strip()
    if len(raw) >= 2 and raw[0] == raw[-1] == '"':
        out, chars = [], iter(raw[1:-1])
        for ch in chars:
            if ch == "\\":
                nxt = next(chars, "")
                out.append({"n": "\n", "t": "\t", "r": "\r"}.get(nxt, nxt))
            else:
                out.append(ch)
        return "".join(out)
    return raw


def from_settings(path: str | Path | None = None) -> Prices:
    """The prices the app's settings hold (Prices() when none are set or the file cannot be read)."""
    parser = configparser.ConfigParser(interpolation=None)
    try:
        with open(path or paths.config_dir() / SETTINGS_NAME, encoding="utf-8") as handle:
            parser.read_file(handle)
    except (OSError, configparser.Error, UnicodeDecodeError):
        return Prices()
    if not parser.has_section("meter"):
        return Prices()
    section = parser["meter"]
    return Prices.of(_ini_value(section.get("price_per_kwh", "")),
                     _ini_value(section.get("price_per_card_hour", "")),
                     _ini_value(section.get("currency", "")))


def current(env: Mapping[str, str] | None = None, *, per_kwh: float | None = None,
            per_card_hour: float | None = None, currency: str | None = None) -> Prices:
    """The prices in force for the command line: the arguments given, else the environment
    (``GAUDI_GUI_PRICE_KWH`` …), else the app's settings."""
    env = os.environ if env is None else env
    saved = from_settings()
    return Prices.of(
        per_kwh if per_kwh is not None else env.get("GAUDI_GUI_PRICE_KWH") or saved.per_kwh,
        per_card_hour if per_card_hour is not None else env.get("GAUDI_GUI_PRICE_CARD_HOUR")
        or saved.per_card_hour,
        currency if currency is not None else env.get("GAUDI_GUI_CURRENCY") or saved.currency)


def _finite(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def cost(summary: Mapping[str, Any] | None, prices: Prices) -> dict[str, Any] | None:
    """The run's cost at ``prices``: {"total", "energy", "cards", "currency", "missing"} (each part
    None where its price is not set or its figure was not measured; ``missing`` names the parts left
    out for want of a measurement); None when no price is set, the run has no meter summary, or
    nothing could be priced."""
    if not prices.any or not summary:
        return None
    missing: list[str] = []
    energy = cards = None
    if prices.per_kwh is not None:
        kwh = _finite(summary.get("energy_kwh"))
        if kwh is None or _finite(summary.get("energy_j")) is None:
            missing.append("energy not measured")
        else:
            energy = kwh * prices.per_kwh
    if prices.per_card_hour is not None:
        hours = _finite(summary.get("card_hours"))
        if hours is None:
            missing.append("no card-hours (no cards)")
        else:
            cards = hours * prices.per_card_hour
    if energy is None and cards is None:
        return None if not missing else {"total": None, "energy": None, "cards": None,
                                         "currency": prices.currency, "missing": missing}
    return {"total": (energy or 0.0) + (cards or 0.0), "energy": energy, "cards": cards,
            "currency": prices.currency, "missing": missing}


def money(amount: float, currency: str = "") -> str:
    """'1.23 EUR', '0.011 EUR', '0.0042 EUR' (a short run's cost is small: two significant digits
    under 1)."""
    if amount == 0:
        text = "0"
    elif abs(amount) >= 1:
        text = f"{amount:.2f}"
    else:
        digits = max(2, 1 - math.floor(math.log10(abs(amount))))
        text = f"{amount:.{digits}f}"
    return f"{text} {currency}".strip()


def cost_text(summary: Mapping[str, Any] | None, prices: Prices) -> str:
    """'cost 1.23 EUR (energy 0.05 EUR + 0.83 card-hours 1.18 EUR)'; 'cost not known (energy not
    measured)' where the only price set has nothing to price; '' when no price is set."""
    found = cost(summary, prices)
    if found is None:
        return ""
    if found["total"] is None:
        return f"cost not known ({'; '.join(found['missing'])})"
    parts = []
    if found["energy"] is not None:
        parts.append(f"energy {money(found['energy'], prices.currency)}")
    if found["cards"] is not None:
        parts.append(f"card-hours {money(found['cards'], prices.currency)}")
    text = f"cost {money(found['total'], prices.currency)} ({' + '.join(parts)}"
    if found["missing"]:
        text += f"; not counted: {'; '.join(found['missing'])}"
    return text + ")"


__all__ = ["SETTINGS_NAME", "Prices", "cost", "cost_text", "current", "from_settings", "money"]

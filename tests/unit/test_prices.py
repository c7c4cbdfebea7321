"""A run's cost from its meter at the prices set (issue 27): unset prices show no cost; energy nobody
measured is left out and said, never priced as 0; the command line reads the app's settings file."""

from __future__ import annotations

from pathlib import Path

import pytest

from gaudi_gui.core import prices
from gaudi_gui.core.prices import Prices

MEASURED = {"energy_j": 3.6e6, "energy_kwh": 1.0, "card_hours": 2.0,
            "energy_source": "hl-smi power integrated"}
UNMEASURED = {"energy_j": None, "energy_kwh": None, "card_hours": 2.0, "energy_source": "not measured"}


def test_no_price_set_no_cost() -> None:
    assert prices.cost(MEASURED, Prices()) is None and prices.cost_text(MEASURED, Prices()) == ""
    assert prices.cost(MEASURED, Prices.of(0, 0, "EUR")) is None  # 0 is "not set"
    assert prices.cost(None, Prices.of(0.3, 1.5)) is None


def test_energy_and_card_hours_priced() -> None:
    p = Prices.of(0.30, 1.25, "EUR")
    found = prices.cost(MEASURED, p)
    assert found is not None and found["total"] == pytest.approx(0.30 + 2.5) and found["missing"] == []
    assert prices.cost_text(MEASURED, p) == "cost 2.80 EUR (energy 0.30 EUR + card-hours 2.50 EUR)"
    assert prices.money(0.0111, "EUR") == "0.011 EUR" and prices.money(12.345) == "12.35"
    assert prices.money(0.000123, "EUR") == "0.00012 EUR"


def test_unmeasured_energy_is_left_out_never_0() -> None:
    p = Prices.of(0.30, 1.25, "USD")
    found = prices.cost(UNMEASURED, p)
    assert found is not None and found["energy"] is None and found["total"] == pytest.approx(2.5)
    assert "not counted: energy not measured" in prices.cost_text(UNMEASURED, p)
    only_kwh = Prices.of(0.30, None, "USD")
    assert prices.cost_text(UNMEASURED, only_kwh) == "cost not known (energy not measured)"


def test_the_command_line_reads_the_apps_settings_file(tmp_path: Path) -> None:
    ini = tmp_path / "settings.ini"
    # As QSettings writes it: a string with special characters quoted.
    ini.write_text('[meter]\ncurrency="\\u20ac (EUR), x"\nprice_per_card_hour=1.25\nprice_per_kwh=0.3\n'
                   .replace("\\u20ac", "€"), encoding="utf-8")
    assert prices.from_settings(ini) == Prices(0.3, 1.25, "€ (EUR), x")
    assert prices.from_settings(tmp_path / "none.ini") == Prices()

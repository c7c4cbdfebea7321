"""Prices…: the price of a kWh and of a card-hour (and their currency) that turn a run's meter into a
cost (the Runs list's tooltips, Compare, ``gaudi-gui runs show``). 0 means not set: no cost is shown."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core.prices import Prices
from gaudi_gui.services.settings import Settings

KEYS = ("meter/price_per_kwh", "meter/price_per_card_hour", "meter/currency")


def prices_of(settings: Settings) -> Prices:
    """The prices the settings hold (0: not set)."""
    return Prices.of(*(settings.get(key) for key in KEYS))


class PricesDialog(QDialog):
    #: The prices were saved (the Runs list shows the new costs).
    prices_changed = Signal()

    def __init__(self, settings: Settings, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Prices")
        self.settings = settings
        self.per_kwh = self._price("per kWh")
        self.per_card_hour = self._price("per card-hour")
        self.currency = QLineEdit(self)
        self.currency.setPlaceholderText("EUR, USD, €…")
        self.currency.setMaxLength(16)
        self.per_kwh.setValue(float(settings.get(KEYS[0])))
        self.per_card_hour.setValue(float(settings.get(KEYS[1])))
        self.currency.setText(str(settings.get(KEYS[2])))
        form = QFormLayout()
        form.addRow("price of a kWh", self.per_kwh)
        form.addRow("price of a card-hour", self.per_card_hour)
        form.addRow("currency", self.currency)
        about = QLabel("A run's cost is its metered energy × the price of a kWh plus its card-hours × the "
                       "price of a card-hour. 0: not set (no cost is shown). Energy nobody measured is "
                       "left out of the cost and said, never counted as 0.", self)
        about.setWordWrap(True)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Save
                                        | QDialogButtonBox.StandardButton.Cancel, self)
        self.buttons.accepted.connect(self._save)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(about)
        layout.addWidget(self.buttons)

    def _price(self, suffix: str) -> QDoubleSpinBox:
        box = QDoubleSpinBox(self)
        box.setRange(0.0, 1e6)
        box.setDecimals(4)
        box.setSingleStep(0.01)
        box.setSpecialValueText("not set")  # shown at 0
        box.setSuffix(f" {suffix}")
        return box

    def _save(self) -> None:
        self.settings.set(KEYS[0], float(self.per_kwh.value()))
        self.settings.set(KEYS[1], float(self.per_card_hour.value()))
        self.settings.set(KEYS[2], self.currency.text().strip())
        self.settings.sync()  # `gaudi-gui runs show` reads the same file
        self.prices_changed.emit()
        self.accept()


__all__ = ["KEYS", "PricesDialog", "prices_of"]

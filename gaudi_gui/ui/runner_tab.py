"""PLACEHOLDER: replaced by the issue that builds this tab."""

from __future__ import annotations

from PySide6.QtWidgets import QLabel, QVBoxLayout, QWidget

from gaudi_gui.services.context import AppServices


class RunnerTab(QWidget):
    def __init__(self, services: AppServices, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        QVBoxLayout(self).addWidget(QLabel("runner"))

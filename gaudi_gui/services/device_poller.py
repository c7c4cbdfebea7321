"""PLACEHOLDER (issue 3 replaces this file): the hl-smi poller."""

from __future__ import annotations

from PySide6.QtCore import QObject

from gaudi_gui.services.device_selection import DeviceSelection
from gaudi_gui.services.settings import Settings


class DevicePoller(QObject):
    def __init__(self, settings: Settings, selection: DeviceSelection, parent: QObject | None = None) -> None:
        super().__init__(parent)

    def start(self) -> None:
        pass

    def stop(self) -> None:
        pass

"""The Environment tab: versions (gaudi-gui, Gaudi driver and firmware, optional packages) and Copy."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any, cast

from PySide6.QtCore import Qt
from PySide6.QtGui import QGuiApplication

from gaudi_gui.services.context import AppServices
from gaudi_gui.services.environment_probe import EnvironmentProbe
from gaudi_gui.ui.environment_tab import EnvironmentTab


def _info() -> dict[str, Any]:
    return {
        "gaudi_gui_version": "0.1.0", "python": "3.11.7", "executable": "/venv/bin/python",
        "platform": "Linux", "device": "hpu", "hpu_count": 8, "cuda_count": 0,
        "is_torch_hpu_available": True, "habana_frameworks": True, "probe_seconds": 1.0,
        "packages": {"torch": "2.6.0+hpu", "transformers": "5.24.0", "accelerate": "1.16.0"},
        "optional_packages": {"deepspeed": "0.16.1+hpu", "optimum-habana": None},
        "gaudi": {"driver_version": "1.18.0-ee698fb", "firmware_version": "53.1.1.1",
                  "hl_smi_version": "hl-1.18.0-fw-53.1.1.1", "error": None},
        "env": {"PT_ENABLE_INT64_SUPPORT": "1"}, "errors": {}, "warnings": [],
    }


def _tab(qtbot: Any) -> EnvironmentTab:
    services = cast(AppServices, SimpleNamespace(environment=EnvironmentProbe()))
    tab = EnvironmentTab(services)
    qtbot.addWidget(tab)
    tab.show()
    return tab


def _column(table: Any, column: int) -> list[str]:
    return [table.item(r, column).text() for r in range(table.rowCount())]


def test_versions_driver_firmware_and_optional_packages_are_shown(qtbot: Any) -> None:
    tab = _tab(qtbot)
    tab.show_report(_info())
    devices = dict(zip(_column(tab.devices, 0), _column(tab.devices, 1), strict=True))
    assert devices["gaudi-gui"] == "0.1.0"
    assert devices["Gaudi driver"] == "1.18.0-ee698fb" and devices["Gaudi firmware"] == "53.1.1.1"
    packages = dict(zip(_column(tab.packages, 0), _column(tab.packages, 1), strict=True))
    assert packages["deepspeed"] == "0.16.1+hpu" and "optimum-habana" not in packages


def test_copy_button_click_fills_the_clipboard_and_says_copied(qtbot: Any) -> None:
    tab = _tab(qtbot)
    QGuiApplication.clipboard().setText("")
    assert not tab.copy_button.isEnabled()
    tab.show_report(_info())
    assert tab.copy_button.isEnabled()
    qtbot.mouseClick(tab.copy_button, Qt.MouseButton.LeftButton)
    text = QGuiApplication.clipboard().text()
    assert text.startswith("gaudi-gui 0.1.0 environment")
    assert "53.1.1.1" in text and "deepspeed" in text
    assert tab.copy_status.text() == f"Copied {len(text.splitlines())} lines to the clipboard"


def test_missing_hl_smi_is_shown_with_its_reason(qtbot: Any) -> None:
    tab = _tab(qtbot)
    info = _info()
    info["gaudi"] = {"driver_version": None, "firmware_version": None, "hl_smi_version": None,
                     "error": "hl-smi not found"}
    tab.show_report(info)
    devices = dict(zip(_column(tab.devices, 0), _column(tab.devices, 1), strict=True))
    assert devices["Gaudi driver"] == "unknown (hl-smi not found)"

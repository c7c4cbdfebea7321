from __future__ import annotations

from pathlib import Path

import pytest
from PySide6.QtCore import QByteArray, QSettings

from gaudi_gui.services.settings import SCHEMA, Settings


def test_defaults_types_and_round_trip(qapp, tmp_path: Path) -> None:
    settings = Settings(str(tmp_path / "s.ini"))
    assert settings.get("devices/interval_s") == 1.0
    assert settings.get("runner/last_model") == "builtin:demo"
    settings.set("devices/selected_modules", [4, 5])
    settings.set("runner/presets", {"precise": {"temperature": 0.1}})
    settings.set("runner/chat_mode", False)
    settings.set("window/geometry", QByteArray(b"\x01\x02"))
    settings.sync()
    again = Settings(str(tmp_path / "s.ini"))
    assert again.get("devices/selected_modules") == [4, 5]
    assert again.get("runner/presets") == {"precise": {"temperature": 0.1}}
    assert again.get("runner/chat_mode") is False
    assert bytes(again.get("window/geometry").data()) == b"\x01\x02"


def test_corrupt_values_fall_back_to_defaults(qapp, tmp_path: Path) -> None:
    path = str(tmp_path / "s.ini")
    raw = QSettings(path, QSettings.Format.IniFormat)
    raw.setValue("devices/interval_s", "fast please")
    raw.setValue("devices/selected_modules", "{not json")
    raw.setValue("runner/presets", "[1, 2]")  # JSON, but not a dict
    raw.sync()
    settings = Settings(path)
    assert settings.get("devices/interval_s") == SCHEMA["devices/interval_s"].default
    assert settings.get("devices/selected_modules") == []
    assert settings.get("runner/presets") == {}


def test_unknown_keys_are_refused(qapp, tmp_path: Path) -> None:
    settings = Settings(str(tmp_path / "s.ini"))
    with pytest.raises(KeyError):
        settings.get("no/such/key")
    with pytest.raises(KeyError):
        settings.set("no/such/key", 1)


def test_mutable_defaults_are_not_shared(qapp, tmp_path: Path) -> None:
    settings = Settings(str(tmp_path / "s.ini"))
    settings.get("runner/recent_models").append("x")
    assert settings.get("runner/recent_models") == []


def test_default_file_is_under_the_isolated_home(qapp, isolated_home: Path) -> None:
    assert Path(Settings().file_name).is_relative_to(isolated_home)

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


def _raw(path: str, **values: object) -> None:
    raw = QSettings(path, QSettings.Format.IniFormat)
    for key, value in values.items():
        raw.setValue(key.replace("__", "/"), value)
    raw.sync()


def test_booleans_are_json_booleans_only(qapp, tmp_path: Path) -> None:
    path = str(tmp_path / "s.ini")
    _raw(path, runner__chat_mode="yes",
         runner__load_options='{"trust_remote_code": "false", "compile": 1, "device": "cpu"}')
    settings = Settings(path)
    assert settings.get("runner/chat_mode") is True  # the default, not bool("yes")
    # The string "false" must never turn remote code on: the field is dropped, LoadOptions' default
    # (False) applies; a well-typed field survives.
    assert settings.get("runner/load_options") == {"device": "cpu"}
    text = " ".join(settings.problems)
    assert "runner/chat_mode" in text and "trust_remote_code must be boolean" in text
    assert "compile must be boolean" in text


def test_json_booleans_round_trip_through_the_ini_file(qapp, tmp_path: Path) -> None:
    path = str(tmp_path / "s.ini")
    Settings(path).set("runner/load_options", {"trust_remote_code": False, "compile": True})
    _raw(path, runner__chat_mode="false")
    again = Settings(path)
    assert again.get("runner/load_options") == {"trust_remote_code": False, "compile": True}
    assert again.get("runner/chat_mode") is False and again.problems == []


@pytest.mark.parametrize("stored, expected", [
    ("3e6", 3600.0), ("inf", 1.0), ("Infinity", 1.0), ("NaN", 1.0), ("-5", 0.1), ("true", 1.0),
    ('"2"', 1.0), ("2.5", 2.5),
])
def test_numeric_settings_are_bounded(qapp, tmp_path: Path, stored: str, expected: float) -> None:
    path = str(tmp_path / "s.ini")
    _raw(path, devices__interval_s=stored)
    settings = Settings(path)
    value = settings.get("devices/interval_s")
    assert value == expected and isinstance(value, float)
    assert (settings.problems == []) == (stored == "2.5")
    # every numeric setting declares a range a QTimer can take (ms in a signed 32-bit int)
    for setting in SCHEMA.values():
        if setting.type in (int, float):
            assert setting.minimum is not None and setting.maximum is not None, setting.key
            if setting.key.endswith("_s"):
                assert setting.maximum * 1000 < 2**31 - 1


def test_wrong_types_are_reported_once_and_fall_back(qapp, tmp_path: Path) -> None:
    path = str(tmp_path / "s.ini")
    _raw(path, window__tab="1.5", devices__selected_modules='{"a": 1}',
         runner__presets='{"mine": {"temperature": "hot", "top_k": 5}, "bad": 3}')
    settings = Settings(path)
    got: list[str] = []
    settings.problem_found.connect(got.append)
    assert settings.get("window/tab") == 0
    assert settings.get("window/tab") == 0
    assert settings.get("devices/selected_modules") == []
    assert settings.get("runner/presets") == {"mine": {"top_k": 5}}
    assert len(got) == 4 and len(set(got)) == 4  # tab once, modules, presets field, preset "bad"


def test_set_refuses_wrong_types_and_clamps_numbers(qapp, tmp_path: Path) -> None:
    settings = Settings(str(tmp_path / "s.ini"))
    with pytest.raises(ValueError):
        settings.set("runner/chat_mode", "false")
    with pytest.raises(ValueError):
        settings.set("devices/interval_s", float("inf"))
    settings.set("devices/interval_s", 3e6)
    assert settings.get("devices/interval_s") == 3600.0


def test_config_folder_that_is_a_file_gives_memory_defaults(qapp, isolated_home: Path) -> None:
    (isolated_home / "config").write_text("I am a file")
    settings = Settings()
    assert not settings.persistent and settings.file_name == ""
    assert "is a file" in settings.problems[0]
    assert settings.get("devices/interval_s") == 1.0
    settings.set("devices/interval_s", 2.0)  # works for this session
    assert settings.get("devices/interval_s") == 2.0
    assert (isolated_home / "config").read_text() == "I am a file"

"""The one place that touches QSettings: a typed schema of every persistent setting.

Each setting is declared once in ``SCHEMA`` with its type and default. Reads coerce what is stored (an
INI file can hold anything a user typed) back to that type and fall back to the default when it does
not fit, so a corrupt settings file never breaks start-up. Values that are structures (lists, dicts)
are stored as JSON text so they round-trip exactly across Qt versions.

The file lives in ``gaudi_gui.core.paths.config_dir()``; tests point ``GAUDI_GUI_HOME`` at a temporary
folder so they never see the user's settings.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from PySide6.QtCore import QByteArray, QObject, QSettings, Signal

from gaudi_gui.core import paths


@dataclass(frozen=True)
class Setting:
    key: str
    type: type
    default: Any
    doc: str


def _s(key: str, kind: type, default: Any, doc: str) -> Setting:
    return Setting(key, kind, default, doc)


#: Every persistent setting. Add new ones here, in the section of the area that owns them.
SCHEMA: dict[str, Setting] = {s.key: s for s in [
    # -- main window --------------------------------------------------------------------------------
    _s("window/geometry", QByteArray, QByteArray(), "main window geometry (saveGeometry)"),
    _s("window/state", QByteArray, QByteArray(), "main window state (saveState)"),
    _s("window/tab", int, 0, "index of the tab shown last"),
    # -- devices ------------------------------------------------------------------------------------
    _s("devices/hl_smi", str, "", "hl-smi program (empty: GAUDI_GUI_HL_SMI, then PATH)"),
    _s("devices/interval_s", float, 1.0, "hl-smi polling interval in seconds"),
    _s("devices/process_interval_s", float, 5.0, "how often the process table is read, seconds"),
    _s("devices/history_window_s", int, 300, "time window shown by the history charts, seconds"),
    _s("devices/selected_modules", list, [], "module ids checked for jobs"),
    _s("devices/hot_temperature_c", float, 85.0, "temperature above which a card is flagged hot"),
    _s("devices/busy_utilization", float, 5.0, "utilization (%) above which a card counts as busy"),
    # -- model runner -------------------------------------------------------------------------------
    _s("runner/last_model", str, paths.DEMO_MODEL_ID, "model id or folder loaded last"),
    _s("runner/recent_models", list, [], "recently loaded models, newest first"),
    _s("runner/load_options", dict, {}, "device, dtype, quantization, compile, trust_remote_code"),
    _s("runner/generation", dict, {}, "generation parameters shown last"),
    _s("runner/presets", dict, {}, "saved generation presets by name"),
    _s("runner/system_prompt", str, "", "system prompt for chat mode"),
    _s("runner/chat_mode", bool, True, "chat mode (True) or plain prompt (False)"),
    # -- training -----------------------------------------------------------------------------------
    _s("training/last_job", dict, {}, "the training form's values last time (a job config)"),
    _s("training/runs_dir", str, "", "where run folders go (empty: the default data folder)"),
    _s("training/stop_grace_s", float, 30.0, "seconds between SIGTERM and SIGKILL when stopping"),
    _s("training/detached_runs", list, [], "run folders left running at exit, to re-attach"),
]}


def _coerce(setting: Setting, raw: Any) -> Any:
    kind = setting.type
    if raw is None:
        return setting.default
    try:
        if kind is QByteArray:
            return raw if isinstance(raw, QByteArray) else QByteArray(raw)
        if kind is bool:
            if isinstance(raw, str):
                return raw.strip().lower() in ("1", "true", "yes", "on")
            return bool(raw)
        if kind in (list, dict):
            value = json.loads(raw) if isinstance(raw, str) else raw
            return value if isinstance(value, kind) else setting.default
        return kind(raw)
    except (TypeError, ValueError):
        return setting.default


class Settings(QObject):
    """Typed access to the settings file. ``get``/``set`` only accept keys declared in SCHEMA."""

    #: A setting was written: (key, new value).
    value_changed = Signal(str, object)

    def __init__(self, path: str | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        if path is None:
            folder = paths.config_dir()
            folder.mkdir(parents=True, exist_ok=True)
            path = str(folder / "settings.ini")
        self._qs = QSettings(path, QSettings.Format.IniFormat)

    @property
    def file_name(self) -> str:
        return self._qs.fileName()

    def get(self, key: str) -> Any:
        setting = SCHEMA[key]
        value = _coerce(setting, self._qs.value(key))
        # Hand out copies of mutable defaults so callers cannot change the schema by accident.
        if isinstance(value, (list, dict)):
            return json.loads(json.dumps(value))
        return value

    def set(self, key: str, value: Any) -> None:
        setting = SCHEMA[key]
        if setting.type in (list, dict):
            stored: Any = json.dumps(value)
        elif setting.type is QByteArray:
            stored = value
        else:
            stored = setting.type(value)
        self._qs.setValue(key, stored)
        self.value_changed.emit(key, value)

    def reset(self, key: str) -> None:
        self._qs.remove(key)
        self.value_changed.emit(key, SCHEMA[key].default)

    def sync(self) -> None:
        self._qs.sync()

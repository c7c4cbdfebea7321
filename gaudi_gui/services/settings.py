"""The one place that touches QSettings: a typed schema of every persistent setting.

Each setting is declared once in ``SCHEMA`` with its type, its default and, for numbers, the range it
may take. Values are stored as JSON text (strings as they are), so a boolean is a JSON boolean: ``true``
or ``false``, never ``"false"`` (``bool("false")`` is True, and a hand-edited ``"trust_remote_code":
"false"`` must not turn remote code on). What is read back is checked, never coerced: a value of the
wrong type, a non-finite number or JSON that does not parse is reported (``problems``, and the
``problem_found`` signal) and the default is used instead, so a corrupt settings file never breaks
start-up. A number outside its range is clamped to the range (so an interval of ``3e6`` or ``inf``
never reaches a QTimer) and reported. Dict settings with a known shape declare the type of each field;
a field of the wrong type is dropped (reported), so the consumer's own default applies.

When the settings file cannot be used at all (the config folder is a file, say) the settings live in
memory for this session: ``persistent`` is False and the reason is the first of ``problems``.

The file lives in ``gaudi_gui.core.paths.config_dir()``; tests point ``GAUDI_GUI_HOME`` at a temporary
folder so they never see the user's settings.
"""

from __future__ import annotations

import json
import math
import sys
from dataclasses import dataclass, field
from typing import Any

from PySide6.QtCore import QByteArray, QObject, QSettings, Signal

from gaudi_gui.core import paths


class SettingError(ValueError):
    """A stored value does not fit its setting (the message says which and why)."""


#: The JSON type(s) a field of a dict setting may hold.
_Kinds = tuple[type, ...]


@dataclass(frozen=True)
class Setting:
    key: str
    type: type
    default: Any
    doc: str
    #: Inclusive range of a numeric setting (None: unbounded on that side).
    minimum: float | None = None
    maximum: float | None = None
    #: For dict settings with a known shape: field name -> allowed type(s). Unknown fields pass.
    fields: dict[str, _Kinds] = field(default_factory=dict)
    #: For dict settings whose every value is a dict of that shape (presets by name).
    value_fields: dict[str, _Kinds] = field(default_factory=dict)


def _s(key: str, kind: type, default: Any, doc: str, bounds: tuple[float, float] | None = None, *,
       fields: dict[str, tuple[type, ...]] | None = None,
       value_fields: dict[str, tuple[type, ...]] | None = None) -> Setting:
    low, high = bounds if bounds is not None else (None, None)
    return Setting(key, kind, default, doc, low, high, fields or {}, value_fields or {})


_NUM = (int, float)
#: The fields of core.generation.LoadOptions and GenerationParams, as JSON types.
_LOAD_FIELDS: dict[str, tuple[type, ...]] = {
    "model": (str,), "device": (str,), "dtype": (str,), "quantization": (str,), "compile": (bool,),
    "trust_remote_code": (bool,)}
#: The Training tab's Slurm fields (``training/slurm``).
_SLURM_FIELDS: dict[str, tuple[type, ...]] = {
    "nodes": (int,), "partition": (str,), "time": (str,), "account": (str,), "cards_per_node": (int,),
    "gres": (str,), "device": (str,), "login": (str,)}
_GENERATION_FIELDS: dict[str, tuple[type, ...]] = {
    "max_new_tokens": (int,), "min_new_tokens": (int,), "do_sample": (bool,), "temperature": _NUM,
    "top_p": _NUM, "top_k": (int,), "repetition_penalty": _NUM, "num_beams": (int,),
    "seed": (int, type(None)), "stop": (list,)}
#: A QTimer takes a signed 32-bit millisecond count (about 24.8 days); keep intervals far below it.
_DAY_S = 86_400.0

#: Every persistent setting. Add new ones here, in the section of the area that owns them.
SCHEMA: dict[str, Setting] = {s.key: s for s in [
    # -- main window --------------------------------------------------------------------------------
    _s("window/geometry", QByteArray, QByteArray(), "main window geometry (saveGeometry)"),
    _s("window/state", QByteArray, QByteArray(), "main window state (saveState)"),
    _s("window/tab", int, 0, "index of the tab shown last", (0, 64)),
    # -- devices ------------------------------------------------------------------------------------
    _s("devices/hl_smi", str, "", "hl-smi program (empty: GAUDI_GUI_HL_SMI, then PATH)"),
    _s("devices/interval_s", float, 1.0, "hl-smi polling interval in seconds", (0.1, 3600.0)),
    _s("devices/process_interval_s", float, 5.0, "how often the process table is read, seconds",
       (0.5, 3600.0)),
    _s("devices/history_window_s", int, 300, "time window shown by the history charts, seconds",
       (10, 7 * 86_400)),
    _s("devices/selected_modules", list, [], "module ids checked for jobs"),
    _s("devices/hot_temperature_c", float, 85.0, "temperature above which a card is flagged hot",
       (0.0, 200.0)),
    _s("devices/busy_utilization", float, 5.0, "utilization (%) above which a card counts as busy",
       (0.0, 100.0)),
    # -- model runner -------------------------------------------------------------------------------
    _s("runner/last_model", str, paths.DEMO_MODEL_ID, "model id or folder loaded last"),
    _s("runner/recent_models", list, [], "recently loaded models, newest first"),
    _s("runner/load_options", dict, {}, "device, dtype, quantization, compile, trust_remote_code",
       fields=_LOAD_FIELDS),
    _s("runner/generation", dict, {}, "generation parameters shown last",
       fields=_GENERATION_FIELDS),
    _s("runner/presets", dict, {}, "saved generation presets by name",
       value_fields=_GENERATION_FIELDS),
    _s("runner/system_prompt", str, "", "system prompt for chat mode"),
    _s("runner/chat_mode", bool, True, "chat mode (True) or plain prompt (False)"),
    # -- run meter: what a run cost (core.prices reads these too, for `gaudi-gui runs show`) --------------
    _s("meter/price_per_kwh", float, 0.0, "price of a kWh, for a run's cost (0: not set, no cost shown)",
       (0.0, 1e6)),
    _s("meter/price_per_card_hour", float, 0.0, "price of a card-hour, for a run's cost (0: not set)",
       (0.0, 1e6)),
    _s("meter/currency", str, "", "the currency of the prices (EUR, USD, €…), said beside a cost"),
    # -- training -----------------------------------------------------------------------------------
    _s("training/last_job", dict, {}, "the training form's values last time (a job config)"),
    _s("training/runs_dir", str, "", "where run folders go (empty: the default data folder)"),
    _s("training/stop_grace_s", float, 120.0, "seconds a Stop may save its checkpoint before SIGKILL",
       (1.0, _DAY_S)),
    # -- queue: carried by every add from the window (core.queue keeps it in its state) --------------
    _s("queue/cpu_jobs", int, 1, "queued CPU jobs (training, evaluation on no cards) that run at once; "
       "0: no limit", (0, 256)),
    _s("training/followed_runs", list, [], "the runs being followed, one record each in the same format "
       "for every placement (where it runs, each host's run folder, the job), to re-attach after a "
       "restart"),
    _s("training/detached_runs", list, [], "(before 0.2) run folders left running at exit; taken over "
       "into training/followed_runs once"),
    _s("training/host", str, "local", "the Training tab's host: local, or an SSH destination"),
    _s("training/multi_hosts", list, [], "the hosts checked for a run on several hosts (machine rank "
       "in this order)"),
    _s("serve/host_forwards", list, [], "the port here of each server left running on a host at exit "
       "(host, job_id, ports): its forward asked for again when the next window follows it (which jobs "
       "run is the agent's word, not this key's)"),
    _s("training/remote_runs", list, [], "(before 0.2) runs on SSH hosts being followed; taken over "
       "into training/followed_runs once"),
    _s("training/splitter", QByteArray, QByteArray(), "the Training tab's form/run splitter (saveState)"),
    _s("training/live_splitter", QByteArray, QByteArray(), "the Training tab's charts/log splitter"),
    _s("training/last_folder", str, "", "the folder of the last job file saved or loaded"),
    _s("training/slurm", dict, {}, "the Training tab's Slurm fields last used (nodes, partition, time, "
       "account, cards per node, gres, node device, login host)", fields=_SLURM_FIELDS),
    # -- health, alerts and notifications -----------------------------------------------------------
    _s("health/interval_s", float, 300.0, "how often the doctor checks each watched host, seconds",
       (10.0, _DAY_S)),
    _s("health/timeout_s", float, 120.0, "how long one host's doctor may take before it counts as not "
       "answering, seconds", (5.0, 3600.0)),
    _s("alerts/temperature_warning_c", float, 85.0, "temperature that raises a warning alert",
       (0.0, 200.0)),
    _s("alerts/temperature_critical_c", float, 95.0, "temperature that raises a critical alert",
       (0.0, 200.0)),
    _s("alerts/temperature_margin_c", float, 5.0, "degrees below a threshold before its alert clears",
       (0.0, 50.0)),
    _s("alerts/slowdown_clear_s", float, 60.0, "seconds a slowdown must stay off before its alert "
       "clears", (0.0, _DAY_S)),
    _s("alerts/idle_held_s", float, 1800.0, "seconds a held card may stay idle before an alert",
       (10.0, 7 * _DAY_S)),
    _s("notifications/enabled", bool, True, "desktop notifications for alerts and ended runs"),
    _s("notifications/max_per_window", int, 3, "at most this many notifications per window",
       (1, 100)),
    _s("notifications/window_s", float, 60.0, "the rate limit's window, seconds", (1.0, _DAY_S)),
]}


def setting_bounds(key: str) -> tuple[float, float]:
    """The range of a numeric setting bounded on both sides (an interval a QTimer is started with)."""
    setting = SCHEMA[key]
    assert setting.minimum is not None and setting.maximum is not None, key
    return float(setting.minimum), float(setting.maximum)


def _type_name(value: Any) -> str:
    return "null" if value is None else {bool: "boolean", int: "integer", float: "number", str: "text",
                                         list: "list", dict: "object"}.get(type(value), type(value).__name__)


def _is(value: Any, kinds: tuple[type, ...]) -> bool:
    # bool is an int subclass in Python, but a JSON boolean is not a number here.
    if isinstance(value, bool):
        return bool in kinds
    if isinstance(value, int) and float in kinds:
        return True
    return isinstance(value, kinds)


def _check_fields(key: str, value: dict[str, Any], shape: dict[str, tuple[type, ...]],
                  problems: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, item in value.items():
        kinds = shape.get(name)
        if kinds is not None and not _is(item, kinds):
            wanted = " or ".join("null" if k is type(None) else _type_name(k()) for k in kinds)
            problems.append(f"{key}: {name} must be {wanted}, not {_type_name(item)} "
                            f"{json.dumps(item, default=str)[:60]}; its default is used")
            continue
        if isinstance(item, float) and not math.isfinite(item):
            problems.append(f"{key}: {name} is not a finite number; its default is used")
            continue
        out[name] = item
    return out


def check_value(setting: Setting, value: Any, problems: list[str]) -> Any:
    """``value`` (already decoded from JSON) checked against ``setting``; raises SettingError when it
    cannot be used at all, appends to ``problems`` when part of it was dropped or clamped."""
    kind = setting.type
    key = setting.key
    if kind is QByteArray:
        if isinstance(value, QByteArray):
            return value
        if isinstance(value, (bytes, bytearray)):
            return QByteArray(bytes(value))
        raise SettingError(f"{key}: expected binary data, got {_type_name(value)}")
    if kind is float or kind is int:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SettingError(f"{key}: expected a number, got {_type_name(value)} "
                               f"{json.dumps(value, default=str)[:60]}")
        if not math.isfinite(value):
            raise SettingError(f"{key}: {value} is not a finite number")
        if kind is int and isinstance(value, float):
            if not value.is_integer():
                raise SettingError(f"{key}: expected a whole number, got {value}")
            value = int(value)
        number: float = value
        low, high = setting.minimum, setting.maximum
        if (low is not None and number < low) or (high is not None and number > high):
            clamped = min(max(number, low if low is not None else number),
                          high if high is not None else number)
            problems.append(f"{key}: {value} is outside {low}..{high}; {clamped} is used")
            number = clamped
        return int(number) if kind is int else float(number)
    if not _is(value, (kind,)):
        raise SettingError(f"{key}: expected {_type_name(kind())}, got {_type_name(value)} "
                           f"{json.dumps(value, default=str)[:60]}")
    if kind is dict:
        if setting.fields:
            value = _check_fields(key, value, setting.fields, problems)
        if setting.value_fields:
            checked: dict[str, Any] = {}
            for name, item in value.items():
                if isinstance(item, dict):
                    checked[name] = _check_fields(f"{key}[{name}]", item, setting.value_fields, problems)
                else:
                    problems.append(f"{key}: {name} must be an object, not {_type_name(item)}; "
                                    "it is left out")
            value = checked
    return value


def decode_stored(setting: Setting, raw: Any) -> Any:
    """What QSettings handed back, as the JSON value it was stored as (SettingError when it is not)."""
    if setting.type is QByteArray or not isinstance(raw, str):
        if setting.type is str and isinstance(raw, list) and all(isinstance(p, str) for p in raw):
            # An unquoted hand-edited INI value with commas comes back split; put it back together.
            return ", ".join(raw)
        return raw
    if setting.type is str:
        return raw
    try:
        return json.loads(raw)
    except (ValueError, RecursionError) as exc:
        raise SettingError(f"{setting.key}: {raw[:60]!r} is not valid JSON "
                           f"({type(exc).__name__})") from exc


def encode_for_store(setting: Setting, value: Any) -> Any:
    """The text (or bytes) ``set`` stores; raises SettingError for a value of the wrong type."""
    problems: list[str] = []
    checked = check_value(setting, value, problems)
    if setting.type is QByteArray or setting.type is str:
        return checked
    return json.dumps(checked, allow_nan=False)


class _MemoryStore:
    """The QSettings subset Settings uses, held in memory (no usable settings file this session)."""

    def __init__(self) -> None:
        self._values: dict[str, Any] = {}

    def value(self, key: str) -> Any:
        return self._values.get(key)

    def setValue(self, key: str, value: Any) -> None:
        self._values[key] = value

    def remove(self, key: str) -> None:
        self._values.pop(key, None)

    def sync(self) -> None:
        pass

    def fileName(self) -> str:
        return ""


class Settings(QObject):
    """Typed access to the settings file. ``get``/``set`` only accept keys declared in SCHEMA."""

    #: A setting was written: (key, new value).
    value_changed = Signal(str, object)
    #: A stored value was unusable (wrong type, corrupt, out of range) or the file could not be used;
    #: carries a one-line message. Each distinct message is reported once.
    problem_found = Signal(str)

    def __init__(self, path: str | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._problems: list[str] = []
        self._store: QSettings | _MemoryStore
        try:
            if path is None:
                folder = paths.config_dir()
                if folder.exists() and not folder.is_dir():
                    raise NotADirectoryError(f"{folder} is a file, not a folder")
                folder.mkdir(parents=True, exist_ok=True)
                path = str(folder / "settings.ini")
            self._store = QSettings(path, QSettings.Format.IniFormat)
            if self._store.status() != QSettings.Status.NoError:
                raise OSError(f"cannot read {path} ({self._store.status().name})")
        except OSError as exc:
            reason = (f"settings cannot be saved this session, defaults are used: {exc}")
            self._store = _MemoryStore()
            self._report(reason)

    @property
    def file_name(self) -> str:
        """The settings file, or "" when settings live in memory this session."""
        return self._store.fileName()

    @property
    def persistent(self) -> bool:
        """False when no settings file could be used (changes are lost at exit)."""
        return not isinstance(self._store, _MemoryStore)

    @property
    def problems(self) -> list[str]:
        """Every problem found so far (file unusable, values that fell back or were clamped)."""
        return list(self._problems)

    def _report(self, message: str) -> None:
        if message in self._problems:
            return
        self._problems.append(message)
        print(f"gaudi-gui: settings: {message}", file=sys.stderr)
        self.problem_found.emit(message)

    def get(self, key: str) -> Any:
        setting = SCHEMA[key]
        raw = self._store.value(key)
        value: Any = setting.default
        if raw is not None:
            problems: list[str] = []
            try:
                value = check_value(setting, decode_stored(setting, raw), problems)
            except SettingError as exc:
                self._report(f"{exc}; the default {json.dumps(setting.default, default=str)} is used")
                value = setting.default
            for problem in problems:
                self._report(problem)
        # Hand out copies of mutable values so callers cannot change the schema by accident.
        if isinstance(value, (list, dict)):
            return json.loads(json.dumps(value))
        return value

    def check_all(self) -> list[str]:
        """Read every setting once (reporting what is wrong); returns ``problems``."""
        for key in SCHEMA:
            self.get(key)
        return self.problems

    def set(self, key: str, value: Any) -> None:
        """Store ``value``; raises SettingError (a ValueError) when it does not fit the setting.
        A number outside the setting's range is stored clamped."""
        setting = SCHEMA[key]
        self._store.setValue(key, encode_for_store(setting, value))
        self.value_changed.emit(key, value)

    def reset(self, key: str) -> None:
        self._store.remove(key)
        self.value_changed.emit(key, SCHEMA[key].default)

    def sync(self) -> None:
        self._store.sync()

"""The TrainingArguments schema and job validation, computed in short-lived children that the agent
runs (its ``schema`` and ``validate`` kinds; the Qt process never imports transformers):
``SchemaLoader``, owned by ``AppServices``."""

from __future__ import annotations

import contextlib
import json
from collections.abc import Mapping
from typing import Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core.training_args import Schema, load_cached, save_cached
from gaudi_gui.services.agent_child import AgentChild, describe_exit


def _installed_transformers() -> str:
    """transformers' version as the schema child will import it ("" when it is not installed)."""
    from importlib import metadata  # ~0.1 s the first time: only when the probe has not answered
    try:
        return metadata.version("transformers")
    except metadata.PackageNotFoundError:
        return ""


class SchemaLoader(QObject):
    """The TrainingArguments schema and job validation, computed in short-lived children."""

    #: The schema is available (from the cache or a fresh child).
    schema_loaded = Signal(object)
    #: The schema child failed; carries the reason.
    schema_failed = Signal(str)
    #: A validation finished: list of (field, message); empty means TrainingArguments builds.
    validated = Signal(list)

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.schema: Schema | None = None
        self._schema_runner = AgentChild(self, tail_lines=400)
        self._schema_runner.line_received.connect(self._on_schema_line)
        self._schema_runner.finished.connect(self._on_schema_finished)
        self._schema_lines: list[str] = []
        self._validate_runner = AgentChild(self)
        self._validate_runner.line_received.connect(self._on_validate_line)
        self._validate_runner.finished.connect(self._on_validate_finished)
        self._validate_lines: list[str] = []
        #: True from a child's start until its schema was handed on (or failed): a form shown with the
        #: cached schema may still be rebuilt with the child's.
        self.loading = False

    def is_running(self) -> bool:
        return self._schema_runner.is_running() or self._validate_runner.is_running()

    def load(self, transformers_version: str = "", *, device: str = "cpu",
             device_env: Mapping[str, str] | None = None) -> None:
        """Cached schema for that version at once, else ask a child (with the device's env). With no
        version (the environment probe has not answered yet), the version installed for the child's
        Python, read from its package metadata (the child runs this interpreter; nothing imported)."""
        transformers_version = transformers_version or _installed_transformers()
        if transformers_version:
            cached = load_cached(transformers_version)
            if cached is not None:
                self.schema = cached
                self.schema_loaded.emit(cached)
                return
        if self._schema_runner.is_running():
            return
        self._schema_lines = []
        self.loading = True
        self._schema_runner.start("schema", {"device": device, "device_env": dict(device_env or {})})

    def _on_schema_line(self, stream: str, line: str) -> None:
        if stream == "stdout":
            self._schema_lines.append(line)

    def _on_schema_finished(self, code: int, status: str) -> None:
        try:
            self._hand_on_schema(code, status)
        finally:
            self.loading = False

    def _hand_on_schema(self, code: int, status: str) -> None:
        text = "\n".join(self._schema_lines)
        try:
            schema = Schema.from_dict(json.loads(text[text.find("{"):]))
        except (ValueError, KeyError, TypeError):
            tail = " | ".join(self._schema_runner.tail(3))
            self.schema_failed.emit(f"could not read TrainingArguments ({describe_exit(code, status)}): "
                                    f"{tail}")
            return
        with contextlib.suppress(OSError):
            save_cached(schema)
        self.schema = schema
        self.schema_loaded.emit(schema)

    def validate(self, training_args: Mapping[str, Any], *, device: str = "cpu",
                 device_env: Mapping[str, str] | None = None, num_processes: int = 1,
                 objective: str = "sft") -> None:
        """Build TrainingArguments from the whole dict in a child that has the job's device env
        (the child blames fields by elimination; ``num_processes`` > 1 lets it accept a
        ddp_backend that no single process could initialise)."""
        if self._validate_runner.is_running():
            return
        self._validate_lines = []
        self._validate_runner.start("validate", {
            "training_args": dict(training_args), "device": device, "device_env": dict(device_env or {}),
            "num_processes": max(1, int(num_processes)), "objective": objective})

    def _on_validate_line(self, stream: str, line: str) -> None:
        if stream == "stdout":
            self._validate_lines.append(line)

    def _on_validate_finished(self, code: int, status: str) -> None:
        for line in reversed(self._validate_lines):
            with contextlib.suppress(ValueError):
                data = json.loads(line)
                if isinstance(data, dict) and "errors" in data:
                    self.validated.emit([(str(e.get("field", "")), str(e.get("message", "")))
                                         for e in data["errors"]])
                    return
        self.validated.emit([("", f"validation child failed ({describe_exit(code, status)}): "
                                  f"{' | '.join(self._validate_runner.tail(3))}")])

    def shutdown(self) -> None:
        for runner in (self._schema_runner, self._validate_runner):
            runner.kill_tree()


__all__ = ["SchemaLoader"]

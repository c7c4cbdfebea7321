"""The two helper children of instruction/chat fine-tuning: the render preview and "Merge and save".

Each wraps one child that the agent runs (its ``sft_preview`` and ``merge`` kinds); both answer with
one JSON line, read when the child ends.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.secrets import redact
from gaudi_gui.services.agent_child import AgentChild


def _last_json(lines: list[str]) -> dict[str, Any] | None:
    for line in reversed(lines):
        line = line.strip()
        if line.startswith("{"):
            with contextlib.suppress(ValueError):
                data = json.loads(line)
                if isinstance(data, dict):
                    return data
    return None


class _OneShot(QObject):
    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._runner = AgentChild(self, tail_lines=50)
        self._runner.line_received.connect(self._on_line)
        self._runner.finished.connect(self._on_finished)
        self._lines: list[str] = []

    def is_running(self) -> bool:
        return self._runner.is_running()

    def shutdown(self) -> None:
        if self._runner.is_running():
            self._runner.kill_tree()

    def _start(self, kind: str, args: dict[str, Any]) -> None:
        self._lines = []
        self._runner.start(kind, args)

    def _on_line(self, stream: str, line: str) -> None:
        if stream == "stdout":
            self._lines.append(line)

    def _on_finished(self, code: int, status: str) -> None:
        result = _last_json(self._lines)
        if result is None:
            tail = " | ".join(redact(t) for t in self._runner.tail(3))
            result = {"ok": False, "field": "", "message": f"the helper ended without an answer "
                                                           f"({status}, exit {code}): {tail}"}
        self._answer(result)

    def _answer(self, result: dict[str, Any]) -> None:
        raise NotImplementedError


class RenderPreview(_OneShot):
    """``python -m gaudi_gui.workers.sft_data``: the first rows as SFTTrainer trains on them."""

    #: The child's answer: {"ok": True, "rows": [...], "loss": ...} or {"ok": False, "field", "message"}.
    finished = Signal(dict)

    def render(self, job: JobConfig, rows: int = 3) -> bool:
        """Start a preview of ``job``; False while one runs."""
        if self.is_running():
            return False
        self._start("sft_preview", {"job": job.to_json(), "rows": rows})  # to_json never holds a token
        return True

    def _answer(self, result: dict[str, Any]) -> None:
        self.finished.emit(result)


class AdapterMerger(_OneShot):
    """``python -m gaudi_gui.workers.merge``: base + adapter merged into a full model folder."""

    #: (ok, the merged folder or what went wrong)
    finished = Signal(bool, str)

    def merge(self, adapter: str | Path, out: str | Path) -> bool:
        if self.is_running():
            return False
        self._start("merge", {"adapter": str(adapter), "out": str(out)})
        return True

    def _answer(self, result: dict[str, Any]) -> None:
        ok = bool(result.get("ok"))
        self.finished.emit(ok, str(result.get("path") if ok else result.get("message", "")))

"""Has the agent run ``python -m gaudi_gui.workers.probe`` (the ``probe`` child of agent/children.py) and
hands its JSON to the views."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

if TYPE_CHECKING:
    from gaudi_gui.services.agent_child import AgentChild


class EnvironmentProbe(QObject):
    """Versions, devices and the device a worker will use, probed without importing torch here."""

    #: A probe started.
    probe_started = Signal()
    #: A probe ended with its report (see gaudi_gui.workers.probe.collect for the keys).
    probe_finished = Signal(dict)
    #: A probe could not run or its child failed; carries the reason and the last output lines.
    probe_failed = Signal(str)

    def __init__(self, python: str | None = None, parent: QObject | None = None) -> None:
        super().__init__(parent)
        #: The Python that runs the probe ('': the agent's own).
        self._python = python or ""
        # The child (and the agent's client with it) is made by the first refresh: the app makes this
        # probe before its window's first paint and starts it after.
        self._runner: AgentChild | None = None
        self._result: dict[str, Any] | None = None
        self._got_result = False

    @property
    def result(self) -> dict[str, Any] | None:
        """The last successful report, or None before the first one."""
        return self._result

    @property
    def device(self) -> str:
        """'hpu', 'cuda' or 'cpu' once probed; 'cpu' until then."""
        return (self._result or {}).get("device", "cpu")

    def is_running(self) -> bool:
        return self._runner is not None and self._runner.is_running()

    def refresh(self) -> None:
        if self._runner is None:
            from gaudi_gui.services.agent_child import AgentChild

            self._runner = AgentChild(self)
            self._runner.message_received.connect(self._on_message)
            self._runner.finished.connect(self._on_finished)
        if self._runner.is_running():
            return
        self._got_result = False
        self.probe_started.emit()
        self._runner.start("probe", {"python": self._python} if self._python else {})

    def _on_message(self, message: dict) -> None:
        if message.get("type") == "probe" and isinstance(message.get("info"), dict):
            self._got_result = True
            self._result = message["info"]
            self.probe_finished.emit(self._result)

    def _on_finished(self, code: int, status: str) -> None:
        if self._got_result or self._runner is None:
            return
        from gaudi_gui.services.agent_child import describe_exit

        tail = "\n".join(self._runner.tail(15))
        self.probe_failed.emit(f"environment probe {describe_exit(code, status)}\n{tail}".strip())

    def shutdown(self) -> None:
        if self._runner is not None:
            self._runner.kill_tree()

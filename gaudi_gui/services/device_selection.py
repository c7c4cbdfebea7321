"""The cards the user checked for jobs, shared by the Devices tab (which edits it) and the model runner
and training launcher (which take their child environment from it)."""

from __future__ import annotations

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core import visibility


class DeviceSelection(QObject):
    """Selected card ids (module ids on Gaudi, indices on CUDA), the kind of device, and job claims."""

    #: The selected ids or the device kind changed: carries the sorted ids.
    selection_changed = Signal(list)
    #: The set of cards held by running jobs changed.
    claims_changed = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._kind = "cpu"
        self._selected: list[int] = []
        self._available: list[int] = []
        self._claims: dict[str, list[int]] = {}

    @property
    def kind(self) -> str:
        """'hpu', 'cuda' or 'cpu': the accelerator the selection refers to."""
        return self._kind

    @property
    def selected(self) -> list[int]:
        return list(self._selected)

    @property
    def available(self) -> list[int]:
        return list(self._available)

    def set_kind(self, kind: str, available: list[int]) -> None:
        if kind == self._kind and sorted(available) == self._available:
            return
        self._kind = kind
        self._available = sorted(available)
        self.selection_changed.emit(self.selected)

    def set_selected(self, ids: list[int]) -> None:
        ids = sorted(set(ids))
        if ids == self._selected:
            return
        self._selected = ids
        self.selection_changed.emit(self.selected)

    def card_count(self) -> int:
        """Cards a job will use: the selection, or every card when nothing is checked (0 on CPU)."""
        if self._kind == "cpu":
            return 0
        return len(self._selected) or len(self._available)

    def env(self) -> dict[str, str]:
        """Environment variables that restrict a child process to the selection."""
        return visibility.device_env(self._kind, self._selected)

    def warnings(self, exclude_job: str | None = None) -> list[str]:
        claims = {k: v for k, v in self._claims.items() if k != exclude_job}
        return visibility.selection_warnings(self._kind, self._selected, self._available, claims)

    # -- claims by running jobs ---------------------------------------------------------------------

    def claim(self, job: str, ids: list[int] | None = None) -> None:
        """Record that ``job`` uses ``ids`` (default: the current selection, or all cards)."""
        use = sorted(ids if ids is not None else (self._selected or self._available))
        self._claims[job] = use
        self.claims_changed.emit()

    def release(self, job: str) -> None:
        if self._claims.pop(job, None) is not None:
            self.claims_changed.emit()

    def claims(self) -> dict[str, list[int]]:
        return {k: list(v) for k, v in self._claims.items()}

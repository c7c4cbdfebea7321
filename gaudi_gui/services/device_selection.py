"""The cards the user checked for jobs, shared by the Devices tab (which edits it) and the model runner
and training launcher (which take their child environment from it).

Two facts decide what a job gets:
- ``kind``: the cards the device tools see (hl-smi -> "hpu", nvidia-smi -> "cuda", else "cpu"), set by
  the DevicePoller;
- ``jobs_kind``: where a job will really run, which also needs the job's Python to drive those cards.
  ``set_environment`` takes the environment probe's report (``EnvironmentProbe.probe_finished``);
  when hl-smi sees Gaudi cards but that Python has no habana_frameworks, jobs run on the CPU, and then
  ``env()`` is ``{}``, ``card_count()`` is 0 and ``claim()`` records no cards. Until a report arrives
  the cards are assumed usable.

Claims: a running job records the cards it holds (``claim``/``release``); ``claims()``,
``holders()`` and ``conflicts()`` let others see who holds which cards.

Healthy and free: the Devices tab hands over what the doctor found (``set_usable``: the cards no
process holds and no error was found on, and for 1, 2, 4, 8 cards which ones); ``pick_usable``
selects them, the card picker's "Pick healthy & free".
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core import visibility


class DeviceSelection(QObject):
    """Selected card ids (module ids on Gaudi, indices on CUDA), the kind of device, and job claims."""

    #: The selected ids, the device kind or where jobs run changed: carries the sorted ids.
    selection_changed = Signal(list)
    #: The set of cards held by running jobs changed.
    claims_changed = Signal()
    #: Which cards are healthy and free changed (``usable()``, ``usable_text()``).
    usable_changed = Signal()

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self._kind = "cpu"
        self._selected: list[int] = []
        self._available: list[int] = []
        self._claims: dict[str, list[int]] = {}
        self._environment: dict[str, Any] | None = None
        self._usable: list[int] | None = None
        self._picks: dict[int, list[int]] = {}
        self._usable_text = ""

    @property
    def kind(self) -> str:
        """'hpu', 'cuda' or 'cpu': the accelerator the device tools see (the selection refers to it)."""
        return self._kind

    @property
    def jobs_kind(self) -> str:
        """'hpu', 'cuda' or 'cpu': where a job started now will run (``kind`` unless the environment
        probe said the job's Python cannot use those cards)."""
        return visibility.jobs_device(self._kind, self._environment)

    def jobs_use_cards(self) -> bool:
        """True when jobs will run on the cards of ``kind`` (False on CPU-only machines too)."""
        return self._kind != "cpu" and self.jobs_kind == self._kind

    def runtime_problem(self) -> str | None:
        """Why jobs will not use the cards that are present (a sentence for a banner), or None."""
        return visibility.runtime_mismatch(self._kind, self._environment)

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

    def set_environment(self, info: Mapping[str, Any] | None) -> None:
        """The environment probe's report (``EnvironmentProbe.probe_finished``), or None (unknown)."""
        before = self.jobs_kind
        self._environment = dict(info) if info is not None else None
        if self.jobs_kind != before:
            self.selection_changed.emit(self.selected)

    def set_selected(self, ids: list[int]) -> None:
        ids = sorted(set(ids))
        if ids == self._selected:
            return
        self._selected = ids
        self.selection_changed.emit(self.selected)

    def card_count(self) -> int:
        """Cards a job will use: the selection, or every card when nothing is checked; 0 when jobs run
        on the CPU (no cards, or cards this Python cannot drive)."""
        if not self.jobs_use_cards():
            return 0
        return len(self._selected) or len(self._available)

    def env(self) -> dict[str, str]:
        """Environment variables that restrict a child process to the selection ({} for CPU jobs)."""
        if not self.jobs_use_cards():
            return {}
        return visibility.device_env(self._kind, self._selected)

    def warnings(self, exclude_job: str | None = None) -> list[str]:
        if not self.jobs_use_cards():
            return []
        claims = {k: v for k, v in self._claims.items() if k != exclude_job}
        return visibility.selection_warnings(self._kind, self._selected, self._available, claims)

    # -- healthy and free ----------------------------------------------------------------------------

    def set_usable(self, ids: Iterable[int] | None, picks: Mapping[int, Iterable[int]] | None = None,
                   text: str = "") -> None:
        """The cards the doctor found healthy and free (None: not checked), the cards to use for N
        cards (``picks``: N -> ids, an empty list when none fit) and the sentence saying so."""
        usable = None if ids is None else sorted(set(ids))
        chosen = {int(n): sorted(v) for n, v in (picks or {}).items()}
        if (usable, chosen, text) == (self._usable, self._picks, self._usable_text):
            return
        self._usable, self._picks, self._usable_text = usable, chosen, text
        self.usable_changed.emit()

    def usable(self) -> list[int] | None:
        """Healthy and free card ids (None: the doctor has not said yet)."""
        return None if self._usable is None else list(self._usable)

    def usable_text(self) -> str:
        """'healthy and free: modules 0, 4 and 7; for 2 cards: …' ('' when not checked)."""
        return self._usable_text

    def pick_for(self, size: int | None = None) -> list[int]:
        """The ids ``pick_usable`` would select: every healthy and free card (``size`` None) or the
        pick for ``size`` cards; [] when none fit or nothing is known."""
        if size is None:
            return list(self._usable or [])
        return list(self._picks.get(size, []))

    def pick_usable(self, size: int | None = None) -> list[int]:
        """Select the healthy and free cards (all, or those for ``size`` cards) and return them; the
        selection is left as it is when none fit ([])."""
        ids = self.pick_for(size)
        if ids:
            self.set_selected(ids)
        return ids

    # -- claims by running jobs ---------------------------------------------------------------------

    def job_ids(self) -> list[int]:
        """The cards a job started now would hold: the selection, or all cards; [] for CPU jobs."""
        if not self.jobs_use_cards():
            return []
        return list(self._selected or self._available)

    def claim(self, job: str, ids: list[int] | None = None) -> None:
        """Record that ``job`` uses ``ids`` (default: ``job_ids()``, so nothing for a CPU job)."""
        use = sorted(set(ids if ids is not None else self.job_ids()))
        self._claims[job] = use
        self.claims_changed.emit()

    def release(self, job: str) -> None:
        if self._claims.pop(job, None) is not None:
            self.claims_changed.emit()

    def claims(self) -> dict[str, list[int]]:
        """Every running job's name -> the card ids it holds (possibly [] for a CPU job)."""
        return {k: list(v) for k, v in self._claims.items()}

    def holders(self, ids: Iterable[int] | None = None,
                exclude_job: str | None = None) -> dict[int, list[str]]:
        """Card id -> the jobs holding it, for ``ids`` (default: every held card); cards nobody holds
        are left out."""
        wanted = None if ids is None else set(ids)
        out: dict[int, list[str]] = {}
        for job, held in self._claims.items():
            if job == exclude_job:
                continue
            for card in held:
                if wanted is None or card in wanted:
                    out.setdefault(card, []).append(job)
        return {card: sorted(jobs) for card, jobs in sorted(out.items())}

    def conflicts(self, ids: Iterable[int] | None = None,
                  exclude_job: str | None = None) -> dict[str, list[int]]:
        """Other jobs -> the cards of ``ids`` (default: ``job_ids()``) they already hold. Use it to
        warn before starting a run on cards held by the runner or another run."""
        wanted = set(self.job_ids() if ids is None else ids)
        out: dict[str, list[int]] = {}
        for job, held in self._claims.items():
            overlap = sorted(wanted & set(held))
            if job != exclude_job and overlap:
                out[job] = overlap
        return out

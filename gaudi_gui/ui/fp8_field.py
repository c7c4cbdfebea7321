"""The FP8 calibration field of the Serve panel and the Evaluate window (issue 39): a calibrate run that
measured the chosen model (the runs store's, listed; or a folder browsed to), or none (bf16).

A calibration is checked where it enters, once: when it is chosen (and again only when the model or this
machine changes), with ``core.fp8.refusal``, the check ``serve --fp8`` and ``eval --fp8`` make before
they start anything. A calibration of another model, device or card generation, or a run folder with
files missing, is refused here in the one line that check gives; the form's Start asks this field and
starts nothing then. This machine is what the window already knows (``AppServices.machine``: the agent's
card names), so choosing runs no tool.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QResizeEvent
from PySide6.QtWidgets import QComboBox, QFileDialog, QHBoxLayout, QLabel, QPushButton, QVBoxLayout, QWidget

from gaudi_gui.core import fp8
from gaudi_gui.core.runstore import RunStore

#: The first entry: no calibration, the model as it is (bf16 on Gaudi).
NONE_LABEL = "none (bf16)"
TIP = "a calibration of this model (Calibrate FP8… on the Models tab or on a finished run); none: bf16"
#: Why the field is off on a host.
ON_A_HOST = ("FP8 on a host: give the host's calibrate run on the command line (gaudi-gui serve|eval "
             "--host HOST --fp8 RUN); its own command checks it")


def item_label(folder: Path, manifest: dict[str, Any]) -> str:
    """How a calibration is offered: its run's name, where it was measured and on how many rows."""
    where = manifest.get("generation") or manifest.get("device") or "?"
    return f"{folder.name} · {where} · {manifest.get('rows', '?')} rows"


class _RunsCombo(QComboBox):
    """The calibrations, listed again each time the list is opened (a calibration that ended meanwhile
    is there)."""

    def __init__(self, about_to_show: Callable[[], None], parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._about_to_show = about_to_show

    def showPopup(self) -> None:
        self._about_to_show()
        super().showPopup()


class Fp8Field(QWidget):
    #: The calibration chosen: its run folder ("" for none: bf16).
    changed = Signal(str)

    def __init__(self, parent: QWidget | None = None, *, machine: Callable[[], dict[str, str]] | None = None,
                 runs_root: str | Path | None = None, serve_ranks: Callable[[], int] | None = None) -> None:
        """``machine``: this machine as a manifest records it (the app's ``AppServices.machine``; by
        default a CPU machine); ``runs_root``: the runs store listed (default: the app's);
        ``serve_ranks``: a serve's tensor-parallel ranks (its cards), checked against the calibration's
        (without it: an evaluation's one process, which takes a calibration on one rank only)."""
        super().__init__(parent)
        self._serve_ranks = serve_ranks
        self._machine = machine or (lambda: fp8.machine_of("cpu", []))
        self._runs_root = runs_root
        self._model = ""
        self._local = True
        #: Why no calibration can be chosen ("" when one can): an Evaluate window's adapter-only run.
        self._unavailable = ""
        #: Folders chosen with Browse… (offered whatever model they measured: the check says so).
        self._browsed: list[str] = []
        self._scanned: list[tuple[Path, dict[str, Any]]] | None = None
        #: (folder, model, machine, ranks) of the last check and its line: checked once, where it entered.
        self._checked: tuple[tuple[str, str, tuple[tuple[str, str], ...], int | None], str] | None = None

        self.combo = _RunsCombo(self._rescan, self)
        self.combo.setObjectName("fp8_run")
        self.combo.setToolTip(TIP)
        self.combo.addItem(NONE_LABEL, "")
        # Sized by a few characters, not by its longest run name: the Serve dock stays narrow.
        self.combo.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
        self.combo.setMinimumContentsLength(16)
        self.browse_button = QPushButton("Browse…", self)
        self.browse_button.setToolTip("a calibrate run's folder (its manifest.json says what it measured)")
        self.error = QLabel(self)
        self.error.setObjectName("fp8_error")
        self.error.setWordWrap(True)
        self.error.setStyleSheet("color: #b00020")
        self.error.hide()
        row = QHBoxLayout()
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.combo, 1)
        row.addWidget(self.browse_button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.setSpacing(1)
        layout.addLayout(row)
        layout.addWidget(self.error)

        self.combo.currentIndexChanged.connect(lambda _index: self._chosen())
        self.browse_button.clicked.connect(lambda _checked=False: self._browse())

    # -- what the form asks ---------------------------------------------------------------------------

    def value(self) -> str:
        """The chosen calibration's run folder ("" for none, and on a host: its files are the host's)."""
        return str(self.combo.currentData() or "") if self._local and not self._unavailable else ""

    def problem(self) -> str:
        """The line that refuses the chosen calibration for the model on this machine ("" when it fits
        or none is chosen); checked when it was chosen, again only when the model or machine changed."""
        folder = self.value()
        if not folder:
            return ""
        here = self._machine()
        ranks = self._serve_ranks() if self._serve_ranks is not None else None
        key = (folder, self._model, tuple(sorted(here.items())), ranks)
        if self._checked is None or self._checked[0] != key:
            self._checked = (key, fp8.refusal(folder, model=self._model, here=here, serve_ranks=ranks,
                                              evaluating=ranks is None)[1])
        return self._checked[1]

    def show_error(self, line: str) -> None:
        self.error.setText(line)
        self.error.setVisible(bool(line))
        self._fit_error()

    def _fit_error(self) -> None:
        """The line's wrapped height held as its least: a form in a dock's scroll area sizes its rows
        by their least heights, and squeezed the line over the rows below it."""
        if self.error.isVisible() and self.error.text():
            width = max(self.error.width(), self.width(), 160)
            self.error.setMinimumHeight(self.error.heightForWidth(width))
        else:
            self.error.setMinimumHeight(0)

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        self._fit_error()

    def clear_error(self) -> None:
        self.show_error("")

    # -- what the form tells it -----------------------------------------------------------------------

    def set_model(self, model: str) -> None:
        """The model chosen in the form: the calibrations of that model are offered (a chosen one stays
        when it measured it; else the field goes back to none)."""
        if model.strip() == self._model:
            return
        self._model = model.strip()
        self._relist()
        self._said()

    def set_local(self, local: bool) -> None:
        """Whether the job runs on this machine: on a host the calibrations are the host's (the host's
        command checks its own ``--fp8``), so the field is off here."""
        self._local = local
        self._enable()

    def set_unavailable(self, why: str) -> None:
        """No calibration can be chosen, and why (a tooltip); "" makes the field usable again."""
        self._unavailable = why
        self._enable()

    def _enable(self) -> None:
        usable = self._local and not self._unavailable
        for widget in (self.combo, self.browse_button):
            widget.setEnabled(usable)
        self.combo.setToolTip(TIP if usable else self._unavailable or ON_A_HOST)
        self._said()
        self.changed.emit(self.value())

    # -- inside ---------------------------------------------------------------------------------------

    def _calibrations(self) -> list[tuple[Path, dict[str, Any]]]:
        if self._scanned is None:
            self._scanned = fp8.calibrations(self._runs_root or RunStore().root)
        return self._scanned

    def _rescan(self) -> None:
        self._scanned = None
        self._relist()

    def _relist(self) -> None:
        current = str(self.combo.currentData() or "")
        offered = [(item_label(folder, manifest), str(folder.resolve()))
                   for folder, manifest in self._calibrations() if fp8.calibrated_for(manifest, self._model)]
        known = {folder for _label, folder in offered}
        offered += [(f"{Path(f).name} (browsed)", f) for f in self._browsed if f not in known]
        self.combo.blockSignals(True)
        self.combo.clear()
        self.combo.addItem(NONE_LABEL, "")
        for label, folder in offered:
            self.combo.addItem(label, folder)
            self.combo.setItemData(self.combo.count() - 1, folder, Qt.ItemDataRole.ToolTipRole)
        index = self.combo.findData(current) if current else 0
        self.combo.setCurrentIndex(max(index, 0))
        self.combo.blockSignals(False)
        if str(self.combo.currentData() or "") != current:
            self.changed.emit(self.value())

    def _browse(self) -> None:
        start = str(self._runs_root or RunStore().root)
        chosen = QFileDialog.getExistingDirectory(self, "Choose a calibrate run folder", start)
        if not chosen:
            return
        folder = str(Path(chosen).resolve())
        if folder not in self._browsed:
            self._browsed.append(folder)
        self._relist()
        self.combo.setCurrentIndex(max(self.combo.findData(folder), 0))

    def _chosen(self) -> None:
        self._said()
        self.changed.emit(self.value())

    def _said(self) -> None:
        """The chosen calibration checked as it enters: its refusal at the field, or nothing."""
        self.show_error(self.problem())


__all__ = ["NONE_LABEL", "Fp8Field", "item_label"]

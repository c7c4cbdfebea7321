"""Beside a model field (the Model runner, Serve, Evaluate, the Training form): whether the named model
is in the Hugging Face cache of the place that will load it ("cached on gg-server, 1.2 GB"),
**Download…** when it is not, and that place's cached models offered in the field, most recently used
first, with their sizes.

What a place's cache holds comes from ``ModelPlaces`` (``gaudi-gui models --json`` there, in the
background: a child here, one ssh call for a host); this view starts no process and never waits.
Typing stays free: any Hub id, a local folder or ``builtin:demo``.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QEvent, QModelIndex, QObject, QPersistentModelIndex, QRect, QSize, Qt, Signal
from PySide6.QtGui import QPainter, QResizeEvent, QStandardItem, QStandardItemModel
from PySide6.QtWidgets import (
    QComboBox,
    QCompleter,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QStyle,
    QStyledItemDelegate,
    QStyleOptionViewItem,
    QWidget,
)

from gaudi_gui.core import hub
from gaudi_gui.core.remote import Host
from gaudi_gui.services.downloads import Download, ModelPlaces

#: The size and last use of a cached model, in an item of the field's list (drawn on its right).
DETAIL_ROLE = 0x0100 + 41  # Qt.ItemDataRole.UserRole + 41; read at import, Qt's enums cost ~40 ms
#: How many cached models a field offers.
MAX_OFFERED = 40

# A Hub id as far as a field can tell without importing huggingface_hub: "name" or "org/name".
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}(/[A-Za-z0-9][A-Za-z0-9._-]{0,95})?$")


def hub_id_or_none(text: str) -> str | None:
    """``text`` if it can only be a Hub model id (not a folder, not ``builtin:``), else None."""
    text = text.strip()
    if not text or not _HUB_ID.match(text) or ".." in text or "--" in text or text.endswith(".git"):
        return None
    if os.path.isdir(os.path.expanduser(text)):
        return None  # a folder of that name here: from_pretrained loads the folder
    return text


def _ago(ts: float) -> str:
    """"3 days ago", "5 h ago", "12 min ago", "just now" ("" when unknown): a list's glance."""
    if not ts:
        return ""
    seconds = max(0.0, time.time() - ts)
    if seconds >= 2 * 86400:
        return f"{seconds // 86400:.0f} days ago"
    if seconds >= 3600:
        return f"{seconds // 3600:.0f} h ago"
    if seconds >= 60:
        return f"{seconds // 60:.0f} min ago"
    return "just now"


def describe(repo: dict[str, Any]) -> str:
    """"1.2 GB · used 2h ago": what a field's list says on a cached model's right."""
    used = _ago(float(repo.get("last_used") or 0))
    return hub.human(repo.get("size")) + (f" · used {used}" if used else "")


def _list_width(view: QWidget, repos: list[dict[str, Any]]) -> int:
    """A list's width that holds its widest id and detail side by side (at most 720 px)."""
    metrics = view.fontMetrics()
    return min(720, 60 + max(metrics.horizontalAdvance(f"{r['repo_id']}  {describe(r)}") for r in repos))


class DetailDelegate(QStyledItemDelegate):
    """Draws an item's ``DETAIL_ROLE`` (size, last use) right-aligned and dimmed after its text: the
    item's text stays the bare model id, which is what choosing it puts in the field."""

    def paint(self, painter: QPainter, option: QStyleOptionViewItem,
              index: QModelIndex | QPersistentModelIndex) -> None:
        super().paint(painter, option, index)
        detail = index.data(DETAIL_ROLE)
        if not detail:
            return
        text_width = option.fontMetrics.horizontalAdvance(str(index.data() or ""))
        detail_width = option.fontMetrics.horizontalAdvance(str(detail))
        if text_width + detail_width + 36 > option.rect.width():
            return  # no room beside the id: the id matters more (its tooltip has the detail)
        painter.save()
        selected = bool(option.state & QStyle.StateFlag.State_Selected)
        palette = option.palette
        painter.setPen(palette.highlightedText().color() if selected else palette.placeholderText().color())
        rect: QRect = option.rect.adjusted(0, 0, -6, 0)
        painter.drawText(rect, int(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter), str(detail))
        painter.restore()


    def sizeHint(self, option: QStyleOptionViewItem, index: QModelIndex | QPersistentModelIndex) -> QSize:
        hint = super().sizeHint(option, index)
        detail = index.data(DETAIL_ROLE)
        if detail:  # room for the detail, so that a list sized to its items shows it
            hint.setWidth(hint.width() + option.fontMetrics.horizontalAdvance(str(detail)) + 36)
        return hint


class WrappedLine(QLabel):
    """A wrapped label whose height is that of its text at its present width. QLabel's is the height
    at its least width: in a form the row under the model field was five lines tall for a one-line
    sentence at 1280 px."""

    def _at_width(self, hint: QSize) -> QSize:
        width = self.width() if self.width() > self.minimumWidth() else 480
        if self.wordWrap() and self.text():
            hint.setHeight(self.heightForWidth(width))
        return hint

    def minimumSizeHint(self) -> QSize:
        return self._at_width(super().minimumSizeHint())

    def sizeHint(self) -> QSize:
        return self._at_width(super().sizeHint())

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if event.oldSize().width() != event.size().width():
            self.updateGeometry()  # a new width: a new least height

    def setText(self, text: str) -> None:
        super().setText(text)
        self.updateGeometry()


class ModelCacheState(QWidget):
    """A line under a model field ("cached on this machine, 1.2 GB" / "not in gg-server's cache") and
    the **Download…** button beside the field (``button``: the view places it). The field is a
    ``QComboBox`` (editable) or a ``QLineEdit``; ``place`` gives the host that will load the model.

    The button is enabled when the field names a Hub id that the place's cache does not hold (or
    could not be listed); it asks for the Download dialog with ``download_requested``."""

    #: Download… was clicked: (the model id in the field, the place's host name).
    download_requested = Signal(str, str)

    def __init__(self, field: QComboBox | QLineEdit, places: ModelPlaces | None,
                 place: Callable[[], Host], parent: QWidget | None = None, *,
                 button: QPushButton | None = None, button_in_line: bool = False,
                 action: str = "Load") -> None:
        """``button_in_line``: Download… at the start of this line (a narrow form: the field keeps
        its width) rather than placed by the view beside the field; ``action``: the view's button
        that would otherwise fetch the model silently (Load, Start)."""
        super().__init__(parent)
        self._action = action
        self.field = field
        self.places = places
        self._place = place
        #: The ids this field offered from the cache last time (kept apart from the user's own items).
        self._offered: list[str] = []
        self._offered_for = ""
        self.setObjectName("model_cache_state")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        self.label = WrappedLine("", self)
        self.label.setObjectName("model_cache_label")
        self.label.setWordWrap(True)
        self.label.setStyleSheet("color: palette(placeholder-text)")
        self.label.setMinimumWidth(120)
        self.button = button or QPushButton("Download…")
        if button_in_line:
            layout.addWidget(self.button, 0, Qt.AlignmentFlag.AlignTop)
        layout.addWidget(self.label, 1)
        self.button.setObjectName("model_download_button")
        self.button.clicked.connect(lambda _checked=False: self._on_download_clicked())

        # The place's cached models, offered as the user types (a completer with sizes) and, in a
        # drop-down field, first in its list.
        self._model = QStandardItemModel(self)
        self.completer = QCompleter(self._model, self)
        self.completer.setCaseSensitivity(Qt.CaseSensitivity.CaseInsensitive)
        self.completer.setFilterMode(Qt.MatchFlag.MatchContains)
        self.completer.setCompletionMode(QCompleter.CompletionMode.PopupCompletion)
        self.completer.setMaxVisibleItems(12)
        popup = self.completer.popup()
        assert popup is not None
        popup.setItemDelegate(DetailDelegate(popup))
        popup.setObjectName("model_cache_popup")
        field.installEventFilter(self)
        if isinstance(field, QComboBox):
            # Sized by a fixed number of characters, not its widest item: a long cached id would
            # widen the form, and with it the window (past a 1024-pixel screen with Serve open).
            field.setSizeAdjustPolicy(QComboBox.SizeAdjustPolicy.AdjustToMinimumContentsLengthWithIcon)
            field.setMinimumContentsLength(16)
            edit = field.lineEdit()
            if edit is not None:
                edit.installEventFilter(self)
            field.setCompleter(self.completer)
            field.setItemDelegate(DetailDelegate(field))
            field.currentTextChanged.connect(self._on_text)
        else:
            field.setCompleter(self.completer)
            field.textChanged.connect(self._on_text)
        self._jobs: set[int] = set()
        if places is not None:
            places.cache_changed.connect(self._on_cache_changed)
            places.download_started.connect(self._on_download_started)
            for job in places.running():
                self._watch(job)
        self.place_changed()

    # The line's height is its text's at its present width (see WrappedLine): the form sized the
    # row from this widget's hints, which Qt computes for the label's least width.
    def sizeHint(self) -> QSize:
        hint = super().sizeHint()
        hint.setHeight(max(self.button.sizeHint().height() if self.button.parent() is self else 0,
                           self.heightForWidth(self.width() if self.width() > 200 else 480)))
        return hint

    def minimumSizeHint(self) -> QSize:
        hint = super().minimumSizeHint()
        hint.setHeight(self.sizeHint().height())
        return hint

    def resizeEvent(self, event: QResizeEvent) -> None:
        super().resizeEvent(event)
        if event.oldSize().width() != event.size().width():
            self.updateGeometry()

    # -- what the view tells it -----------------------------------------------------------------------

    def _on_text(self, _text: str) -> None:
        self.update_state()

    def text(self) -> str:
        field = self.field
        return (field.currentText() if isinstance(field, QComboBox) else field.text()).strip()

    def place(self) -> Host:
        return self._place()

    def place_changed(self) -> None:
        """The place that loads the model changed (or was first known)."""
        self._offer()
        self.update_state()

    def _ensure_listed(self) -> None:
        """Ask for the place's cache (in the background) if this app has not listed it yet: when the
        field names a Hub id or the user goes into it, not when a view is built (a window showing
        builtin:demo or a folder lists nothing)."""
        if self.places is not None:
            self.places.check_cache(self.place())

    def eventFilter(self, watched: QObject, event: QEvent) -> bool:
        if event.type() == QEvent.Type.FocusIn:
            self._ensure_listed()
        return False

    # -- state --------------------------------------------------------------------------------------

    def _where(self, host: Host) -> str:
        return "this machine" if host.is_local else host.name

    def cached(self) -> dict[str, Any] | None:
        """The place's cache entry for the field's model (None: not cached, or not known)."""
        model = hub_id_or_none(self.text())
        known = self.places.cached_models(self.place().name) if self.places is not None else None
        if model is None or known is None:
            return None
        # Exactly as typed: the cache's folder is named after the id as given, so "qwen/qwen3-0.6b"
        # is not "Qwen/Qwen3-0.6B" for a load without the network.
        return next((r for r in known if r["repo_id"] == model), None)

    def _other_spelling(self, model: str) -> str | None:
        """The cached id that differs from ``model`` only in case, if any."""
        known = (self.places.cached_models(self.place().name) if self.places is not None else None) or []
        return next((r["repo_id"] for r in known if r["repo_id"].lower() == model.lower()), None)

    def _running_download(self) -> Download | None:
        model, host = hub_id_or_none(self.text()), self.place()
        if model is None or self.places is None:
            return None
        return next((d for d in self.places.running() if d.host.name == host.name
                     and d.request.repo_id == model), None)

    def update_state(self) -> None:
        """The line and the button for what the field names now (no process, no wait)."""
        text, host = self.text(), self.place()
        where = self._where(host)
        model = hub_id_or_none(text)
        enable, tip = False, ""
        if not text:
            state = ""
        elif text.startswith("builtin:"):
            state = "the bundled demo model: nothing to download"
        elif model is None:
            state = ("a folder: loaded as it is, nothing to download" if "/" in text or text.startswith("~")
                     else "")
            tip = "Download… takes a Hub id (org/name)"
        elif self.places is None:
            state, enable = "", True
        elif self.places.cached_models(host.name) is None and not self.places.cache_problem(host.name) \
                and not self.places.is_checking_cache(host.name):
            self._ensure_listed()  # says cache_changed at once: this method runs again
            return
        elif (job := self._running_download()) is not None:
            event = job.progress
            total = int(event.get("bytes_total") or 0)
            pct = f" {100 * int(event.get('bytes_done') or 0) / total:.0f} %" if total else ""
            state = f"downloading to {where}:{pct} (Models tab)"
            tip = "already downloading there"
        elif (entry := self.cached()) is not None and entry.get("incomplete"):
            state, enable = f"in {where}'s cache but incomplete: {entry['incomplete']}", True
            tip = "Download… fetches what is missing (finished files are kept)"
        elif entry is not None:
            refs = f" ({', '.join(entry['refs'])})" if entry.get("refs") else ""
            state = f"cached on {where}, {hub.human(entry['size'])}{refs}: no network needed"
            tip = f"{model} is in {where}'s Hugging Face cache already"
        elif (other := self._other_spelling(model)) is not None:
            state, enable = (f"not in {where}'s cache as typed; it holds {other} (the cache goes by the "
                             "exact spelling)"), True
        elif self.places.is_checking_cache(host.name):
            state, enable = f"checking {where}'s model cache…", True
        elif problem := self.places.cache_problem(host.name):
            state, enable = f"{where}'s cache could not be listed: {problem}", True
        else:
            state, enable = f"not in {where}'s cache ({self._action} would fetch it unseen)", True
        self.label.setText(state)
        self.label.setToolTip(state)
        self.updateGeometry()
        self.button.setEnabled(enable)
        self.button.setToolTip(tip or f"Download this Hub model into {where}'s Hugging Face cache first: "
                                      "its size and free disk before, then progress, stall retries and a "
                                      "check of what arrived (Models tab)")

    def _on_download_clicked(self) -> None:
        model = hub_id_or_none(self.text())
        self.download_requested.emit(model or "", self.place().name)

    # -- the cached models in the field -------------------------------------------------------------

    def _offer(self) -> None:
        host = self.place()
        known = (self.places.cached_models(host.name) if self.places is not None else None) or []
        known = known[:MAX_OFFERED]
        self._model.clear()
        popup = self.completer.popup()
        if popup is not None and known:
            popup.setMinimumWidth(_list_width(popup, known))
        for repo in known:
            item = QStandardItem(repo["repo_id"])
            item.setData(describe(repo), DETAIL_ROLE)
            item.setToolTip(f"cached on {self._where(host)}: {describe(repo)}")
            self._model.appendRow(item)
        field = self.field
        if not isinstance(field, QComboBox):
            return
        ids = [r["repo_id"] for r in known]
        if ids == self._offered and host.name == self._offered_for:
            for index, repo in enumerate(known):  # sizes and uses may have changed
                field.setItemData(index, describe(repo), DETAIL_ROLE)
            return
        # Replace what this field offered before (the user's own entries stay below); keep the text.
        text = field.currentText()
        field.blockSignals(True)
        for old in self._offered:
            index = field.findText(old)
            if index >= 0 and field.itemData(index, DETAIL_ROLE):
                field.removeItem(index)
        for index, repo in enumerate(known):
            existing = field.findText(repo["repo_id"])
            if existing >= 0:
                field.removeItem(existing)
            field.insertItem(index, repo["repo_id"])
            field.setItemData(index, describe(repo), DETAIL_ROLE)
            field.setItemData(index, f"cached on {self._where(host)}: {describe(repo)}",
                              Qt.ItemDataRole.ToolTipRole)
        field.setCurrentText(text)
        field.blockSignals(False)
        # The list as wide as its widest id and detail (a narrow form's field would overlap them).
        view = field.view()
        if view is not None:
            view.setMinimumWidth(_list_width(view, known) if known else 0)
        self._offered = ids
        self._offered_for = host.name

    def _on_cache_changed(self, host_name: str) -> None:
        if host_name == self.place().name:
            self._offer()
            self.update_state()

    def _on_download_started(self, job: Download) -> None:
        self._watch(job)
        self.update_state()

    def _watch(self, job: Download) -> None:
        if id(job) in self._jobs:
            return
        self._jobs.add(id(job))
        # Bound methods, not lambdas: Qt drops the connection when this view goes before the job.
        job.progress_changed.connect(self._on_job_progress)
        job.finished.connect(self._on_job_finished)

    def _on_job_progress(self, _event: dict) -> None:
        self.update_state()

    def _on_job_finished(self, _ok: bool, _message: str, _path: str) -> None:
        self.update_state()

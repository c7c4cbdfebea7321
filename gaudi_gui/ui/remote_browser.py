"""The "Browse HOST" dialog: a folder picker that browses a host's folders (model paths are the host's).

Every listing is a ``files.list`` request that the ``services.remote_files.RemoteFiles`` service sends
to the agent, which carries it to the host's agent (its one ssh session); the dialog binds to its
``AgentListing`` and starts no process. Nothing blocks the GUI thread; while a listing runs the dialog says
"loading…", and a failure (no such folder, permission denied, ssh itself) is said in the dialog, in
the service's words.

The folder list shows ".." first, then the folders (model folders marked: they hold config.json or
adapter_config.json), then the files (greyed, not choosable). Double-click or Enter on a folder goes
into it, on ".." goes up; Enter in the path field lists what was typed. "Choose" picks the selected
folder, or the folder shown when nothing (or "..") is selected. A second tab lists the models in the
host's Hugging Face cache as Hub ids (listed when the tab is first shown); choosing one gives the id.

The last folder shown per host is remembered by the service for this session only.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QItemSelectionModel, Qt, Signal
from PySide6.QtGui import QColor, QFont
from PySide6.QtWidgets import (
    QDialog,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QListWidget,
    QListWidgetItem,
    QPushButton,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core.metrics import format_size
from gaudi_gui.core.remote import Host
from gaudi_gui.services.remote_files import CACHE, FOLDER, AgentListing, RemoteFiles

PATH_ROLE = Qt.ItemDataRole.UserRole
KIND_ROLE = Qt.ItemDataRole.UserRole + 1
KIND_UP, KIND_DIR, KIND_FILE, KIND_HUB = "up", "dir", "file", "hub"
MODEL_MARK = "  — model"
_ERROR_STYLE = "color: #b00020;"


class RemoteBrowser(QDialog):
    """Pick a folder (or a cached Hub id) on ``host``; ``chosen`` holds it after ``accepted``. With
    ``files``: pick a file (a dataset): files are choices, a double-click on one chooses it, and there
    is no cache tab."""

    #: A listing has been shown: (kind "folder" | "cache", the folder or cache path).
    listing_shown = Signal(str, str)
    #: A listing failed: (kind "folder" | "cache", the message shown).
    listing_failed = Signal(str, str)

    def __init__(self, host: Host, files: RemoteFiles, start: str = "",
                 parent: QWidget | None = None, *, pick_files: bool = False) -> None:
        super().__init__(parent)
        self.host = host
        self.pick_files = pick_files
        self._files = files
        self.chosen = ""
        self.folder = ""  #: the folder shown (as the host resolved it)
        self._listing: AgentListing | None = None
        self._cache_loaded = False
        self.setWindowTitle(f"Browse {host.name}")
        self.resize(640, 480)

        self.path = QLineEdit()
        self.path.setPlaceholderText(f"a folder on {host.name} (Enter lists it; ~ is {host.name}'s home)")
        self.path.returnPressed.connect(self._on_path_entered)
        self.entries = QListWidget()
        self.entries.setToolTip("Double-click or Enter: open a folder ('..' goes up)")
        self.entries.itemActivated.connect(self._on_entry_activated)
        self.hub_models = QListWidget()
        self.hub_models.setToolTip(f"Models in {host.name}'s Hugging Face cache: double-click or Enter "
                                   f"chooses the Hub id (it loads from that cache)")
        self.hub_models.itemActivated.connect(lambda item: self.choose())
        self.tabs = QTabWidget()
        folders = QWidget()
        folders_layout = QVBoxLayout(folders)
        folders_layout.setContentsMargins(0, 0, 0, 0)
        folders_layout.addWidget(self.path)
        folders_layout.addWidget(self.entries, 1)
        self.tabs.addTab(folders, "Folders")
        if not pick_files:
            self.tabs.addTab(self.hub_models, "Hugging Face cache")
        self.tabs.currentChanged.connect(lambda index: self._on_tab_changed())
        self.status = QLabel("")
        self.status.setWordWrap(True)
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.choose_button = QPushButton("Choose")
        self.choose_button.setToolTip("Use the selected file" if pick_files else
                                      "Use the selected folder (or the folder shown) as the model")
        self.choose_button.clicked.connect(self.choose)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.clicked.connect(self.reject)
        # Enter belongs to the list (open a folder) and the path field (list it): no button may take
        # it as the dialog's default.
        for button in (self.choose_button, self.cancel_button):
            button.setAutoDefault(False)
            button.setDefault(False)
        buttons = QHBoxLayout()
        buttons.addWidget(self.status, 1)
        buttons.addWidget(self.choose_button)
        buttons.addWidget(self.cancel_button)
        layout = QVBoxLayout(self)
        layout.addWidget(self.tabs, 1)
        layout.addLayout(buttons)

        self.list_folder(start or files.last_folder(host.name) or "~")

    # -- listing ----------------------------------------------------------------------------------------

    def list_folder(self, path: str) -> None:
        """List ``path`` on the host (replacing a listing still under way)."""
        self.path.setText(path)
        self.entries.clear()
        self._follow(lambda: self._files.list_folder(self.host, path))

    def _follow(self, start: Callable[[], AgentListing]) -> None:
        self._abandon()
        self._set_status("loading…")
        self.choose_button.setEnabled(False)
        listing = start()
        listing.finished.connect(lambda answer, message: self._on_finished(listing, answer, message))
        self._listing = listing

    def _abandon(self) -> None:
        """Stop waiting for the current listing; the service kills its child in the background."""
        listing, self._listing = self._listing, None
        if listing is not None:
            listing.cancel()

    def done(self, result: int) -> None:
        self._abandon()
        super().done(result)

    def _on_finished(self, listing: AgentListing, answer: dict[str, Any], message: str) -> None:
        if listing is not self._listing:
            return
        self._listing = None
        self.choose_button.setEnabled(True)
        if message:
            if listing.kind == FOLDER:
                self.folder = ""  # Choose must not take a folder that is no longer shown
            self._set_status(message, error=True)
            self.listing_failed.emit(listing.kind, message)
            return
        if listing.kind == FOLDER:
            self._show_folder(answer)
        else:
            self._show_cache(answer)

    def _set_status(self, text: str, *, error: bool = False) -> None:
        self.status.setText(text)
        self.status.setStyleSheet(_ERROR_STYLE if error else "")

    def _show_folder(self, answer: dict[str, Any]) -> None:
        folder = str(answer.get("path", ""))
        self.folder = folder
        self.path.setText(folder)
        self.entries.clear()
        if folder != "/":
            up = QListWidgetItem("..")
            up.setData(PATH_ROLE, str(answer.get("parent") or posixpath.dirname(folder)))
            up.setData(KIND_ROLE, KIND_UP)
            up.setToolTip("the folder above")
            self.entries.addItem(up)
        bold = QFont(self.entries.font())
        bold.setBold(True)
        first_dir: QListWidgetItem | None = None
        entries = answer.get("entries") or []
        for entry in entries:
            name = str(entry.get("name", ""))
            path = posixpath.join(folder, name)
            if entry.get("is_dir"):
                model = bool(entry.get("model"))
                item = QListWidgetItem(name + "/" + (MODEL_MARK if model else ""))
                item.setData(KIND_ROLE, KIND_DIR)
                item.setToolTip(f"{path}\n(a model folder)" if model else path)
                if model:
                    item.setFont(bold)
                first_dir = first_dir or item
            else:
                item = QListWidgetItem(f"{name}    {format_size(int(entry.get('size') or 0))}")
                item.setData(KIND_ROLE, KIND_FILE)
                if not self.pick_files:
                    item.setForeground(QColor("#808080"))
                    # Files are shown for context (config.json tells a model folder) but are not choices.
                    item.setFlags(Qt.ItemFlag.ItemIsEnabled)
            item.setData(PATH_ROLE, path)
            self.entries.addItem(item)
        # The keyboard starts on the first folder, but nothing is selected: Choose takes the folder
        # shown until the person selects an entry.
        if first_dir is not None:
            self.entries.setCurrentItem(first_dir, QItemSelectionModel.SelectionFlag.NoUpdate)
        elif self.entries.count():
            self.entries.setCurrentRow(0, QItemSelectionModel.SelectionFlag.NoUpdate)
        note = f"{len(entries)} entries"
        if answer.get("model"):
            note = "This folder is a model folder. " + note
        if answer.get("truncated"):
            note += " (the listing was cut short)"
        if answer.get("skipped"):
            note += f"; {answer['skipped']} names that are not UTF-8 left out"
        self._set_status(note)
        self.entries.setFocus()
        self.listing_shown.emit(FOLDER, folder)

    def _show_cache(self, answer: dict[str, Any]) -> None:
        self._cache_loaded = True
        self.hub_models.clear()
        cache = str(answer.get("cache", ""))
        models = answer.get("models") or []
        for model in models:
            hub_id = str(model.get("id", ""))
            item = QListWidgetItem(f"{hub_id}    {format_size(int(model.get('size') or 0))}")
            item.setData(PATH_ROLE, hub_id)
            item.setData(KIND_ROLE, KIND_HUB)
            item.setToolTip(str(model.get("path", "")))
            self.hub_models.addItem(item)
        if models:
            self.hub_models.setCurrentRow(0)
            self._set_status(f"{len(models)} models in {cache}")
        else:
            self._set_status(f"No models in {self.host.name}'s Hugging Face cache ({cache}).")
        self.hub_models.setFocus()
        self.listing_shown.emit(CACHE, cache)

    # -- the person's actions ---------------------------------------------------------------------------

    def _on_path_entered(self) -> None:
        text = self.path.text().strip()
        if text:
            self.list_folder(text)

    def _on_entry_activated(self, item: QListWidgetItem) -> None:
        kind = item.data(KIND_ROLE)
        if kind in (KIND_UP, KIND_DIR):
            self.list_folder(str(item.data(PATH_ROLE)))
        elif kind == KIND_FILE and self.pick_files and self._listing is None:
            self.chosen = str(item.data(PATH_ROLE))
            self.accept()

    def _on_tab_changed(self) -> None:
        if self.tabs.currentWidget() is self.hub_models:
            if not self._cache_loaded and self._listing is None:
                self.hub_models.clear()
                self._follow(lambda: self._files.list_cache(self.host))
        elif self._listing is not None and self._listing.kind == CACHE:
            self._abandon()
            self.choose_button.setEnabled(True)
            self._set_status("")

    def choose(self) -> None:
        """Accept with the selected folder, the folder shown, or (Hub cache tab) the selected id."""
        if self._listing is not None:
            return
        if self.tabs.currentWidget() is self.hub_models:
            item = self.hub_models.currentItem()
            if item is None:
                self._set_status("Select a model of the cache first.", error=True)
                return
            self.chosen = str(item.data(PATH_ROLE))
        else:
            if not self.folder:
                self._set_status("No folder is shown: type one and press Enter.", error=True)
                return
            item = self.entries.currentItem()
            wanted = KIND_FILE if self.pick_files else KIND_DIR
            selected = item is not None and item.isSelected() and item.data(KIND_ROLE) == wanted
            if self.pick_files and not selected:
                self._set_status("Select a file first.", error=True)
                return
            self.chosen = str(item.data(PATH_ROLE)) if selected and item is not None else self.folder
        self.accept()

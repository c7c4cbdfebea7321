"""The Models tab: the models in the Hugging Face cache of this machine and of every saved host (id,
revision, size, last use, where), a Download… action, the downloads with their progress, and the way
from a model to the Model runner or the Training form.

It binds to ``ModelPlaces`` (``gaudi_gui.services.downloads``), which asks the agent of each place to
list its cache (``models.list``), delete a revision (``models.delete``) and start ``gaudi-gui download``;
this view starts no process and waits for nothing: a slow or unreachable host says "listing…", then why.
"""

from __future__ import annotations

from typing import Any

from PySide6.QtCore import Qt, Signal
from PySide6.QtGui import QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QFrame,
    QGroupBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core import hub
from gaudi_gui.core.metrics import format_ago
from gaudi_gui.core.remote import Host
from gaudi_gui.services.context import AppServices
from gaudi_gui.services.downloads import Download, DownloadRequest, ModelPlaces, listing_rows
from gaudi_gui.services.remote_files import AgentListing

COLUMNS = ("Model", "Revision", "Size", "Last used", "Where")


class _SizeItem(QTableWidgetItem):
    """Sorts by the bytes it holds, not by its text."""

    def __lt__(self, other: QTableWidgetItem) -> bool:
        mine, theirs = self.data(Qt.ItemDataRole.UserRole), other.data(Qt.ItemDataRole.UserRole)
        if isinstance(mine, (int, float)) and isinstance(theirs, (int, float)):
            return mine < theirs
        return super().__lt__(other)


class DownloadRow(QWidget):
    """One download: its title, a bar, bytes · rate · ETA · files, what happened in words, Cancel, and
    once done the way to the runner and the Training form."""

    #: (host name, repo id)
    use_in_runner_requested = Signal(str, str)
    #: (host name, repo id)
    use_in_training_requested = Signal(str, str)

    def __init__(self, job: Download, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.job = job
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 4, 0, 4)
        top = QHBoxLayout()
        self.title = QLabel(f"<b>{job.title}</b>")
        self.title.setTextFormat(Qt.TextFormat.RichText)
        top.addWidget(self.title, 1)
        self.cancel_button = QPushButton("Cancel")
        self.cancel_button.setToolTip("Stop this download (finished files stay in the cache)")
        self.cancel_button.clicked.connect(lambda _checked=False: self.job.cancel())
        self.runner_button = QPushButton("Use in Model runner")
        self.runner_button.clicked.connect(
            lambda _checked=False: self.use_in_runner_requested.emit(job.host.name, job.request.repo_id))
        self.training_button = QPushButton("Use in Training")
        self.training_button.clicked.connect(
            lambda _checked=False: self.use_in_training_requested.emit(job.host.name, job.request.repo_id))
        for button in (self.cancel_button, self.runner_button, self.training_button):
            top.addWidget(button)
        self.runner_button.hide()
        self.training_button.hide()
        layout.addLayout(top)
        self.bar = QProgressBar()
        self.bar.setRange(0, 0)  # busy until the plan says how much
        layout.addWidget(self.bar)
        self.status = QLabel("planning: listing the files and their sizes…")
        self.status.setObjectName("download_status")
        layout.addWidget(self.status)
        self.notes = QLabel("")
        self.notes.setObjectName("download_notes")
        self.notes.setWordWrap(True)
        self.notes.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        layout.addWidget(self.notes)
        job.progress_changed.connect(self._on_progress)
        job.note_added.connect(self._on_note)
        job.finished.connect(self._on_finished)
        for note in job.notes:
            self._on_note(note)

    def _on_progress(self, event: dict[str, Any]) -> None:
        total = int(event.get("bytes_total") or 0)
        if total > 0:
            # QProgressBar holds an int: kilobytes keep a 100 GB model within range.
            self.bar.setRange(0, max(1, total // 1024))
            done = min(total, int(event.get("bytes_done") or 0))
            self.bar.setValue(done // 1024)
            self.bar.setFormat(f"{100 * done / total:.0f} %")  # the same figure as the line below
        self.status.setText(self.job.status_text())

    def _on_note(self, text: str) -> None:
        self.title.setText(f"<b>{self.job.title}</b>")  # a re-attached job learns its model from its plan
        lines = [*self.notes.text().splitlines(), text][-6:]
        self.notes.setText("\n".join(lines))

    def _on_finished(self, ok: bool, message: str, _path: str) -> None:
        self.cancel_button.hide()
        if self.bar.maximum() == 0:
            self.bar.setRange(0, 1)
        if ok:
            self.bar.setValue(self.bar.maximum())
            self.runner_button.show()
            self.training_button.show()
        status = self.job.status_text() if self.job.progress else ""
        self.status.setText(("Done. " if ok else ("Cancelled. " if self.job.cancelled else "Failed. "))
                            + (status if ok else message))
        self.status.setStyleSheet("" if ok else "color: #b00020")
        # The job told in the past what held only while it ran ("it goes on if the window closes").
        self.notes.setText("\n".join(self.job.notes[-6:]))


class ModelsTab(QWidget):
    """Views ``ModelPlaces`` and the saved hosts."""

    #: (host name, repo id): put this model in the Model runner (its host chosen there).
    use_in_runner_requested = Signal(str, str)
    #: (host name, repo id): put this model in the Training form's model field.
    use_in_training_requested = Signal(str, str)

    def __init__(self, services: AppServices, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._services = services
        self.places: ModelPlaces = services.ensure_models(services.settings.parent())
        self._hosts = services.ensure_hosts(services.settings.parent())
        self._listings: dict[str, AgentListing] = {}
        self._rows: dict[str, list[dict[str, Any]]] = {}
        self._problems: dict[str, str] = {}
        #: Free disk of each place's cache (None: that place did not say).
        self._free: dict[str, int | None] = {}
        self.download_rows: list[DownloadRow] = []
        self._deleting: AgentListing | None = None
        #: The last deletion's outcome, shown above the places' lines.
        self._action = ""

        layout = QVBoxLayout(self)
        top = QHBoxLayout()
        intro = QLabel("Models in the Hugging Face cache of this machine and of every saved host: "
                       "what the runner, Serve, Evaluate and training load without the network.")
        intro.setWordWrap(True)
        top.addWidget(intro, 1)
        self.refresh_button = QPushButton("Refresh")
        self.refresh_button.clicked.connect(lambda _checked=False: self.refresh())
        self.download_button = QPushButton("Download…")
        self.download_button.setToolTip("Download a Hub model into this machine's or a host's cache")
        self.download_button.clicked.connect(lambda _checked=False: self.open_download_dialog())
        top.addWidget(self.refresh_button)
        top.addWidget(self.download_button)
        layout.addLayout(top)

        self.table = QTableWidget(0, len(COLUMNS))
        self.table.setObjectName("models_table")
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().hide()
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in range(1, len(COLUMNS)):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        layout.addWidget(self.table, 2)
        self.status = QLabel("")
        self.status.setObjectName("models_status")
        self.status.setWordWrap(True)
        layout.addWidget(self.status)
        use = QHBoxLayout()
        use.addStretch(1)
        self.use_runner_button = QPushButton("Use in Model runner")
        self.use_runner_button.clicked.connect(lambda _checked=False: self._use(self.use_in_runner_requested))
        self.use_training_button = QPushButton("Use in Training")
        self.use_training_button.clicked.connect(
            lambda _checked=False: self._use(self.use_in_training_requested))
        self.delete_button = QPushButton("Delete…")
        self.delete_button.setToolTip("Delete this revision from its place's cache (asks first, with the "
                                      "space it frees)")
        self.delete_button.clicked.connect(lambda _checked=False: self.delete_selected())
        self.calibrate_button = QPushButton("Calibrate FP8…")
        self.calibrate_button.setToolTip("Measure this model for FP8 on this machine (Intel Neural "
                                         "Compressor)")
        self.calibrate_button.clicked.connect(lambda _checked=False: self.open_calibrate())
        #: The Calibrate window (made on first use; its calibration is the agent's job).
        self.calibrate_dialog: Any = None
        use.addWidget(self.delete_button)
        use.addWidget(self.calibrate_button)
        use.addWidget(self.use_runner_button)
        use.addWidget(self.use_training_button)
        layout.addLayout(use)

        self.downloads_box = QGroupBox("Downloads")
        box_layout = QVBoxLayout(self.downloads_box)
        box_layout.setContentsMargins(0, 0, 0, 0)
        # The downloads scroll (newest on top) rather than push the library off a small screen.
        holder = QWidget()
        self._downloads_layout = QVBoxLayout(holder)
        self._downloads_layout.addStretch(1)
        scroll = QScrollArea()
        scroll.setWidget(holder)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QFrame.Shape.NoFrame)
        box_layout.addWidget(scroll)
        self.downloads_box.hide()
        layout.addWidget(self.downloads_box, 3)

        self.places.download_started.connect(self._on_download_started)
        self.places.model_downloaded.connect(lambda host, _repo, _path: self._refresh_if_shown(host))
        self._hosts.changed.connect(lambda: self._refresh_if_shown(None))
        for job in self.places.downloads:
            self._on_download_started(job)
        # Downloads left running by an earlier window (or `gaudi-gui download --detach`): followed again.
        self.places.reattach()
        self._update_buttons()
        self._listed_once = False

    def showEvent(self, event: QShowEvent) -> None:
        # Listed when first looked at, not when the window builds its tabs: each listing reads a whole
        # cache (its agent's ``models.list``) and, for a host, brings its link up.
        super().showEvent(event)
        if not self._listed_once:
            self._listed_once = True
            self.refresh()
            # Downloads left running on a host by an earlier window: the window asked every saved
            # host at its start; a host added since is asked now (once per host and app).
            self.places.reattach_hosts(self.places_shown()[1:])

    # -- the library ------------------------------------------------------------------------------

    def _refresh_if_shown(self, host_name: str | None) -> None:
        if self._listed_once:
            self.refresh(host_name)

    def places_shown(self) -> list[Host]:
        return [Host.local(), *self._hosts.saved()]

    def refresh(self, host_name: str | None = None) -> None:
        """List every place's cache again (or only ``host_name``'s)."""
        hosts = [h for h in self.places_shown() if host_name is None or h.name == host_name]
        known = {h.name for h in self.places_shown()}
        for name in [n for n in self._rows if n not in known]:
            self._rows.pop(name, None)
            self._problems.pop(name, None)
        for host in hosts:
            old = self._listings.pop(host.name, None)
            if old is not None:
                old.cancel()
            listing = self.places.list_models(host)
            listing.finished.connect(lambda answer, message, h=host, lst=listing:
                                     self._on_listing(h, lst, answer, message))
            self._listings[host.name] = listing
        self._show()

    def is_listing(self) -> bool:
        return bool(self._listings)

    def _on_listing(self, host: Host, listing: AgentListing, answer: dict[str, Any], message: str) -> None:
        if self._listings.get(host.name) is not listing:
            return
        del self._listings[host.name]
        listing.deleteLater()
        if message:
            self._problems[host.name] = message
            self._rows.pop(host.name, None)
        else:
            self._problems.pop(host.name, None)
            self._rows[host.name] = listing_rows(host, answer)
            self.places.remember_listing(host.name, answer)  # the model fields read it too
            free = answer.get("free_bytes")
            self._free[host.name] = int(free) if isinstance(free, int) else None
        self._show()

    def _show(self) -> None:
        rows = [row for rows in self._rows.values() for row in rows]
        rows.sort(key=lambda r: (-r["size"], r["repo_id"], r["where"]))
        table = self.table
        table.setSortingEnabled(False)
        table.setRowCount(len(rows))
        for index, row in enumerate(rows):
            refs = f" ({', '.join(row['refs'])})" if row["refs"] else ""
            incomplete = row.get("incomplete") or ""
            # A revision whose files did not all arrive is marked where it is read: it will not load.
            name = QTableWidgetItem(row["repo_id"] + (" ⚠ incomplete" if incomplete else ""))
            name.setData(Qt.ItemDataRole.UserRole, row)
            name.setToolTip(f"incomplete: {incomplete}\n{row['path']}" if incomplete else row["path"])
            size = _SizeItem(hub.human(row["size"]))
            size.setData(Qt.ItemDataRole.UserRole, row["size"])
            used = _SizeItem(format_ago(row["last_used"]))
            used.setData(Qt.ItemDataRole.UserRole, -row["last_used"])
            for column, item in enumerate((name, QTableWidgetItem(row["commit"][:12] + refs), size, used,
                                           QTableWidgetItem(row["where"]))):
                table.setItem(index, column, item)
        table.setSortingEnabled(True)
        parts = []
        for host in self.places_shown():
            if host.name in self._listings:
                parts.append(f"{host.label}: listing…")
            elif host.name in self._problems:
                parts.append(f"{host.label}: {self._problems[host.name]}")
            elif host.name in self._rows:
                found = self._rows[host.name]
                size = sum(r["size"] for r in found)
                free = self._free.get(host.name)
                broken = sum(1 for r in found if r.get("incomplete"))
                parts.append(f"{host.label}: {len(found)} revision{'s' if len(found) != 1 else ''}"
                             + (f" ({broken} incomplete)" if broken else "") + f", {hub.human(size)}"
                             + (f"; {hub.human(free)} free" if free is not None else ""))
        self.status.setText("\n".join([self._action, *parts] if self._action else parts))
        self._update_buttons()

    def selected(self) -> dict[str, Any] | None:
        items = self.table.selectedItems()
        if not items:
            return None
        first = self.table.item(items[0].row(), 0)
        data = first.data(Qt.ItemDataRole.UserRole) if first is not None else None
        return data if isinstance(data, dict) else None

    def _update_buttons(self) -> None:
        chosen = self.selected() is not None
        self.use_runner_button.setEnabled(chosen)
        self.use_training_button.setEnabled(chosen)
        self.delete_button.setEnabled(chosen and not self._deleting)
        row = self.selected()
        # A host's model is calibrated on the host (the Calibrate window's Where is set to it).
        self.calibrate_button.setEnabled(row is not None)

    def open_calibrate(self) -> None:
        """The Calibrate window for the chosen model (one window; a new choice fills its model)."""
        row = self.selected()
        if row is None:
            return
        from gaudi_gui.ui.calibrate_view import CalibrateDialog
        if self.calibrate_dialog is None:
            from gaudi_gui.services.calibrate import CalibrateJob
            job = CalibrateJob(lambda: self._services.ensure_agent(self.window()), self)
            services = self._services
            self.calibrate_dialog = CalibrateDialog(
                job, self, model=str(row["repo_id"]),
                hosts=lambda: services.ensure_hosts(services.settings.parent()).saved())
        elif not self.calibrate_dialog.view.job.running:
            self.calibrate_dialog.view.model.setText(str(row["repo_id"]))
        self.calibrate_dialog.view.set_place(str(row.get("host") or ""))
        self.calibrate_dialog.show()
        self.calibrate_dialog.raise_()

    def _use(self, signal: Any) -> None:
        row = self.selected()
        if row is not None:
            signal.emit(row["host"], row["repo_id"])

    def delete_selected(self) -> None:
        """Ask (naming the revision, the place and the space it frees), then delete it there with that
        place's own agent (``models.delete``)."""
        row = self.selected()
        if row is None or self._deleting is not None:
            return
        from PySide6.QtWidgets import QMessageBox

        refs = f" ({', '.join(row['refs'])})" if row["refs"] else ""
        box = QMessageBox(self)
        box.setObjectName("delete_model_dialog")
        box.setIcon(QMessageBox.Icon.Warning)
        box.setWindowTitle("Delete a model")
        box.setText(f"Delete {row['repo_id']} @ {row['commit'][:12]}{refs} from the Hugging Face cache of "
                    f"{row['where']}?")
        box.setInformativeText(f"This frees {hub.human(row['size'])}. Loading it again needs the network "
                               "(or a new download).")
        delete = box.addButton("Delete", QMessageBox.ButtonRole.DestructiveRole)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.exec()
        if box.clickedButton() is not delete:
            return
        host = next((h for h in self.places_shown() if h.name == row["host"]), None)
        if host is None:
            return
        listing = self.places.delete_model(host, row["repo_id"], row["commit"])
        self._deleting = listing
        self._action = f"deleting {row['repo_id']} @ {row['commit'][:12]} on {row['where']}…"
        self._show()
        listing.finished.connect(lambda answer, message, h=host: self._on_deleted(h, answer, message))
        self._update_buttons()

    def _on_deleted(self, host: Host, answer: dict[str, Any], message: str) -> None:
        listing, self._deleting = self._deleting, None
        if listing is not None:
            listing.deleteLater()
        self._action = (f"{host.label}: not deleted: {message}" if message else
                        f"{host.label}: deleted {answer.get('repo_id')}, freed "
                        f"{hub.human(answer.get('freed_bytes'))}")
        self.refresh(host.name)

    # -- downloads ------------------------------------------------------------------------------------

    def open_download_dialog(self, repo_id: str = "", host: str = "local") -> None:
        """The Download dialog (non-blocking); Download starts the job."""
        from gaudi_gui.ui.download_dialog import DownloadDialog

        dialog = DownloadDialog(self.places_shown(), self, repo_id=repo_id, host=host, queue=True)
        dialog.accepted.connect(lambda d=dialog: self.queue_download(d.request()) if d.queued
                                else self.places.download(d.request()))
        dialog.finished.connect(lambda _code, d=dialog: d.deleteLater())
        dialog.open()

    def queue_download(self, request: DownloadRequest) -> None:
        """Queue (issue 29): the download goes into the queue of the machine it goes to (this one's,
        or the host's own), as the words ``download --detach`` takes; it uses no cards."""
        from gaudi_gui.core.queue import CardRequest

        words = request.words()
        where, repo_id, local = request.host.name, request.repo_id, request.host.is_local
        machine = "this machine (View → Queue)" if local else f"{where} (View → Queue, Machine: {where})"

        def answered(ok: bool, message: str) -> None:
            refused = f"not queued: {message}" if local else f"{repo_id}: not queued on {where}: {message}"
            self.status.setText(f"{repo_id}: queued on {machine}" if ok else refused)

        self.status.setText(f"{repo_id}: " + (f"queued on {machine}" if local else f"queueing on {where}…"))
        self._services.queue_for(where).add_kind("download", words, CardRequest(), on_answer=answered)

    def _on_download_started(self, job: Download) -> None:
        row = DownloadRow(job)
        row.use_in_runner_requested.connect(self.use_in_runner_requested)
        row.use_in_training_requested.connect(self.use_in_training_requested)
        self._downloads_layout.insertWidget(0, row)
        self.download_rows.insert(0, row)
        self.downloads_box.show()

    def shutdown(self) -> None:
        if self.calibrate_dialog is not None:
            self.calibrate_dialog.shutdown()
        for listing in list(self._listings.values()):
            listing.cancel()
        if self._deleting is not None:
            self._deleting.cancel()
            self._deleting = None
        self._listings.clear()

"""The "Download a model" dialog: a Hub id, a revision, where (this machine or a saved host), how long
a silence counts as a stall, and an optional token for a download on this machine.

It only builds a ``DownloadRequest``; the Models tab hands it to ``ModelPlaces``. What is wrong is
said under the fields and Download stays disabled until it is right.
"""

from __future__ import annotations

import os

from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFormLayout,
    QLabel,
    QLineEdit,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core.remote import Host
from gaudi_gui.services.downloads import (
    KEYRING_SERVICE,
    KEYRING_USERNAME,
    DownloadRequest,
    keyring_missing,
    keyring_token,
)


class DownloadDialog(QDialog):
    """Ask what to download and where; ``request()`` after ``accepted``."""

    def __init__(self, hosts: list[Host], parent: QWidget | None = None, *, repo_id: str = "",
                 host: str = "local", queue: bool = False) -> None:
        super().__init__(parent)
        self.setWindowTitle("Download a model")
        self.setObjectName("download_dialog")
        self._hosts = {h.name: h for h in hosts}
        layout = QVBoxLayout(self)
        form = QFormLayout()
        self.repo_id = QLineEdit(repo_id)
        self.repo_id.setObjectName("download_repo_id")
        self.repo_id.setPlaceholderText("org/name, e.g. Qwen/Qwen3-0.6B")
        form.addRow("Model (Hub id)", self.repo_id)
        self.revision = QLineEdit()
        self.revision.setObjectName("download_revision")
        self.revision.setPlaceholderText("main")
        self.revision.setToolTip("A branch, tag or commit; empty: main")
        form.addRow("Revision", self.revision)
        self.where = QComboBox()
        self.where.setObjectName("download_where")
        for h in hosts:
            self.where.addItem(h.label, h.name)
        index = self.where.findData(host)
        self.where.setCurrentIndex(max(0, index))
        self.where.setToolTip("Into whose Hugging Face cache: the model must be where the cards are")
        form.addRow("Download to", self.where)
        self.stall = QDoubleSpinBox()
        self.stall.setObjectName("download_stall")
        self.stall.setRange(0.5, 3600)
        self.stall.setDecimals(1)
        self.stall.setValue(60)
        self.stall.setSuffix(" s")
        self.stall.setToolTip("No byte for this long ends the attempt, which is retried with a back-off "
                              "(4 attempts; after 2 stalls over plain HTTP instead of Xet)")
        form.addRow("Retry after a stall of", self.stall)
        self.token = QLineEdit()
        self.token.setObjectName("download_token")
        self.token.setEchoMode(QLineEdit.EchoMode.Password)
        form.addRow("Token (optional)", self.token)
        # A token saved in the system keyring, for this machine's download (read when ticked, held
        # by this dialog alone, then given to the one download process in its environment).
        self.use_keyring = QCheckBox("Use the token saved in the system keyring")
        self.use_keyring.setObjectName("download_keyring")
        self._keyring_token = ""
        self.use_keyring.toggled.connect(self._on_keyring)
        form.addRow("", self.use_keyring)
        layout.addLayout(form)
        self.problem = QLabel("")
        self.problem.setObjectName("download_problem")
        self.problem.setWordWrap(True)
        self.problem.setStyleSheet("color: #b00020")
        layout.addWidget(self.problem)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        self.download_button = self.buttons.addButton("Download", QDialogButtonBox.ButtonRole.AcceptRole)
        self.download_button.setObjectName("download_start")
        #: Queue: the download waits in the queue of the machine it goes to (issue 29), then runs
        #: there as a job of its own; ``queued`` is then True when the dialog is accepted.
        self.queue_button = self.buttons.addButton("Queue", QDialogButtonBox.ButtonRole.ActionRole)
        self.queue_button.setObjectName("download_queue")
        self.queue_button.setToolTip("put this download in the queue of the machine it goes to: it starts "
                                     "by itself after the jobs before it, window open or not")
        self.queue_button.setVisible(queue)
        self.queue_button.clicked.connect(lambda _checked=False: self._queue())
        self.queued = False
        self.buttons.accepted.connect(self._accept)
        self.buttons.rejected.connect(self.reject)
        layout.addWidget(self.buttons)
        for edit in (self.repo_id, self.revision, self.token):
            edit.textChanged.connect(lambda _text: self._check())
        self.where.currentIndexChanged.connect(lambda _index: self._on_where())
        self.stall.valueChanged.connect(lambda _value: self._check())
        self._on_where()
        self.repo_id.setFocus()

    def host(self) -> Host:
        return self._hosts.get(str(self.where.currentData() or "local"), Host.local())

    def request(self) -> DownloadRequest:
        host = self.host()
        token = (self._keyring_token if self.use_keyring.isChecked() else self.token.text().strip()) \
            if host.is_local else ""
        return DownloadRequest(repo_id=self.repo_id.text().strip(), revision=self.revision.text().strip(),
                               host=host, stall_s=float(self.stall.value()), token=token)

    def _has_token(self) -> bool:
        return bool(self.token.text().strip()) or (self.use_keyring.isChecked() and bool(self._keyring_token))

    def _on_keyring(self, on: bool) -> None:
        """Ticked: the keyring's token is read now (not when the dialog opens: a locked keyring may
        ask its own question); none there is said under the fields and the box unticked."""
        self._keyring_token = ""
        if on:
            token, why = keyring_token()
            if not token:
                self.use_keyring.blockSignals(True)
                self.use_keyring.setChecked(False)
                self.use_keyring.blockSignals(False)
                self._on_where()
                self.problem.setText(why)
                return
            self._keyring_token = token
        self._on_where()

    def _on_where(self) -> None:
        host = self.host()
        own_login = bool(os.environ.get("HF_TOKEN")) or None
        if host.is_local:
            self.token.setEnabled(True)
            self.token.setPlaceholderText("empty: your own login here (HF_TOKEN or `hf auth login`)"
                                          if own_login is None else "empty: HF_TOKEN of this session")
            self.token.setToolTip("Only for a gated or private model this machine's login cannot see. "
                                  "Given to the download process alone, in its environment: never on a "
                                  "command line, in a file or a log")
            missing = keyring_missing()
            self.use_keyring.setEnabled(not missing)
            self.use_keyring.setText("Use the token saved in the system keyring" if not missing else
                                     "Use the token saved in the system keyring (needs the Python "
                                     "package keyring)")
            self.use_keyring.setToolTip(missing or (
                f"the token saved with `keyring set {KEYRING_SERVICE} {KEYRING_USERNAME}`: given to this "
                "download process alone, in its environment (never on a command line, in a file or a log)"))
            if self.use_keyring.isChecked():
                self.token.clear()
                self.token.setEnabled(False)
                self.token.setPlaceholderText("the system keyring's token is used")
        else:
            self.token.clear()
            self.token.setEnabled(False)
            self.token.setPlaceholderText(f"{host.name}'s own login is used")
            self.use_keyring.blockSignals(True)
            self.use_keyring.setChecked(False)
            self.use_keyring.blockSignals(False)
            self._keyring_token = ""
            self.use_keyring.setEnabled(False)
            self.use_keyring.setToolTip(f"A download on {host.name} uses the login there: no token "
                                        "crosses the connection")
            self.token.setToolTip(f"A download on {host.name} uses the login there (`hf auth login` on "
                                  f"{host.name}): no token crosses the connection")
        self._check()

    def _check(self) -> bool:
        text = self.repo_id.text().strip()
        problem = self.request().problem() if text else None
        self.problem.setText(problem or "")
        self.download_button.setEnabled(bool(text) and problem is None)
        self.queue_button.setEnabled(bool(text) and problem is None)
        return bool(text) and problem is None

    def _queue(self) -> None:
        if not self._check():
            return
        if self._has_token():
            # A queued job waits in the queue's files: a typed token would have to wait there too.
            self.problem.setText("a download with a typed token cannot be queued (the token would wait "
                                 "in the queue's files): Download starts it now, or clear the token")
            return
        self.queued = True
        self.accept()

    def _accept(self) -> None:
        if self._check():
            self.accept()

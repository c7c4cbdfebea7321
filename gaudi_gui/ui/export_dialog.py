"""Export…: where a run's metrics and meter go, TensorBoard event files or trackio's local storage
(``core.export``; the same as ``gaudi-gui runs export RUN --tensorboard DIR`` / ``--trackio``).

TensorBoard asks for a folder (``DIR/<run name>/`` is written; Browse… picks it). trackio asks for its
folder (default: TRACKIO_DIR, else ``~/.cache/huggingface/trackio``, where ``trackio show`` looks) and
a project (default "gaudi-gui"); where trackio is not installed its choice is off and says so. A
problem is said at the field, and nothing is exported until it is fixed. The dialog decides nothing
else: the Runs list runs the export (``export_requested``)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Signal
from PySide6.QtWidgets import (
    QButtonGroup,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QRadioButton,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core import export

TRACKERS = ("tensorboard", "trackio")


class ExportDialog(QDialog):
    #: Export was pressed with valid fields: (tracker: "tensorboard" | "trackio", folder, project; ""
    #: for TensorBoard).
    export_requested = Signal(str, str, str)

    def __init__(self, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Export a run")
        self.run_label = QLabel(self)
        self.tensorboard = QRadioButton("TensorBoard event files", self)
        self.trackio = QRadioButton("trackio (its local storage)", self)
        self.choice = QButtonGroup(self)
        for button in (self.tensorboard, self.trackio):
            self.choice.addButton(button)
            button.toggled.connect(self._update)
        self.tb_folder = QLineEdit(self)
        self.tb_folder.setPlaceholderText("a folder: tensorboard --logdir FOLDER")
        self.browse = QPushButton("Browse…", self)
        self.browse.clicked.connect(self._browse)
        self.trackio_dir = QLineEdit(str(export.default_trackio_dir()), self)
        self.project = QLineEdit(export.TRACKIO_PROJECT, self)
        self.trackio_note = QLabel(self)
        self.trackio_note.setWordWrap(True)
        #: What is wrong with the fields (empty when nothing is).
        self.problem = QLabel(self)
        self.problem.setWordWrap(True)
        self.problem.setStyleSheet("color: #b00020")
        for edit in (self.tb_folder, self.trackio_dir, self.project):
            edit.textChanged.connect(self._update)
        folder_row = QHBoxLayout()
        folder_row.addWidget(self.tb_folder, 1)
        folder_row.addWidget(self.browse)
        form = QFormLayout()
        form.addRow(self.tensorboard)
        form.addRow("folder", folder_row)
        form.addRow(self.trackio)
        form.addRow("trackio folder", self.trackio_dir)
        form.addRow("project", self.project)
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel, self)
        self.export_button = self.buttons.addButton("Export", QDialogButtonBox.ButtonRole.AcceptRole)
        self.buttons.accepted.connect(self._export)
        self.buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.run_label)
        layout.addLayout(form)
        layout.addWidget(self.trackio_note)
        layout.addWidget(self.problem)
        layout.addWidget(self.buttons)
        self.tensorboard.setChecked(True)
        self._trackio_missing = ""
        self.check_trackio()

    def check_trackio(self) -> None:
        """Offer trackio only where it can be imported (looked up, not imported: the export's child
        imports it)."""
        self._trackio_missing = export.trackio_state()
        self.trackio.setEnabled(not self._trackio_missing)
        if self._trackio_missing and self.trackio.isChecked():
            self.tensorboard.setChecked(True)
        self.trackio_note.setText(f"trackio: {self._trackio_missing}" if self._trackio_missing else
                                  "trackio: the run is written as a trackio run of its name (exporting "
                                  "again replaces it); see it with `trackio show --project NAME`.")
        self._update()

    def prepare(self, run_name: str, folder: str) -> None:
        """Before showing: the run to export, and the TensorBoard folder the last export went to."""
        self.run_label.setText(f"Export {run_name}'s metrics and meter to:")
        if folder:
            self.tb_folder.setText(folder)
        self.check_trackio()

    def tracker(self) -> str:
        return "trackio" if self.trackio.isChecked() else "tensorboard"

    def problem_text(self) -> str:
        """Why Export cannot go on ('' when it can)."""
        if self.tracker() == "tensorboard":
            if not self.tb_folder.text().strip():
                return "choose a folder for the TensorBoard files"
            return ""
        if self._trackio_missing:
            return self._trackio_missing
        if not self.trackio_dir.text().strip():
            return "say where trackio keeps its projects (its folder)"
        return export.trackio_project_problem(self.project.text().strip()) or ""

    def _update(self) -> None:
        tb = self.tracker() == "tensorboard"
        for widget in (self.tb_folder, self.browse):
            widget.setEnabled(tb)
        for widget in (self.trackio_dir, self.project):
            widget.setEnabled(not tb)
        problem = self.problem_text()
        self.problem.setText(problem)
        self.export_button.setEnabled(not problem)

    def _browse(self) -> None:
        start = self.tb_folder.text().strip() or str(Path.home())
        folder = QFileDialog.getExistingDirectory(self, "Export to a TensorBoard folder", start)
        if folder:
            self.tb_folder.setText(folder)

    def _export(self) -> None:
        if self.problem_text():
            return
        if self.tracker() == "tensorboard":
            self.export_requested.emit("tensorboard", self.tb_folder.text().strip(), "")
        else:
            self.export_requested.emit("trackio", self.trackio_dir.text().strip(),
                                       self.project.text().strip())
        self.accept()


__all__ = ["TRACKERS", "ExportDialog"]

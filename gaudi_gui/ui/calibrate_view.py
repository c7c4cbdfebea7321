"""The Calibrate view (a window of its own, opened from the Models tab or from a finished training run):
measure a model for FP8 with Intel Neural Compressor, through this machine's agent (``gaudi-gui
calibrate``), and read what the run folder keeps: the model and its revision, the device and card
generation it was measured on, the rows, INC's and torch's versions, the measurement files.

It starts nothing itself: ``services.calibrate.CalibrateJob`` asks the agent. What to do with the
calibration (``serve --fp8 RUN`` with vLLM on Gaudi, ``eval --model M --fp8 RUN``) is said under it; those
commands check the manifest against the machine they run on.

"Where" is this machine or a saved host: scales belong to the card generation they were measured on, so
a Gaudi host's model is calibrated on the host (its agent, over the host's one ssh session; model and
dataset are the host's paths then, Browse… lists the host's folders). "Cards" picks the cards measured
with (one process a card, one file set a rank). A calibration that ends on a host is also kept here
(``runs --host H fetch``, the agent's child): Runs and Compare list it, and ``runs --host H2 push``
takes it to another host of the same generation.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QComboBox,
    QDialog,
    QFileDialog,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core import fp8
from gaudi_gui.core.remote import Host
from gaudi_gui.services.agent_child import AgentChild
from gaudi_gui.services.calibrate import CalibrateJob

#: The scale method's choices: the device's default first (maxabs_hw on Gaudi, maxabs_pow2 elsewhere).
SCALE_CHOICES = (("the device's default", ""), *((m, m) for m in fp8.SCALE_METHODS))


class CalibrateView(QWidget):
    def __init__(self, job: CalibrateJob, parent: QWidget | None = None, *, model: str = "",
                 hosts: Callable[[], list[Host]] | None = None) -> None:
        super().__init__(parent)
        self.job = job
        #: The saved hosts (the app's host list in memory, ``AppServices.hosts``), by name.
        self._hosts = {h.name: h for h in (hosts() if hosts is not None else [])}
        self.model = QLineEdit(model, self)
        self.model.setObjectName("calibrate_model")
        self.model.setPlaceholderText("a Hub id, a model folder or a training run's folder (its final "
                                      "model)")
        self.dataset = QLineEdit(self)
        self.dataset.setObjectName("calibrate_dataset")
        self.dataset.setPlaceholderText("calibration prompts: JSONL as Training takes it, or text (one a "
                                        "line)")
        self.browse_button = QPushButton("Browse…", self)
        self.browse_button.clicked.connect(lambda: self._browse())  # noqa: PLW0108
        dataset_row = QHBoxLayout()
        dataset_row.addWidget(self.dataset, 1)
        dataset_row.addWidget(self.browse_button)
        self.prompts = QPlainTextEdit(self)
        self.prompts.setObjectName("calibrate_prompts")
        self.prompts.setPlaceholderText("or prompts typed here, one a line")
        self.prompts.setFixedHeight(70)
        self.rows = QSpinBox(self)
        self.rows.setObjectName("calibrate_rows")
        self.rows.setRange(1, fp8.MAX_ROWS)
        self.rows.setValue(fp8.DEFAULT_ROWS)
        self.rows.setToolTip("rows measured, at most")
        self.observer = QComboBox(self)
        self.observer.addItems(list(fp8.OBSERVERS))
        self.scale = QComboBox(self)
        self.scale.setObjectName("calibrate_scale")
        for text, value in SCALE_CHOICES:
            self.scale.addItem(text, value)
        self.scale.setToolTip("maxabs_hw (Intel's default on Gaudi) needs an HPU; on a CPU maxabs_pow2 with "
                              "Q/DQ")
        self.blocklist = QLineEdit(",".join(fp8.DEFAULT_BLOCKLIST), self)
        self.blocklist.setToolTip("module names left in high precision, comma-separated")
        self.where = QComboBox(self)
        self.where.setObjectName("calibrate_where")
        self.where.addItem("This machine", "")
        for name in self._hosts:
            self.where.addItem(name, name)
        self.where.setToolTip("where the model is measured: scales belong to the card generation they are "
                              "measured on (a Gaudi host's model is calibrated on the host)")
        self.where.currentIndexChanged.connect(lambda _i: self._where_changed())
        self.device = QComboBox(self)
        self.device.setObjectName("calibrate_device")
        for text, value in (("the machine's cards (auto)", "auto"), ("Gaudi (hpu)", "hpu"),
                            ("CUDA", "cuda"), ("CPU (checks the flow, not speed)", "cpu")):
            self.device.addItem(text, value)
        self.device.setToolTip("what the model is measured on: scales are the device's (a calibration on "
                               "the CPU serves on the CPU only)")
        self.cards = QLineEdit(self)
        self.cards.setObjectName("calibrate_cards")
        self.cards.setPlaceholderText("one card (e.g. 0,1,2,3: a process a card, one file set a rank; "
                                      "serve with as many tensor-parallel ranks)")
        #: The copy of a host's calibration brought here (the agent's ``fetch`` child).
        self.fetch_child: AgentChild | None = None
        self.kept_here = ""
        self.browser: QDialog | None = None
        self.run_button = QPushButton("&Calibrate", self)
        self.run_button.setObjectName("calibrate_run")
        self.run_button.clicked.connect(lambda: self.start())  # noqa: PLW0108
        self.stop_button = QPushButton("Stop", self)
        self.stop_button.setObjectName("calibrate_stop")
        self.stop_button.setEnabled(False)
        self.stop_button.clicked.connect(lambda: self.job.stop())  # noqa: PLW0108
        self.progress = QProgressBar(self)
        self.progress.setVisible(False)
        self.status = QLabel("Not calibrated yet: FP8 measurements of this model on the machine chosen.",
                             self)
        self.status.setObjectName("calibrate_status")
        self.status.setWordWrap(True)
        self.status.setTextFormat(Qt.TextFormat.PlainText)
        self.result = QLabel("", self)
        self.result.setObjectName("calibrate_result")
        self.result.setWordWrap(True)
        self.result.setTextFormat(Qt.TextFormat.PlainText)
        self.result.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # After a calibration: the model quantized with it, against the model itself (gaudi-gui eval
        # --model M --fp8 RUN through the agent, on a few of the calibration prompts).
        self.check_job = job.sibling("eval")
        self.check_button = QPushButton("Evaluate in FP8", self)
        self.check_button.setObjectName("calibrate_check")
        self.check_button.setToolTip("answer a few of the calibration prompts with the model quantized to "
                                     "FP8 and with the model itself (gaudi-gui eval --fp8)")
        self.check_button.setEnabled(False)
        self.check_button.clicked.connect(lambda: self.check())  # noqa: PLW0108
        self.check_status = QLabel("", self)
        self.check_status.setObjectName("calibrate_check_status")
        self.check_status.setWordWrap(True)
        self.check_status.setTextFormat(Qt.TextFormat.PlainText)
        self.check_status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._manifest: dict[str, Any] = {}
        self._calibrated = ""

        title = QLabel("FP8 calibration (Intel Neural Compressor): run calibration prompts through the "
                       "model and keep the measurements, for serving or evaluating it in FP8 on a machine "
                       "of the same kind", self)
        title.setWordWrap(True)
        title.setStyleSheet("font-weight: bold;")
        form = QFormLayout()
        form.addRow("Where", self.where)
        form.addRow("Model", self.model)
        form.addRow("Dataset", dataset_row)
        form.addRow("Prompts", self.prompts)
        form.addRow("Rows", self.rows)
        form.addRow("Observer", self.observer)
        form.addRow("Scale method", self.scale)
        form.addRow("Blocklist", self.blocklist)
        form.addRow("Device", self.device)
        form.addRow("Cards", self.cards)
        buttons = QHBoxLayout()
        buttons.addWidget(self.run_button)
        buttons.addWidget(self.stop_button)
        buttons.addStretch(1)
        buttons.addWidget(self.check_button)
        layout = QVBoxLayout(self)
        layout.addWidget(title)
        layout.addLayout(form)
        layout.addLayout(buttons)
        layout.addWidget(self.progress)
        layout.addWidget(self.status)
        layout.addWidget(self.result)
        layout.addWidget(self.check_status, 1)

        job.started.connect(self._on_started)
        job.progress_changed.connect(self._on_progress)
        job.phase_changed.connect(self._on_phase)
        job.result_received.connect(self.show_manifest)
        job.finished.connect(self._on_finished)
        job.refused.connect(self._on_refused)
        self.check_job.started.connect(self._checking)
        self.check_job.phase_changed.connect(self._checking)
        self.check_job.result_received.connect(self._on_checked)
        self.check_job.finished.connect(self._on_check_finished)
        self.check_job.refused.connect(self._on_check_finished_words)

    def words(self) -> list[str]:
        """The command's words for what the fields say (each ``--option=value``: a prompt that begins
        with '-' stays a prompt)."""
        words = [f"--model={self.model.text().strip()}", f"--rows={self.rows.value()}",
                 f"--observer={self.observer.currentText()}", f"--blocklist={self.blocklist.text().strip()}"]
        if self.scale.currentData():
            words.append(f"--scale-method={self.scale.currentData()}")
        if self.dataset.text().strip():
            words.append(f"--dataset={self.dataset.text().strip()}")
        if self.device.currentData() != "auto":
            words.append(f"--device={self.device.currentData()}")
        if self.cards.text().strip():
            words.append(f"--cards={self.cards.text().strip()}")
        words += [f"--prompt={line}" for line in self.prompts.toPlainText().splitlines() if line.strip()]
        return words

    def place(self) -> str:
        """Where the next calibration goes: "" this machine, else the saved host's name."""
        return str(self.where.currentData() or "")

    def set_place(self, host: str) -> None:
        """Choose where to calibrate (a saved host's name; "" or "local": this machine)."""
        index = self.where.findData("" if host in ("", "local") else host)
        if index >= 0 and not self.job.running:
            self.where.setCurrentIndex(index)

    def _where_changed(self) -> None:
        host = self.place()
        self.model.setPlaceholderText(
            f"a Hub id, or a model folder or a training run's folder on {host}" if host else
            "a Hub id, a model folder or a training run's folder (its final model)")
        self.dataset.setPlaceholderText(
            f"calibration prompts: a file on {host} (JSONL as Training takes it, or text, one a line)"
            if host else "calibration prompts: JSONL as Training takes it, or text (one a line)")

    def start(self) -> None:
        self.check_button.setEnabled(False)
        self._manifest, self._calibrated, self.kept_here = {}, "", ""
        self.job.host = self.check_job.host = self.place()
        self.run_button.setEnabled(False)
        self.stop_button.setEnabled(True)
        self.status.setStyleSheet("")
        self.status.setText("Starting the calibration…")
        self.result.clear()
        self.job.start(self.words())

    def _browse(self) -> None:
        if self.place():
            self._browse_host(self.place())
            return
        path, _filter = QFileDialog.getOpenFileName(self, "Calibration prompts", "",
                                                    "Datasets (*.jsonl *.json *.txt);;All files (*)")
        if path:
            self.dataset.setText(path)

    def _browse_host(self, name: str) -> None:
        """The host's folders (its agent's ``files.list``), in the "Browse HOST" dialog; the file chosen
        fills the dataset field."""
        from gaudi_gui.services.remote_files import RemoteFiles
        from gaudi_gui.ui.remote_browser import RemoteBrowser
        host = self._hosts[name]
        text = self.dataset.text().strip()
        start = text.rsplit("/", 1)[0] if text.startswith("/") else ""
        dialog = RemoteBrowser(host, RemoteFiles(self.job.client(), self), start, parent=self,
                               pick_files=True)
        dialog.setWindowModality(Qt.WindowModality.WindowModal)
        dialog.accepted.connect(lambda: self.dataset.setText(dialog.chosen) if dialog.chosen else None)
        dialog.finished.connect(lambda _result: dialog.deleteLater())
        self.browser = dialog
        dialog.open()

    def _on_started(self, folder: str) -> None:
        self.status.setText(f"Running: {folder}")

    def _on_phase(self, words: str) -> None:
        if words:
            self.status.setText(f"{words} ({self.job.folder})")

    def _on_progress(self, done: int, total: int) -> None:
        self.progress.setVisible(True)
        self.progress.setRange(0, max(total, 1))
        self.progress.setValue(done)
        self.status.setText(f"Measuring: {done} of {total} rows ({self.job.folder})")

    def _on_refused(self, words: str) -> None:
        self._idle()
        self.status.setStyleSheet("color: #a33;")
        self.status.setText(words)

    def _on_finished(self, state: str, summary: str) -> None:
        self._idle()
        if state != "finished":
            self.status.setStyleSheet("color: #a33;")
        on = f" on {self.job.started_on}" if self.job.started_on else ""
        self.status.setText(f"{summary} — {self.job.folder}{on}")
        if state == "finished":
            self._calibration_done()
            if self.job.started_on:
                self._keep_here(self.job.started_on, self.job.folder)

    def _keep_here(self, host: str, folder: str) -> None:
        """A copy of the host's calibration in this machine's runs store (its manifest, configs and
        measurements: ``runs --host H fetch``, the agent's child): Runs and Compare list it."""
        saved = self._hosts[host]
        child = self.fetch_child = AgentChild(self, client=self.job.client(), tail_lines=10)
        said: list[str] = []
        child.line_received.connect(lambda stream, line: said.append(line) if stream == "stdout" else None)
        child.finished.connect(lambda code, status: self._kept(code, status, said, child))
        self.result.setText(f"{self.result.text()}\nKeeping a copy here…".strip())
        child.start("fetch", {"host": saved.name, "remote_command": saved.remote_command, "folder": folder,
                              **({"runs_dir": self.job.runs_dir} if self.job.runs_dir else {})})

    def _kept(self, code: int, status: str, said: list[str], child: AgentChild) -> None:
        answer: dict[str, Any] = {}
        if code == 0 and said:
            try:
                answer = json.loads(said[-1])
            except ValueError:
                answer = {}
        text = self.result.text().replace("\nKeeping a copy here…", "").replace("Keeping a copy here…", "")
        if isinstance(answer, dict) and answer.get("folder"):
            self.kept_here = str(answer["folder"])
            line = f"A copy is kept here: {self.kept_here} (Runs and Compare list it)"
        else:
            line = f"No copy was kept here: {(child.tail(1) or [status])[-1]}"
        self.result.setText(f"{text}\n{line}".strip())


    # -- the FP8 check ------------------------------------------------------------------------------

    def _checking(self, words: str) -> None:
        self.check_status.setText(f"Evaluating in FP8: {words}")

    def _calibration_done(self) -> None:
        """The calibration finished with its manifest (the two come in either order): it can be checked."""
        if self._manifest and not self.job.running:
            self._calibrated = self.job.folder
            self.check_button.setEnabled(not self.check_job.running)

    def check_prompts(self) -> list[str]:
        """A few of the calibration prompts: the typed ones, else the dataset's first."""
        typed = [line for line in self.prompts.toPlainText().splitlines() if line.strip()]
        if typed:
            return typed[:4]
        try:
            return fp8.read_prompts(self.dataset.text().strip(), 4) if self.dataset.text().strip() else []
        except fp8.Fp8Error:
            return []

    def check_words(self) -> list[str]:
        model = (self._manifest.get("model") or {}).get("model") or self.model.text().strip()
        return [f"--model={model}", f"--fp8={self._calibrated}", "--max-new-tokens=16",
                *(f"--prompt={p}" for p in self.check_prompts() or ["The capital of France is"])]

    def check(self) -> None:
        if not self._calibrated:
            return
        self.check_button.setEnabled(False)
        self.check_status.setStyleSheet("")
        self.check_status.setText("Starting the FP8 evaluation…")
        self.check_job.start(self.check_words())

    def _on_checked(self, record: dict[str, Any]) -> None:
        tuned, base = record.get("tuned") or {}, record.get("base") or {}
        said = tuned.get("fp8") or {}
        same, total = 0, 0
        try:
            for line in Path(str(record.get("answers") or "")).read_text(encoding="utf-8").splitlines():
                row = json.loads(line)
                total += 1
                same += int(row.get("base") == row.get("tuned"))
        except (OSError, ValueError):
            pass
        lines = [f"FP8 check: {said.get('quantized_modules')} modules quantized "
                 f"({', '.join(said.get('classes') or [])}; {said.get('scale_method')}"
                 f"{', Q/DQ' if said.get('qdq') else ''})",
                 f"{same} of {total} answers the same as the model's own; tokens/s: model "
                 f"{base.get('tokens_per_s')}, FP8 {tuned.get('tokens_per_s')}",
                 f"Answers: {record.get('answers')}"]
        if said.get("note"):
            lines.append(f"Note: {said['note']}")
        self.check_status.setText("\n".join(lines))

    def _on_check_finished(self, state: str, summary: str) -> None:
        self.check_button.setEnabled(bool(self._calibrated))
        if state != "finished":
            self._on_check_finished_words(summary)

    def _on_check_finished_words(self, words: str) -> None:
        self.check_button.setEnabled(bool(self._calibrated))
        self.check_status.setStyleSheet("color: #a33;")
        self.check_status.setText(f"FP8 evaluation: {words}")

    def _idle(self) -> None:
        self.run_button.setEnabled(True)
        self.stop_button.setEnabled(False)
        self.progress.setVisible(False)

    def show_manifest(self, manifest: dict[str, Any]) -> None:
        """What the calibration kept, as a person reads it, and how to use it."""
        model = manifest.get("model") or {}
        folder = self.job.folder or "RUN"
        lines = [f"Model: {model.get('model')} @ {model.get('revision')}",
                 f"Measured on: {manifest.get('device')} ({manifest.get('generation')}), "
                 f"{manifest.get('rows')} rows, observer {manifest.get('observer')}, scale method "
                 f"{manifest.get('scale_method')}",
                 f"Versions: INC {manifest.get('inc_version')}, torch {manifest.get('torch_version')}",
                 f"Files: {', '.join(manifest.get('measurements') or [])}",
                 f"Use: gaudi-gui eval --model {model.get('model')} --fp8 {folder}{self._on_host()}  (or "
                 "serve --fp8 with vLLM on Gaudi); a machine of another card generation must calibrate "
                 "again"]
        self.result.setText("\n".join(lines))
        self._manifest = dict(manifest)
        self._calibration_done()

    def _on_host(self) -> str:
        return f" --host {self.job.started_on}" if self.job.started_on else ""

    def shutdown(self) -> None:
        self.job.shutdown()
        self.check_job.shutdown()
        if self.fetch_child is not None:
            self.fetch_child.kill_tree()


class CalibrateDialog(QDialog):
    """The Calibrate view in a window of its own (not modal: a calibration takes minutes)."""

    def __init__(self, job: CalibrateJob, parent: QWidget | None = None, *, model: str = "",
                 hosts: Callable[[], list[Host]] | None = None) -> None:
        super().__init__(parent)
        self.setWindowTitle("Calibrate FP8")
        self.view = CalibrateView(job, self, model=model, hosts=hosts)
        layout = QVBoxLayout(self)
        layout.addWidget(self.view)
        self.resize(760, 620)

    def shutdown(self) -> None:
        self.view.shutdown()


__all__ = ["CalibrateDialog", "CalibrateView"]

"""The Model runner tab: load a model in the worker, chat or prompt, watch tokens stream, stop, measure."""

from __future__ import annotations

import time
from pathlib import Path

from PySide6.QtCore import Qt, QTimer
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut, QTextCursor
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QPushButton,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core import paths
from gaudi_gui.core.generation import (
    BUILTIN_PRESETS,
    DTYPES,
    QUANTIZATIONS,
    Conversation,
    GenerationParams,
    LoadOptions,
    format_bytes,
    format_stats,
)
from gaudi_gui.services import generation_client as gc
from gaudi_gui.services.context import AppServices
from gaudi_gui.services.process import describe_exit

MAX_RECENT = 10


class RunnerTab(QWidget):
    """Views the GenerationClient; the worker process itself lives in the client."""

    def __init__(self, services: AppServices, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._services = services
        self._settings = services.settings
        self.client = gc.GenerationClient(services.selection, parent=self)
        self.conversation = Conversation()
        self._answer = ""
        self._pending_user: str | None = None
        self._load_started = 0.0
        self._loaded_info: dict = {}

        # -- model ---------------------------------------------------------------------------------
        self.model = QComboBox()
        self.model.setEditable(True)
        self.model.setMinimumWidth(320)
        self.model.setToolTip("A Hub id (org/name), a local folder, or builtin:demo (offline demo model)")
        recent = [m for m in self._settings.get("runner/recent_models") if m]
        for entry in dict.fromkeys([paths.DEMO_MODEL_ID, *recent]):
            self.model.addItem(entry)
        self.model.setCurrentText(self._settings.get("runner/last_model") or paths.DEMO_MODEL_ID)
        browse = QPushButton("Browse…")
        browse.clicked.connect(self._browse)
        self.device = QComboBox()
        for value in ("auto", "hpu", "cuda", "cpu"):
            self.device.addItem(value, value)
        self.dtype = QComboBox()
        self.dtype.addItems(list(DTYPES))
        self.quantization = QComboBox()
        self.quantization.addItems(list(QUANTIZATIONS))
        self.compile = QCheckBox("torch.compile")
        self.compile.setToolTip("Compile the model's forward pass. On Gaudi, transformers turns any "
                                "backend into hpu_backend.")
        self.trust = QCheckBox("trust remote code")
        self.trust.setToolTip("Run Python code shipped with the model. Only for models you trust.")
        self.trust.toggled.connect(self._on_trust_toggled)
        self.load_button = QPushButton("&Load")
        self.load_button.clicked.connect(self.load_model)
        self.unload_button = QPushButton("Unload")
        self.unload_button.clicked.connect(self.client.unload)
        self.restart_button = QPushButton("Restart worker")
        self.restart_button.setToolTip("Kill the worker process and start a fresh one (reloads the model)")
        self.restart_button.clicked.connect(self.client.restart)
        self.model_status = QLabel("No model loaded.")
        self.model_status.setWordWrap(True)
        self.model_status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._restore_load_options()

        model_box = QGroupBox("Model")
        grid = QFormLayout(model_box)
        row = QHBoxLayout()
        row.addWidget(self.model, 1)
        row.addWidget(browse)
        grid.addRow("Model", row)
        opts = QHBoxLayout()
        for label, widget in (("device", self.device), ("dtype", self.dtype),
                              ("quantization", self.quantization)):
            opts.addWidget(QLabel(label))
            opts.addWidget(widget)
        opts.addWidget(self.compile)
        opts.addWidget(self.trust)
        opts.addStretch(1)
        grid.addRow(opts)
        buttons = QHBoxLayout()
        for b in (self.load_button, self.unload_button, self.restart_button):
            buttons.addWidget(b)
        buttons.addWidget(self.model_status, 1)
        grid.addRow(buttons)

        # -- generation parameters -----------------------------------------------------------------
        self.max_new_tokens = QSpinBox()
        self.max_new_tokens.setRange(1, 1_000_000)
        self.do_sample = QCheckBox("sample")
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(0.0, 10.0)
        self.temperature.setSingleStep(0.05)
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(0.0, 1.0)
        self.top_p.setSingleStep(0.01)
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 100_000)
        self.repetition_penalty = QDoubleSpinBox()
        self.repetition_penalty.setRange(0.0, 10.0)
        self.repetition_penalty.setSingleStep(0.05)
        self.num_beams = QSpinBox()
        self.num_beams.setRange(1, 64)
        self.seed = QLineEdit()
        self.seed.setPlaceholderText("random")
        self.stop_strings = QLineEdit()
        self.stop_strings.setPlaceholderText("e.g. \\n\\n, ###  (comma separated)")
        self.presets = QComboBox()
        self.presets.setToolTip("Saved parameter sets")
        self.presets.activated.connect(self._apply_preset)
        save_preset = QPushButton("Save preset…")
        save_preset.clicked.connect(self._save_preset)
        delete_preset = QPushButton("Delete")
        delete_preset.clicked.connect(self._delete_preset)
        self._refresh_presets()
        self.set_params(GenerationParams.from_dict(self._settings.get("runner/generation")))

        params_box = QGroupBox("Generation")
        form = QFormLayout(params_box)
        preset_row = QHBoxLayout()
        preset_row.addWidget(self.presets, 1)
        preset_row.addWidget(save_preset)
        preset_row.addWidget(delete_preset)
        form.addRow("Preset", preset_row)
        form.addRow("max_new_tokens", self.max_new_tokens)
        form.addRow("", self.do_sample)
        form.addRow("temperature", self.temperature)
        form.addRow("top_p", self.top_p)
        form.addRow("top_k", self.top_k)
        form.addRow("repetition_penalty", self.repetition_penalty)
        form.addRow("num_beams", self.num_beams)
        form.addRow("seed", self.seed)
        form.addRow("stop strings", self.stop_strings)
        self.chat_mode = QCheckBox("Chat mode (chat template, multi-turn)")
        self.chat_mode.setChecked(bool(self._settings.get("runner/chat_mode")))
        self.system_prompt = QPlainTextEdit(self._settings.get("runner/system_prompt"))
        self.system_prompt.setPlaceholderText("System prompt (chat mode)")
        self.system_prompt.setMaximumHeight(70)
        form.addRow(self.chat_mode)
        form.addRow("system", self.system_prompt)

        # -- conversation --------------------------------------------------------------------------
        self.view = QPlainTextEdit()
        self.view.setReadOnly(True)
        self.view.setPlaceholderText("Load a model, type below, press Ctrl+Enter.")
        self.prompt = QPlainTextEdit()
        self.prompt.setPlaceholderText("Prompt…  (Ctrl+Enter sends, Esc stops)")
        self.prompt.setMaximumHeight(110)
        self.send_button = QPushButton("Send")
        self.send_button.setToolTip("Ctrl+Enter")
        self.send_button.clicked.connect(self.send)
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Esc: the worker stops within one token")
        self.stop_button.clicked.connect(self.stop)
        self.copy_button = QPushButton("Copy answer")
        self.copy_button.clicked.connect(self.copy_answer)
        self.export_button = QPushButton("Export…")
        self.export_button.clicked.connect(self._export_dialog)
        self.clear_button = QPushButton("Clear")
        self.clear_button.clicked.connect(self.clear)
        self.stats = QLabel("")
        self.stats.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        chat_box = QWidget()
        chat = QVBoxLayout(chat_box)
        chat.setContentsMargins(0, 0, 0, 0)
        chat.addWidget(self.view, 1)
        chat.addWidget(self.stats)
        chat.addWidget(self.prompt)
        actions = QHBoxLayout()
        for b in (self.send_button, self.stop_button):
            actions.addWidget(b)
        actions.addStretch(1)
        for b in (self.copy_button, self.export_button, self.clear_button):
            actions.addWidget(b)
        chat.addLayout(actions)

        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(params_box)
        left_layout.addStretch(1)
        splitter = QSplitter()
        splitter.addWidget(left)
        splitter.addWidget(chat_box)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([340, 900])
        layout = QVBoxLayout(self)
        layout.addWidget(model_box)
        layout.addWidget(splitter, 1)

        QShortcut(QKeySequence("Ctrl+Return"), self, self.send)
        QShortcut(QKeySequence("Ctrl+Enter"), self, self.send)
        QShortcut(QKeySequence(Qt.Key.Key_Escape), self, self.stop)

        self._elapsed = QTimer(self)
        self._elapsed.setInterval(200)
        self._elapsed.timeout.connect(self._tick_loading)

        self.client.state_changed.connect(self._on_state)
        self.client.loading_progressed.connect(self._on_loading)
        self.client.model_loaded.connect(self._on_loaded)
        self.client.model_unloaded.connect(lambda: self.model_status.setText("Model unloaded."))
        self.client.token_received.connect(self._on_token)
        self.client.generation_finished.connect(self._on_finished)
        self.client.error_occurred.connect(self._on_error)
        self.client.info_received.connect(self.model_status.setText)
        self.client.worker_exited.connect(self._on_worker_exited)
        services.environment.probe_finished.connect(self._on_probe)
        if services.environment.result:
            self._on_probe(services.environment.result)
        self._on_state(self.client.state)

    # -- model ------------------------------------------------------------------------------------------

    def _restore_load_options(self) -> None:
        opts = LoadOptions.from_dict(self._settings.get("runner/load_options"))
        for combo, value in ((self.device, opts.device), (self.dtype, opts.dtype),
                             (self.quantization, opts.quantization)):
            index = combo.findText(value) if combo is not self.device else combo.findData(value)
            combo.setCurrentIndex(max(0, index))
        self.compile.setChecked(opts.compile)
        self.trust.blockSignals(True)
        self.trust.setChecked(opts.trust_remote_code)
        self.trust.blockSignals(False)

    def _on_probe(self, info: dict) -> None:
        device = info.get("device", "cpu")
        self.device.setItemText(0, f"auto ({device})")
        packages = info.get("packages", {})
        reason = ""
        if not packages.get("bitsandbytes"):
            reason = "bitsandbytes is not installed"
        elif device == "hpu":
            reason = "on Gaudi bitsandbytes supports 4-bit nf4 only"
        model = self.quantization.model()
        for row, value in enumerate(QUANTIZATIONS):
            item = model.item(row) if hasattr(model, "item") else None
            if item is None or value == "none":
                continue
            disabled = bool(reason) and (value == "8bit" or not packages.get("bitsandbytes"))
            item.setEnabled(not disabled)
            item.setToolTip(reason if disabled else "")
        if device == "hpu":
            self.compile.setToolTip("On Gaudi, transformers wraps torch.compile so any backend becomes "
                                    "hpu_backend.")

    def _on_trust_toggled(self, on: bool) -> None:
        if on:
            QMessageBox.warning(self, "Trust remote code",
                                "The model's own Python code will run in the worker with your user's "
                                "rights. Turn this on only for models whose code you trust.")

    def _browse(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Model folder")
        if folder:
            self.model.setCurrentText(folder)

    def load_options(self) -> LoadOptions:
        return LoadOptions(model=self.model.currentText().strip(), device=self.device.currentData(),
                           dtype=self.dtype.currentText(), quantization=self.quantization.currentText(),
                           compile=self.compile.isChecked(), trust_remote_code=self.trust.isChecked())

    def load_model(self) -> None:
        options = self.load_options()
        if options.model and not paths.is_demo(options.model) and ("/" in options.model or
                                                                    options.model.startswith(".")):
            folder = Path(options.model).expanduser()
            if (options.model.startswith(("/", ".", "~"))) and not folder.is_dir():
                self._on_error("missing_model", f"no such folder: {folder}")
                return
        if not self.client.load(options):
            return
        self._settings.set("runner/load_options", options.to_dict())
        self._settings.set("runner/last_model", options.model)
        recent = [options.model, *[m for m in self._settings.get("runner/recent_models")
                                   if m != options.model]][:MAX_RECENT]
        self._settings.set("runner/recent_models", recent)
        if self.model.findText(options.model) < 0:
            self.model.addItem(options.model)
        self._load_started = time.perf_counter()
        self._elapsed.start()
        self.model_status.setText(f"Loading {options.model}…")

    def load_model_requested_from(self, path: str) -> None:
        """Put a folder (a training run's output) in the model field and load it."""
        self.model.setCurrentText(path)
        self.load_model()

    def _tick_loading(self) -> None:
        elapsed = time.perf_counter() - self._load_started
        text = self.model_status.text().split(" · ")[0]
        self.model_status.setText(f"{text} · {elapsed:.1f} s")

    def _on_loading(self, stage: str, elapsed: float) -> None:
        self.model_status.setText(f"Loading: {stage} · {elapsed:.1f} s")

    def _on_loaded(self, info: dict) -> None:
        self._elapsed.stop()
        self._loaded_info = info
        self.conversation.model = str(info.get("model", ""))
        memory = info.get("memory_bytes")
        self.model_status.setText(
            f"Loaded <b>{info.get('model')}</b> on {info.get('device')} ({info.get('dtype')}"
            f"{', ' + info['quantization'] if info.get('quantization') not in (None, 'none') else ''})"
            f" · {info.get('parameters', 0):,} parameters · load {info.get('load_s', 0):.1f} s"
            + (f" · {format_bytes(memory)} {info.get('memory_kind', '')}" if memory else ""))

    # -- generation parameters --------------------------------------------------------------------------

    def params(self) -> GenerationParams:
        seed_text = self.seed.text().strip()
        stops = [s.strip().encode().decode("unicode_escape") for s in self.stop_strings.text().split(",")
                 if s.strip()]
        return GenerationParams(
            max_new_tokens=self.max_new_tokens.value(), do_sample=self.do_sample.isChecked(),
            temperature=self.temperature.value(), top_p=self.top_p.value(), top_k=self.top_k.value(),
            repetition_penalty=self.repetition_penalty.value(), num_beams=self.num_beams.value(),
            seed=int(seed_text) if seed_text.isdigit() else None, stop=stops)

    def set_params(self, p: GenerationParams) -> None:
        self.max_new_tokens.setValue(p.max_new_tokens)
        self.do_sample.setChecked(p.do_sample)
        self.temperature.setValue(p.temperature)
        self.top_p.setValue(p.top_p)
        self.top_k.setValue(p.top_k)
        self.repetition_penalty.setValue(p.repetition_penalty)
        self.num_beams.setValue(p.num_beams)
        self.seed.setText("" if p.seed is None else str(p.seed))
        self.stop_strings.setText(", ".join(s.encode("unicode_escape").decode() for s in p.stop))

    def _all_presets(self) -> dict[str, dict]:
        return {**BUILTIN_PRESETS, **self._settings.get("runner/presets")}

    def _refresh_presets(self) -> None:
        self.presets.clear()
        self.presets.addItems(list(self._all_presets()))

    def _apply_preset(self) -> None:
        data = self._all_presets().get(self.presets.currentText())
        if data:
            self.set_params(GenerationParams.from_dict(data))

    def save_preset(self, name: str) -> None:
        presets = self._settings.get("runner/presets")
        presets[name] = self.params().to_dict()
        self._settings.set("runner/presets", presets)
        self._refresh_presets()
        self.presets.setCurrentText(name)

    def _save_preset(self) -> None:
        name, ok = QInputDialog.getText(self, "Save preset", "Name:")
        if ok and name.strip():
            self.save_preset(name.strip())

    def _delete_preset(self) -> None:
        presets = self._settings.get("runner/presets")
        name = self.presets.currentText()
        if name in presets:
            del presets[name]
            self._settings.set("runner/presets", presets)
            self._refresh_presets()
        elif name in BUILTIN_PRESETS:
            self.model_status.setText(f"'{name}' is built in and cannot be deleted.")

    # -- conversation -----------------------------------------------------------------------------------

    def send(self) -> None:
        text = self.prompt.toPlainText().strip()
        if not text:
            return
        params = self.params()
        problems = params.validate()
        if problems:
            self._on_error("bad_parameters", "; ".join(problems))
            return
        self.conversation.system = self.system_prompt.toPlainText()
        chat = self.chat_mode.isChecked()
        if chat:
            messages = [*self.conversation.messages(), {"role": "user", "content": text}]
            ok = self.client.generate(params, messages=messages)
        else:
            ok = self.client.generate(params, prompt=text)
        if not ok:
            return
        self._settings.set("runner/generation", params.to_dict())
        self._settings.set("runner/chat_mode", chat)
        self._settings.set("runner/system_prompt", self.conversation.system)
        self._pending_user = text
        self._answer = ""
        self.prompt.clear()
        self._append(("\n\n" if self.view.toPlainText() else "") + f"▶ You: {text}\n\n◀ Model: "
                     + ("" if chat else text))
        self.stats.setText("generating…")

    def stop(self) -> None:
        self.client.cancel()

    def _append(self, text: str) -> None:
        cursor = self.view.textCursor()
        cursor.movePosition(QTextCursor.MoveOperation.End)
        cursor.insertText(text)
        self.view.setTextCursor(cursor)
        self.view.ensureCursorVisible()

    def _on_token(self, text: str) -> None:
        self._answer += text
        self._append(text)

    def _on_finished(self, stats: dict) -> None:
        if self._pending_user is not None:
            self.conversation.add_user(self._pending_user)
            self.conversation.add_assistant(self._answer, stats)
            self._pending_user = None
        self.stats.setText(format_stats(stats))

    def _on_error(self, kind: str, message: str) -> None:
        self._elapsed.stop()
        if self._pending_user is not None and kind not in ("busy", "not_loaded", "bad_parameters"):
            self._pending_user = None
        text = f"<span style='color:#b00020'><b>{kind.replace('_', ' ')}:</b> " \
               f"{message.replace('<', '&lt;')}</span>"
        if kind in ("bad_parameters", "busy", "not_loaded"):
            self.stats.setText(text)
        else:
            self.model_status.setText(text)

    def _on_worker_exited(self, code: int, status: str, tail: str) -> None:
        self._elapsed.stop()
        if self._pending_user is not None:
            self._pending_user = None
            self._append("\n[the worker ended during generation]")
        last = tail.strip().splitlines()[-3:] if tail else []
        self.model_status.setText(
            f"<span style='color:#b00020'><b>The worker {describe_exit(code, status)}.</b></span> "
            + " | ".join(x.replace("<", "&lt;") for x in last) + " — Load or Restart worker to go on.")

    def _on_state(self, state: str) -> None:
        busy = state in (gc.LOADING, gc.GENERATING, gc.STARTING)
        self.load_button.setEnabled(not busy)
        self.unload_button.setEnabled(state == gc.LOADED)
        self.send_button.setEnabled(state == gc.LOADED)
        self.stop_button.setEnabled(state == gc.GENERATING)

    def copy_answer(self) -> None:
        QGuiApplication.clipboard().setText(self.conversation.last_answer())

    def export(self, path: str) -> None:
        text = self.conversation.to_json() if path.endswith(".json") else self.conversation.to_markdown()
        Path(path).write_text(text, encoding="utf-8")

    def _export_dialog(self) -> None:
        path, _ = QFileDialog.getSaveFileName(self, "Export conversation", "conversation.md",
                                              "Markdown (*.md);;JSON (*.json)")
        if path:
            try:
                self.export(path)
            except OSError as exc:
                QMessageBox.warning(self, "Export failed", str(exc))

    def clear(self) -> None:
        self.conversation.clear()
        self.view.clear()
        self.stats.clear()

    # -- JobOwner ---------------------------------------------------------------------------------------

    def active_jobs(self) -> list[str]:
        if self.client.state == gc.GENERATING:
            return [f"model runner: generating with {self.conversation.model or 'a model'}"]
        return []

    def stop_jobs(self) -> None:
        self.client.cancel()

    def detach_jobs(self) -> list[str]:
        # The worker holds the card and cannot outlive the window: stop it instead.
        self.client.cancel()
        return []

    def shutdown(self) -> None:
        self._elapsed.stop()
        self.client.kill()

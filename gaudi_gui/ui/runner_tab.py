"""The Model runner tab: load a model in the worker, chat or prompt, watch tokens stream, stop, measure.

Every button connects through a lambda or a no-argument slot (``clicked`` passes ``checked``). Load
options are saved, and the model enters the recent list, only once the worker reports it loaded.
Parameter problems are shown at their field (red frame, tooltip, a line under the form); the bounds
come from ``gaudi_gui.core.generation`` so the fields, the CLI and the worker agree.

The tab binds to ``AppServices.generation`` (the worker lives in the client), ``AppServices.hosts``
(the saved hosts in memory) and ``AppServices.remote_files`` (the Browse dialog's listings); it starts
no process and reads no file. The Host combo (local first, then the saved hosts, refilled when the
service's list changes) says where the worker runs: choosing another host shuts the current
worker down, and the next Load starts one on the chosen host over ssh. Model folders are then the
host's: Browse… opens the "Browse HOST" dialog (``gaudi_gui.ui.remote_browser``), which lists the
host's folders and Hub cache over ssh; Hub ids resolve in the host's own cache.
"""

from __future__ import annotations

import html
import posixpath
import time
from pathlib import Path
from typing import TYPE_CHECKING

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtGui import QGuiApplication, QKeySequence, QShortcut, QTextCursor
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QFrame,
    QGridLayout,
    QGroupBox,
    QHBoxLayout,
    QInputDialog,
    QLabel,
    QLineEdit,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QScrollArea,
    QSpinBox,
    QSplitter,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core import generation, paths, remote
from gaudi_gui.core import preflight as preflight_mod
from gaudi_gui.core.generation import (
    BUILTIN_PRESETS,
    DTYPES,
    QUANTIZATIONS,
    Conversation,
    GenerationParams,
    LoadOptions,
    format_bytes,
    format_stats,
    format_stop_field,
    parse_stop_field,
)
from gaudi_gui.core.remote import Host, HostError
from gaudi_gui.services import generation_client as gc
from gaudi_gui.services.agent_child import describe_exit
from gaudi_gui.services.context import AppServices
from gaudi_gui.ui import remote_browser
from gaudi_gui.ui.model_field import ModelCacheState

if TYPE_CHECKING:
    from gaudi_gui.services.hosts import HostsService
    from gaudi_gui.services.serve import ServeService

MAX_RECENT = 10
MODIFIED = " (modified)"
_INVALID_STYLE = "border: 1px solid #b00020;"


class HostCombo(QComboBox):
    """Where the worker runs: "local" first, then the saved hosts of ``hosts`` (refilled when its list
    changes, so a host added in the Hosts tab is offered without a restart). Item data: the host's
    name."""

    def __init__(self, hosts: HostsService, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._hosts = hosts
        self.setToolTip("Where the model worker runs: this machine, or a saved host (over ssh)")
        self.refresh()
        hosts.changed.connect(self.refresh)

    def refresh(self) -> None:
        """Fill in the saved hosts; the current choice stays (listed even if it was removed since)."""
        current = str(self.currentData() or remote.LOCAL)
        hosts = [Host.local(), *self._hosts.saved()]
        self.blockSignals(True)
        self.clear()
        for host in hosts:
            self.addItem(host.label, host.name)
        if self.findData(current) < 0:
            self.addItem(current, current)
        self.setCurrentIndex(self.findData(current))
        self.blockSignals(False)


class RunnerTab(QWidget):
    """Views the GenerationClient; the worker process itself lives in the client."""

    #: Download… beside the model field: (the field's text, the chosen host's name); the main window
    #: opens the Models tab's Download dialog with them.
    download_requested = Signal(str, str)

    def __init__(self, services: AppServices, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self._services = services
        self._settings = services.settings
        self.client = services.ensure_generation(services.settings.parent())
        self._hosts = services.ensure_hosts(services.settings.parent())
        self.conversation = Conversation()
        self._answer = ""
        self._pending_user: str | None = None
        #: Where the turn in flight begins in the view ("▶ You: …"), so a turn that fails before any
        #: answer is taken back whole (no empty "◀ Model:" line is left); None when none is in flight.
        self._turn_start: int | None = None
        self._load_started = 0.0
        self._loading_options: LoadOptions | None = None
        # The start gate (core.preflight): the load whose card check runs, the one that passed
        # (or was confirmed with "Load anyway"), and the one waiting for that confirmation.
        self._gate_options: LoadOptions | None = None
        self._gate_passed: LoadOptions | None = None
        self._gate_warned: LoadOptions | None = None
        self._gate_connected = False

        # -- model ---------------------------------------------------------------------------------
        self.host_combo = HostCombo(self._hosts)
        self.host_combo.currentIndexChanged.connect(lambda index: self._on_host_chosen())
        self._probe_device = ""
        self.model = QComboBox()
        self.model.setEditable(True)
        self.model.setMinimumWidth(320)
        self.model.setToolTip("A Hub id (org/name), a local folder, or builtin:demo (offline demo model)")
        recent = [m for m in self._settings.get("runner/recent_models") if m]
        for entry in dict.fromkeys([paths.DEMO_MODEL_ID, *recent]):
            self.model.addItem(entry)
        self.model.setCurrentText(self._settings.get("runner/last_model") or paths.DEMO_MODEL_ID)
        browse = QPushButton("Browse…")
        self.browse_button = browse
        browse.clicked.connect(self._browse)
        self.download_button = QPushButton("Download…")
        self.download_button.setToolTip("Download this Hub model into the chosen host's cache first "
                                        "(progress, stall retries, a check of what arrived: Models tab)")
        # Whether the named model is in the chosen host's cache ("cached on …, 1.2 GB"), Download…
        # enabled when it is not, and that cache's models offered in the field (ui/model_field.py).
        self.model_cache = ModelCacheState(self.model, services.ensure_models(services.settings.parent()),
                                           self._chosen_host, self, button=self.download_button)
        self.model_cache.download_requested.connect(self.download_requested)
        #: The "Browse HOST" dialog while it is open (a remote host's folders).
        self.remote_browser: remote_browser.RemoteBrowser | None = None
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
        self.cancel_load_button = QPushButton("Cancel")
        self.cancel_load_button.setToolTip("Abandon this load (Esc): the loading worker is killed and the "
                                           "model loaded before, if any, is loaded again")
        self.cancel_load_button.clicked.connect(self.cancel_load)
        self.unload_button = QPushButton("Unload")
        self.unload_button.clicked.connect(self.client.unload)
        self.restart_button = QPushButton("Restart worker")
        self.restart_button.setToolTip("Kill the worker process and start a fresh one (reloads the model)")
        self.restart_button.clicked.connect(self.client.restart)
        self.load_progress = QProgressBar()
        self.load_progress.setMaximumWidth(160)
        self.load_progress.setTextVisible(True)
        self.load_progress.hide()
        self.model_status = QLabel("No model loaded.")
        self.model_status.setWordWrap(True)
        self.model_status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._restore_load_options()

        model_box = QGroupBox("Model")
        grid = QFormLayout(model_box)
        grid.addRow("Host", self.host_combo)
        row = QHBoxLayout()
        row.addWidget(self.model, 1)
        row.addWidget(browse)
        row.addWidget(self.download_button)
        grid.addRow("Model", row)
        grid.addRow("", self.model_cache)
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
        for b in (self.load_button, self.cancel_load_button, self.unload_button, self.restart_button):
            buttons.addWidget(b)
        buttons.addWidget(self.load_progress)
        buttons.addWidget(self.model_status, 1)
        grid.addRow(buttons)

        # -- generation parameters -----------------------------------------------------------------
        self.max_new_tokens = QSpinBox()
        self.max_new_tokens.setRange(1, generation.MAX_NEW_TOKENS)
        self.do_sample = QCheckBox("sample")
        self.temperature = QDoubleSpinBox()
        self.temperature.setRange(*generation.TEMPERATURE_RANGE)
        self.temperature.setSingleStep(0.05)
        self.top_p = QDoubleSpinBox()
        self.top_p.setRange(*generation.TOP_P_RANGE)
        self.top_p.setSingleStep(0.01)
        self.top_k = QSpinBox()
        self.top_k.setRange(0, generation.MAX_TOP_K)
        self.repetition_penalty = QDoubleSpinBox()
        self.repetition_penalty.setRange(*generation.REPETITION_PENALTY_RANGE)
        self.repetition_penalty.setSingleStep(0.05)
        self.num_beams = QSpinBox()
        self.num_beams.setRange(1, generation.MAX_BEAMS)
        self.seed = QLineEdit()
        self.seed.setPlaceholderText("random")
        self.stop_strings = QLineEdit()
        self.stop_strings.setPlaceholderText("e.g. \\n\\n, ###  (comma separated, taken literally)")
        self.stop_strings.setToolTip("Comma separated and taken literally; \\n is a newline, \\t a tab, "
                                     "\\, a comma and \\\\ a backslash")
        self.params_error = QLabel("")
        self.params_error.setWordWrap(True)
        self.params_error.setStyleSheet("color: #b00020;")
        self.params_error.hide()
        self.presets = QComboBox()
        self.presets.setToolTip("Saved parameter sets")
        self.presets.activated.connect(lambda index: self._apply_preset())
        self.save_preset_button = QPushButton("Save preset…")
        self.save_preset_button.clicked.connect(self._save_preset)
        self.delete_preset_button = QPushButton("Delete")
        self.delete_preset_button.clicked.connect(self._delete_preset)
        self._refresh_presets()
        self.set_params(GenerationParams.from_dict(self._settings.get("runner/generation")))
        self._param_fields: dict[str, QWidget] = {
            "max_new_tokens": self.max_new_tokens, "min_new_tokens": self.max_new_tokens,
            "do_sample": self.do_sample, "temperature": self.temperature, "top_p": self.top_p,
            "top_k": self.top_k, "repetition_penalty": self.repetition_penalty,
            "num_beams": self.num_beams, "seed": self.seed, "stop": self.stop_strings}
        for spin in (self.max_new_tokens, self.top_k, self.num_beams):
            spin.valueChanged.connect(lambda value: self._on_params_edited())
        for dspin in (self.temperature, self.top_p, self.repetition_penalty):
            dspin.valueChanged.connect(lambda value: self._on_params_edited())
        self.do_sample.toggled.connect(lambda on: self._on_params_edited())
        for line in (self.seed, self.stop_strings):
            line.textChanged.connect(lambda text: self._on_params_edited())
        self._mark_preset()

        params_box = QGroupBox("Generation")
        form = QFormLayout(params_box)
        # A field that does not fit beside its label goes under it: the column stays narrow enough for
        # a 1024-pixel screen with the Serve dock open.
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        preset_row = QHBoxLayout()
        preset_row.addWidget(self.presets, 1)
        preset_row.addWidget(self.save_preset_button)
        preset_row.addWidget(self.delete_preset_button)
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
        form.addRow(self.params_error)
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
        #: Profile (issue 40): Send, with the answer's decode steps recorded by torch.profiler.
        self.profile_button = QPushButton("Profile")
        self.profile_button.setToolTip("send the prompt and record the answer's decode steps with "
                                       "torch.profiler (after 2 warm-up tokens); Show profile opens it")
        self.profile_button.clicked.connect(lambda _checked=False: self.send_profiled())
        #: The last profiled answer's page (hidden until there is one).
        self.show_profile_button = QPushButton("Show profile")
        self.show_profile_button.clicked.connect(lambda _checked=False: self.show_profile())
        self.show_profile_button.hide()
        self._profile_next = False
        self._profile_folder = ""
        self.profile_view: QWidget | None = None
        self.stop_button = QPushButton("Stop")
        self.stop_button.setToolTip("Esc: the worker stops within one token")
        self.stop_button.clicked.connect(self.stop)
        self.copy_button = QPushButton("Copy answer")
        self.copy_button.clicked.connect(self.copy_answer)
        self.copy_chat_button = QPushButton("Copy chat")
        self.copy_chat_button.setToolTip("Copy the whole conversation as Markdown")
        self.copy_chat_button.clicked.connect(self.copy_conversation)
        self.export_button = QPushButton("Export…")
        self.export_button.clicked.connect(self._export_dialog)
        self.clear_button = QPushButton("Clear")
        self.clear_button.clicked.connect(self.clear)
        #: Answers come from the Serve endpoint instead of this tab's worker (shown while a server runs).
        self.use_endpoint = QCheckBox("Answer from the Serve endpoint")
        self.use_endpoint.setToolTip("Send the conversation to the running server (the Serve panel's URL, "
                                     "model id and API key), as your own code would")
        self.use_endpoint.toggled.connect(lambda _on: self._update_send())
        #: The endpoint's URL beside the check box, on a label that wraps: a long URL never makes the
        #: chat column (and the window, with the Serve dock open) wider.
        self.endpoint_url = QLabel("")
        self.endpoint_url.setTextFormat(Qt.TextFormat.PlainText)
        self.endpoint_url.setWordWrap(True)
        self.endpoint_url.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self._endpoint_row = QWidget()
        endpoint_row = QHBoxLayout(self._endpoint_row)
        endpoint_row.setContentsMargins(0, 0, 0, 0)
        endpoint_row.addWidget(self.use_endpoint)
        endpoint_row.addWidget(self.endpoint_url, 1)
        self._endpoint_row.hide()
        self._serve: ServeService | None = None
        self.stats = QLabel("")
        self.stats.setWordWrap(True)  # a long stats line wraps instead of widening the chat column
        self.stats.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.prompt_error = QLabel("")
        self.prompt_error.setStyleSheet("color: #b00020;")
        self.prompt_error.hide()
        self.prompt.textChanged.connect(self._clear_prompt_error)
        #: One line saying what the last action did ("Copied the answer (42 characters)").
        self.notice = QLabel("")
        chat_box = QWidget()
        chat = QVBoxLayout(chat_box)
        chat.setContentsMargins(0, 0, 0, 0)
        chat.addWidget(self.view, 1)
        chat.addWidget(self.stats)
        chat.addWidget(self._endpoint_row)
        chat.addWidget(self.prompt)
        chat.addWidget(self.prompt_error)
        # Send/Stop on the left, what to do with the answers on the right; the notice wraps on its own
        # line, so the row never makes the window wider than a 1280-pixel screen with a dock open.
        actions = QGridLayout()
        for col, b in enumerate((self.send_button, self.stop_button)):
            actions.addWidget(b, 0, col)
        actions.addWidget(self.profile_button, 1, 0)
        actions.addWidget(self.show_profile_button, 1, 1)
        answers = (self.copy_button, self.copy_chat_button, self.export_button, self.clear_button)
        for index, b in enumerate(answers):
            actions.addWidget(b, index // 2, 3 + index % 2)
        actions.setColumnStretch(2, 1)
        chat.addLayout(actions)
        self.notice.setWordWrap(True)
        chat.addWidget(self.notice)

        left = QWidget()
        left_layout = QVBoxLayout(left)
        left_layout.setContentsMargins(0, 0, 0, 0)
        left_layout.addWidget(params_box)
        left_layout.addStretch(1)
        # The generation settings scroll when the window is short (a 1280x800 laptop with the Health
        # dock open): the tab's height is the conversation's, not the sum of every field.
        left_scroll = QScrollArea()
        left_scroll.setWidget(left)
        left_scroll.setWidgetResizable(True)
        left_scroll.setFrameShape(QFrame.Shape.NoFrame)
        left_scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        left_scroll.setMinimumWidth(left.minimumSizeHint().width() + 16)
        splitter = QSplitter()
        splitter.addWidget(left_scroll)
        splitter.addWidget(chat_box)
        splitter.setStretchFactor(1, 1)
        splitter.setSizes([340, 900])
        layout = QVBoxLayout(self)
        layout.addWidget(model_box)
        layout.addWidget(splitter, 1)

        self.shortcuts = {
            "send": QShortcut(QKeySequence("Ctrl+Return"), self, self.send),
            "send (keypad)": QShortcut(QKeySequence("Ctrl+Enter"), self, self.send),
            "stop": QShortcut(QKeySequence(Qt.Key.Key_Escape), self, self.stop),
        }

        self._elapsed = QTimer(self)
        self._elapsed.setInterval(200)
        self._elapsed.timeout.connect(self._tick_loading)

        self.client.state_changed.connect(self._on_state)
        self.client.loading_progressed.connect(self._on_loading)
        self.client.load_progress_changed.connect(self._on_load_progress)
        self.client.load_failed.connect(self._on_load_failed)
        self.client.load_cancelled.connect(self._on_load_cancelled)
        self.client.model_loaded.connect(self._on_loaded)
        self.client.model_unloaded.connect(self._on_unloaded)
        self.client.token_received.connect(self._on_token)
        self.client.generation_finished.connect(self._on_finished)
        self.client.error_occurred.connect(self._on_error)
        self.client.info_received.connect(self.model_status.setText)
        self.client.worker_exited.connect(self._on_worker_exited)
        services.environment.probe_finished.connect(self._on_probe)
        if services.environment.result:
            self._on_probe(services.environment.result)
        self._on_state(self.client.state)
        if services.serve is not None:
            self.bind_serve(services.serve)

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
        self._probe_device = str(device)
        if self.client.host.is_local:  # the probe is this machine's, not a host's
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

    def _chosen_host(self) -> Host:
        """The host chosen in the Host field (this machine if it is not a saved one any more)."""
        name = str(self.host_combo.currentData() or remote.LOCAL)
        try:
            return self._hosts.find(name)
        except HostError:
            return Host.local()

    def _on_host_chosen(self) -> None:
        if hasattr(self, "model_cache"):
            self.model_cache.place_changed()
        name = str(self.host_combo.currentData() or remote.LOCAL)
        if name == self.client.host.name:
            return
        try:
            host = self._hosts.find(name)
        except HostError as exc:
            self._on_error("bad_host", str(exc))
            return
        self._end_loading()
        if self._pending_user is not None:
            self._turn_failed("stopped: the worker moved to another host")
        # A remote worker's device environment comes from that host's card selection (set in its
        # Devices panel from the Hosts tab); it travels as guard arguments, not this process's env.
        selection = self._services.selection if host.is_local else self._hosts.selection(host.name)
        self.client.set_host(host, selection)
        local = host.is_local
        self.browse_button.setToolTip("" if local else f"Browse {host.name}'s folders (model folders "
                                                       f"and the Hub cache are {host.name}'s)")
        self.device.setItemText(0, f"auto ({self._probe_device})" if local and self._probe_device
                                else "auto")
        self.model_status.setText("No model loaded." if local else
                                  f"The next Load runs on <b>{html.escape(host.name)}</b> (over ssh); "
                                  f"model folders and the Hub cache are {html.escape(host.name)}'s.")

    def _browse(self) -> None:
        host = self.client.host
        if not host.is_local:
            self._browse_host(host)
            return
        folder = QFileDialog.getExistingDirectory(self, "Model folder")
        if folder:
            self.model.setCurrentText(folder)

    def _browse_host(self, host: Host) -> None:
        """Open the "Browse HOST" dialog (non-blocking); the chosen host path fills the model field."""
        if self.remote_browser is not None:
            self.remote_browser.raise_()
            return
        text = self.model.currentText().strip()
        # Start where this session last browsed on that host, else where the model field points
        # (its parent, so the folder is in view), else the host's home.
        files = self._services.ensure_remote_files(self._settings.parent())
        start = files.last_folder(host.name)
        if not start and text.startswith(("/", "~")):
            start = posixpath.dirname(text.rstrip("/")) or "/"
        dialog = remote_browser.RemoteBrowser(host, files, start, parent=self)
        dialog.setWindowModality(Qt.WindowModality.WindowModal)
        dialog.accepted.connect(lambda: self._on_host_path_chosen(dialog))
        dialog.finished.connect(lambda result: self._on_browser_closed(dialog))
        self.remote_browser = dialog
        dialog.open()

    def _on_host_path_chosen(self, dialog: remote_browser.RemoteBrowser) -> None:
        if dialog.chosen and dialog.host.name == self.client.host.name:
            self.model.setCurrentText(dialog.chosen)

    def _on_browser_closed(self, dialog: remote_browser.RemoteBrowser) -> None:
        if self.remote_browser is dialog:
            self.remote_browser = None
        dialog.deleteLater()

    def load_options(self) -> LoadOptions:
        return LoadOptions(model=self.model.currentText().strip(), device=self.device.currentData(),
                           dtype=self.dtype.currentText(), quantization=self.quantization.currentText(),
                           compile=self.compile.isChecked(), trust_remote_code=self.trust.isChecked())

    def load_model(self) -> None:
        options = self.load_options()
        # A remote host's folders are checked by the worker there (it answers missing_model).
        if self.client.host.is_local and options.model and not paths.is_demo(options.model) and (
                "/" in options.model or
                                                                    options.model.startswith(".")):
            folder = Path(options.model).expanduser()
            if (options.model.startswith(("/", ".", "~"))) and not folder.is_dir():
                self._on_error("missing_model", f"no such folder: {folder}")
                return
        if not self._gate(options):
            return  # the card check runs (Load goes on when it passes), or waits for "Load anyway"
        if not self.client.load(options):
            return
        # Nothing is saved yet: a load that fails must not become the default or a recent entry.
        self._loading_options = options
        self._load_started = time.perf_counter()
        self._elapsed.start()
        self.load_progress.setRange(0, 0)  # busy until a stage with a size (the demo build) says more
        self.load_progress.show()
        self.model_status.setText(f"Loading {options.model}…")

    def _gate(self, options: LoadOptions) -> bool:
        """True: load now. False: the worker's cards are being checked first (on this machine only
        where hl-smi is and the worker uses the cards; a host always), or a warning awaits "Load
        anyway"."""
        passed = options in (self._gate_passed, self._gate_warned)
        self._gate_passed = self._gate_warned = None
        self.load_button.setText("&Load")
        self.host_combo.setStyleSheet("")
        host = self.client.host
        if passed or options.device not in ("auto", "hpu"):
            return True
        if host.is_local:
            selection = self._services.selection
            plan = preflight_mod.local_plan(selection.selected or None, uses_cards=selection.jobs_use_cards(),
                                            hl_smi=str(self._settings.get("devices/hl_smi") or ""))
        else:
            chosen = self._hosts.selection(host.name)
            cards = tuple(chosen.selected) if chosen is not None else ()
            plan = preflight_mod.hosts_plan([preflight_mod.Target(host.name, cards or None,
                                                                  host.remote_command)])
        if plan.empty:
            return True
        service = self._services.ensure_preflight(self._settings.parent())
        if not self._gate_connected:
            service.finished.connect(self._on_gate_finished)
            self._gate_connected = True
        self._gate_options = options
        service.run(plan, "runner")
        self.load_button.setEnabled(False)
        self.load_button.setText("Checking cards…")
        self.model_status.setText(f"Checking the cards on {plan.targets[0].label()} before the load…")
        return False

    def _on_gate_finished(self, verdict: preflight_mod.Verdict) -> None:
        if verdict.key != "runner" or self._gate_options is None:
            return
        options, self._gate_options = self._gate_options, None
        self.load_button.setText("&Load")
        self._on_state(self.client.state)
        unreachable = [h for h in verdict.report.hosts if not h.reachable]
        if not verdict.ok and len(unreachable) < len(verdict.errors):
            self.host_combo.setStyleSheet("QComboBox { border: 1px solid #d62728; }")
            self._on_error("cards", verdict.message())
            return
        # A host that did not answer the check: the load goes on, and the worker's own connection
        # says why in words, with the fix (ssh-copy-id, the host key...), which the check cannot.
        if verdict.confirm and verdict.ok:
            self._gate_warned = options
            self.load_button.setText("&Load anyway")
            self.model_status.setText("<span style='color:#8a5a00'><b>The card check found warnings:</b> "
                                      + "; ".join(map(html.escape, verdict.warnings))
                                      + " — Load anyway to go on.</span>")
            return
        self._gate_passed = options
        self.load_model()

    def cancel_load(self) -> None:
        """Abandon the load in progress (the worker is killed; a previous model is loaded again)."""
        if self.client.state == gc.LOADING:
            self.model_status.setText("Cancelling the load…")
            self.client.cancel_load()

    def _remember(self, options: LoadOptions) -> None:
        self._settings.set("runner/load_options", options.to_dict())
        self._settings.set("runner/last_model", options.model)
        recent = [options.model, *[m for m in self._settings.get("runner/recent_models")
                                   if m != options.model]][:MAX_RECENT]
        self._settings.set("runner/recent_models", recent)
        if self.model.findText(options.model) < 0:
            self.model.addItem(options.model)

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

    def _on_load_progress(self, done: int, total: int) -> None:
        if total > 0:
            self.load_progress.setRange(0, total)
            self.load_progress.setValue(min(done, total))
            self.load_progress.setFormat("demo %v/%m")

    def _end_loading(self) -> None:
        self._elapsed.stop()
        self.load_progress.hide()
        self._loading_options = None

    def _on_load_failed(self, kind: str, message: str) -> None:
        self._end_loading()
        if self.client.loaded_info:
            # _on_error shows the reason; say that the working model is still there.
            QTimer.singleShot(0, self, lambda: self.model_status.setText(
                self.model_status.text() + f" — {self.client.loaded_info.get('model')} is still loaded."))

    def _on_load_cancelled(self, reloading: str) -> None:
        self._end_loading()
        self.model_status.setText("Load cancelled." + (f" Loading {reloading} again…" if reloading else ""))

    def _on_unloaded(self) -> None:
        if self.client.state != gc.STOPPED:
            self.model_status.setText("Model unloaded.")

    def _on_loaded(self, info: dict) -> None:
        options = self._loading_options or self.client.options
        self._end_loading()
        if options is not None:
            self._remember(options)
        self.conversation.model = str(info.get("model", ""))
        memory = info.get("memory_bytes")
        quantization = info.get("quantization")
        # Rich text (the model's name in bold): what the worker reported is text, never markup.
        self.model_status.setText(
            f"Loaded <b>{html.escape(str(info.get('model')))}</b> on "
            + html.escape(f"{info.get('device')}"
                          + ("" if self.client.host.is_local else f" of {self.client.host.name}")
                          + f" ({info.get('dtype')}"
                          f"{', ' + str(quantization) if quantization not in (None, 'none') else ''})"
                          f" · {info.get('parameters', 0):,} parameters · load {info.get('load_s', 0):.1f} s"
                          + (f" · {format_bytes(memory)} {info.get('memory_kind', '')}" if memory else "")))

    # -- generation parameters --------------------------------------------------------------------------

    def params(self) -> GenerationParams:
        seed_text = self.seed.text().strip()
        stops = parse_stop_field(self.stop_strings.text())
        return GenerationParams(
            max_new_tokens=self.max_new_tokens.value(), do_sample=self.do_sample.isChecked(),
            temperature=self.temperature.value(), top_p=self.top_p.value(), top_k=self.top_k.value(),
            repetition_penalty=self.repetition_penalty.value(), num_beams=self.num_beams.value(),
            seed=int(seed_text) if seed_text.isdigit() else (-1 if seed_text else None), stop=stops)

    def set_params(self, p: GenerationParams) -> None:
        self.max_new_tokens.setValue(p.max_new_tokens)
        self.do_sample.setChecked(p.do_sample)
        self.temperature.setValue(p.temperature)
        self.top_p.setValue(p.top_p)
        self.top_k.setValue(p.top_k)
        self.repetition_penalty.setValue(p.repetition_penalty)
        self.num_beams.setValue(p.num_beams)
        self.seed.setText("" if p.seed is None else str(p.seed))
        self.stop_strings.setText(format_stop_field(p.stop))

    def _all_presets(self) -> dict[str, dict]:
        return {**BUILTIN_PRESETS, **self._settings.get("runner/presets")}

    def preset_name(self) -> str:
        """The selected preset's name (without the "(modified)" mark)."""
        return str(self.presets.currentData() or "")

    def _refresh_presets(self, select: str = "") -> None:
        self.presets.blockSignals(True)
        self.presets.clear()
        for name in self._all_presets():
            self.presets.addItem(name, name)
        index = self.presets.findData(select) if select else 0
        self.presets.setCurrentIndex(max(0, index))
        self.presets.blockSignals(False)

    def _apply_preset(self) -> None:
        name = self.preset_name()
        data = self._all_presets().get(name)
        if data:
            self.set_params(GenerationParams.from_dict(data))
        self._mark_preset()

    def _on_params_edited(self) -> None:
        self._clear_field_problems()
        self._mark_preset()

    def _mark_preset(self) -> None:
        """Show "(modified)" after the preset's name while the fields differ from it."""
        index = self.presets.currentIndex()
        if index < 0 or not hasattr(self, "_param_fields"):
            return
        name = self.preset_name()
        data = self._all_presets().get(name)
        modified = data is not None and GenerationParams.from_dict(data) != self.params()
        self.presets.setItemText(index, name + (MODIFIED if modified else ""))

    def save_preset(self, name: str) -> None:
        presets = self._settings.get("runner/presets")
        presets[name] = self.params().to_dict()
        self._settings.set("runner/presets", presets)
        self._refresh_presets(select=name)
        self._mark_preset()
        self.notice.setText(f"Saved preset '{name}'.")

    def _save_preset(self) -> None:
        name, ok = QInputDialog.getText(self, "Save preset", "Name:")
        if ok and name.strip():
            self.save_preset(name.strip())

    def _delete_preset(self) -> None:
        presets = self._settings.get("runner/presets")
        name = self.preset_name()
        if name in presets:
            del presets[name]
            self._settings.set("runner/presets", presets)
            self._refresh_presets()
            self._mark_preset()
            self.notice.setText(f"Deleted preset '{name}'.")
        elif name in BUILTIN_PRESETS:
            self.notice.setText(f"'{name}' is built in and cannot be deleted.")

    # -- field problems ---------------------------------------------------------------------------------

    def _show_field_problems(self, problems: dict[str, str]) -> None:
        self._clear_field_problems()
        for name, text in problems.items():
            widget = self._param_fields.get(name)
            if widget is not None:
                widget.setStyleSheet(_INVALID_STYLE)
                widget.setToolTip(text)
        self.params_error.setText("\n".join(problems.values()))
        self.params_error.show()
        first = self._param_fields.get(next(iter(problems)))
        if first is not None:
            first.setFocus()

    def _clear_field_problems(self) -> None:
        if not hasattr(self, "_param_fields") or self.params_error.isHidden():
            return
        for widget in self._param_fields.values():
            widget.setStyleSheet("")
            widget.setToolTip("")
        self.params_error.hide()
        self.params_error.clear()

    def _clear_prompt_error(self) -> None:
        if not self.prompt_error.isHidden():
            self.prompt_error.hide()
            self.prompt.setStyleSheet("")

    # -- conversation -----------------------------------------------------------------------------------

    def send_profiled(self) -> None:
        """Profile: Send, with this answer's decode steps recorded (this tab's worker only)."""
        if self._endpoint_on():
            self.stats.setText("Profile records this tab's own worker: uncheck \"Answer from the Serve "
                               "endpoint\" to profile an answer")
            return
        self._profile_next = True
        try:
            self.send()
        finally:
            self._profile_next = False

    def show_profile(self) -> None:
        """The last profiled answer's page (ui/profile_view.py), as a training run's Profile…."""
        from gaudi_gui.ui.profile_view import ProfileView
        if not self._profile_folder:
            return
        if self.profile_view is None:
            self.profile_view = ProfileView(self)
            self.profile_view.setWindowFlag(Qt.WindowType.Window, True)
            self.profile_view.resize(900, 600)
        assert isinstance(self.profile_view, ProfileView)
        if not self.profile_view.show_run(self._profile_folder, "generation"):
            self.stats.setText(f"the profile was written where the worker runs: {self._profile_folder}")
            return
        self.profile_view.show()
        self.profile_view.raise_()

    def send(self) -> None:
        if self.client.state == gc.GENERATING:
            return  # Ctrl+Enter while an answer streams
        text = self.prompt.toPlainText().strip()
        empty = generation.prompt_problem(text)
        if empty:
            self.prompt_error.setText(empty.capitalize() + " first.")
            self.prompt_error.show()
            self.prompt.setStyleSheet(_INVALID_STYLE)
            self.prompt.setFocus()
            return
        params = self.params()
        problems = params.field_problems()
        if problems:
            self._show_field_problems(problems)
            return
        self.conversation.system = self.system_prompt.toPlainText()
        chat = self.chat_mode.isChecked()
        endpoint = self._endpoint_on()
        if endpoint and self._serve is not None:
            if self._serve.chat.is_busy():
                return
            generate = self._serve.generate
        else:
            generate = self.client.generate
        if self._profile_next and generate == self.client.generate:
            # Profile: this tab's worker only (send_profiled refuses the endpoint).
            worker = self.client.generate
            generate = lambda p, **kw: worker(p, profile=True, **kw)  # noqa: E731
        if chat:
            messages = [*self.conversation.messages(), {"role": "user", "content": text}]
            ok = generate(params, messages=messages)
        else:
            ok = generate(params, prompt=text)
        if not ok:
            return
        self._settings.set("runner/generation", params.to_dict())
        self._settings.set("runner/chat_mode", chat)
        self._settings.set("runner/system_prompt", self.conversation.system)
        self._pending_user = text
        self._answer = ""
        self.prompt.clear()
        end = self.view.textCursor()
        end.movePosition(QTextCursor.MoveOperation.End)
        self._turn_start = end.position()
        self._append(("\n\n" if self.view.toPlainText() else "") + f"▶ You: {text}\n\n◀ Model: "
                     + ("" if chat else text))
        self.stats.setText("generating…")

    def stop(self) -> None:
        """Stop the answer; while loading, cancel the load (Esc does both)."""
        if self._serve is not None and self._serve.chat.is_busy():
            self._serve.chat.cancel()
        elif self.client.state == gc.LOADING:
            self.cancel_load()
        else:
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

    def _turn_failed(self, why: str) -> None:
        """The turn in flight ended without an answer: taken back from the view, its question put
        back in the prompt field to send again (nothing typed is lost, no empty "◀ Model:" line is
        left); an answer cut short keeps what came, marked with why."""
        start, question = self._turn_start, self._pending_user
        self._turn_start = None
        self._pending_user = None
        if start is None or question is None:
            return
        if self._answer:
            self._append(f"\n[the answer broke off: {why}]")
            return
        cursor = self.view.textCursor()
        cursor.setPosition(min(start, len(self.view.toPlainText())))
        cursor.movePosition(QTextCursor.MoveOperation.End, QTextCursor.MoveMode.KeepAnchor)
        cursor.removeSelectedText()
        if not self.prompt.toPlainText().strip():
            self.prompt.setPlainText(question)

    def _on_finished(self, stats: dict) -> None:
        self._turn_start = None
        if self._pending_user is not None:
            self.conversation.add_user(self._pending_user)
            self.conversation.add_assistant(self._answer, stats)
            self._pending_user = None
        line = format_stats(stats)
        if isinstance(stats.get("profile"), str) and stats["profile"]:
            self._profile_folder = stats["profile"]
            self.show_profile_button.show()
            line += f" · profiled: {stats['profile']}"
        self.stats.setText(f"endpoint · {line}" if stats.get("source") == "endpoint" else line)

    def _on_error(self, kind: str, message: str) -> None:
        if self.client.state != gc.LOADING:
            self._end_loading()
        if self._turn_start is not None and self.client.state != gc.GENERATING:
            # The worker refused or failed the turn in flight (a synchronous refusal comes before
            # send() begins a turn: then none is in flight).
            self._turn_failed(message)
        text = f"<span style='color:#b00020'><b>{kind.replace('_', ' ')}:</b> " \
               f"{html.escape(message)}</span>"
        if kind in ("bad_parameters", "busy", "not_loaded"):
            self.stats.setText(text)
        else:
            self.model_status.setText(text)

    def _on_worker_exited(self, code: int, status: str, tail: str) -> None:
        if self.client.state != gc.LOADING:
            self._end_loading()
        if self._pending_user is not None:
            self._turn_failed("the worker ended during generation")
        last = tail.strip().splitlines()[-3:] if tail else []
        self.model_status.setText(
            f"<span style='color:#b00020'><b>The worker {describe_exit(code, status)}.</b></span> "
            + " | ".join(map(html.escape, last)) + " — Load or Restart worker to go on.")

    def _on_state(self, state: str) -> None:
        busy = state in (gc.LOADING, gc.GENERATING, gc.STARTING)
        self.load_button.setEnabled(not busy)
        self.cancel_load_button.setVisible(state == gc.LOADING)
        self.cancel_load_button.setEnabled(state == gc.LOADING)
        self.unload_button.setEnabled(state == gc.LOADED)
        self._update_send()

    # -- the Serve endpoint -----------------------------------------------------------------------------

    def bind_serve(self, serve: ServeService) -> None:
        """Offer the running server as where answers come from (the app's one ServeService)."""
        if self._serve is serve:
            return
        self._serve = serve
        # Bound methods, not lambdas: Qt drops these connections when this tab goes (the service stays).
        serve.state_changed.connect(self._on_serve_state)
        serve.url_ready.connect(self._on_serve_url)
        serve.chat.token_received.connect(self._on_token)
        serve.chat.generation_finished.connect(self._on_finished)
        serve.chat.error_occurred.connect(self._on_endpoint_error)
        serve.chat.busy_changed.connect(self._on_chat_busy)
        self._update_endpoint()

    def _on_serve_state(self, _state: str, _message: str) -> None:
        self._update_endpoint()

    def _on_serve_url(self, _url: str) -> None:
        self._update_endpoint()

    def _on_chat_busy(self, _busy: bool) -> None:
        self._update_send()

    def _endpoint_on(self) -> bool:
        return self._serve is not None and self.use_endpoint.isChecked() and self._serve.ready()

    def _update_endpoint(self) -> None:
        serve = self._serve
        ready = serve is not None and serve.ready()
        self._endpoint_row.setVisible(ready)
        self.endpoint_url.setText(serve.url if ready and serve is not None else "")
        self._update_send()

    def _update_send(self) -> None:
        chat_busy = self._serve is not None and self._serve.chat.is_busy()
        if self._endpoint_on():
            self.send_button.setEnabled(not chat_busy)
            self.stop_button.setEnabled(chat_busy)
            self.stop_button.setToolTip("Esc: the request is closed; the server stops generating")
            return
        state = self.client.state
        self.send_button.setEnabled(state == gc.LOADED and not chat_busy)
        self.stop_button.setEnabled(state == gc.GENERATING or chat_busy)
        self.stop_button.setToolTip("Esc: the worker stops within one token")

    def _on_endpoint_error(self, kind: str, message: str) -> None:
        self._turn_failed(message)
        self.stats.setText(f"<span style='color:#b00020'><b>{html.escape(kind)}:</b> "
                           f"{html.escape(message)}</span>")

    def copy_answer(self) -> None:
        answer = self.conversation.last_answer()
        if not answer:
            self.notice.setText("Nothing to copy yet: no answer.")
            return
        QGuiApplication.clipboard().setText(answer)
        self.notice.setText(f"Copied the answer ({len(answer)} characters).")

    def copy_conversation(self) -> None:
        if not self.conversation.turns:
            self.notice.setText("Nothing to copy yet: the conversation is empty.")
            return
        text = self.conversation.to_markdown()
        QGuiApplication.clipboard().setText(text)
        self.notice.setText(f"Copied the conversation as Markdown ({len(self.conversation.turns)} turns).")

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
                return
            self.notice.setText(f"Exported the conversation to {path}.")

    def clear(self) -> None:
        self.conversation.clear()
        self.view.clear()
        self.stats.clear()
        self.notice.setText("Conversation cleared.")

    # -- JobOwner ---------------------------------------------------------------------------------------

    #: The worker holds the model and its card: it ends with the window.
    outlives_window = False

    def active_jobs(self) -> list[str]:
        """The worker while it holds a model (loaded, loading or answering): it holds the model's
        memory and, on Gaudi, its card, so closing the window ends real work. Named by what the user
        chose (``builtin:demo``, a Hub id, a folder), not by the folder it resolved to."""
        state = self.client.state
        if state not in (gc.LOADED, gc.GENERATING, gc.LOADING):
            return []
        options = self.client.options
        name = (options.model if options is not None else "") or self.conversation.model or "a model"
        if state == gc.LOADING:
            return [f"{gc.JOB_NAME}: loading {self.model.currentText().strip() or name}"]
        doing = "generating" if state == gc.GENERATING else "loaded"
        return [f"{gc.JOB_NAME}: {name} {doing}" + (f" on {self.client.host.name}"
                                                    if not self.client.host.is_local else "")]

    def stop_jobs(self) -> None:
        # The worker ends (answer cancelled, model let go): active_jobs empties once it has exited.
        self.client.cancel()
        self.client.shutdown()

    def detach_jobs(self) -> list[str]:
        # The worker holds the card and cannot outlive the window: stop it instead.
        self.stop_jobs()
        return []

    def shutdown(self) -> None:
        if self.remote_browser is not None:
            self.remote_browser.reject()  # ends its listing child, if one runs
        self._end_loading()
        if self._services.preflight is not None:
            self._services.preflight.cancel("runner")
        self.client.kill()

"""The Serve panel: a model on an OpenAI-compatible endpoint, here or on a host, with one click.

It only binds to ``services.serve.ServeService`` (which runs ``gaudi-gui serve --events`` as its child):
the form becomes a ``core.serve.ServeSpec``; the service's states, warm-up progress, URL and requests
are shown as they come.
"""

from __future__ import annotations

import html
import time
from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QTimer, Signal
from PySide6.QtGui import QGuiApplication, QShowEvent
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QFormLayout,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSpinBox,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core import generation
from gaudi_gui.core import serve as sv
from gaudi_gui.core.placement import Placement
from gaudi_gui.core.remote import Host
from gaudi_gui.services.device_selection import DeviceSelection
from gaudi_gui.services.downloads import ModelPlaces
from gaudi_gui.services.queue import JobQueue
from gaudi_gui.services.serve import ServeService
from gaudi_gui.ui.fp8_field import Fp8Field
from gaudi_gui.ui.model_field import ModelCacheState, WrappedLine
from gaudi_gui.ui.shortcuts import start_stop_keys

LOCAL_LABEL = "this machine"
COLUMNS = ("time", "method", "path", "status", "prompt tok", "completion tok", "TTFT s", "tok/s")


class ServePanel(QWidget):
    #: Download… beside the model field: (the model's Hub id, the chosen host's name); the main window
    #: opens the Models tab's Download dialog with them.
    download_requested = Signal(str, str)

    def __init__(self, service: ServeService, parent: QWidget | None = None, *,
                 hosts: Callable[[], list[Host]] | None = None,
                 selection_for: Callable[[str], DeviceSelection | None] | None = None,
                 queue_for: Callable[[str], JobQueue] | None = None,
                 models: ModelPlaces | None = None,
                 machine: Callable[[], dict[str, str]] | None = None) -> None:
        """``queue_for`` gives the queue of a place ("local" or a saved host's name: the Queue button;
        without it, no button); ``models`` the Hub caches' listings and downloads (the model's state
        and Download…); ``machine`` this machine as an FP8 calibration records it (``AppServices.machine``:
        the FP8 field checks a calibration against it)."""
        super().__init__(parent)
        self.service = service
        self._queue_for = queue_for
        self._hosts = hosts or (lambda: [])
        #: The card selection of a place ("local" or a host's name): the Devices / Hosts tab's choice.
        self._selection_for = selection_for or (lambda _name: None)
        self.setObjectName("serve_panel")

        self.model = QLineEdit("builtin:demo")
        self.model.setToolTip("A Hub id (org/name), a local folder, or builtin:demo (offline demo model)")
        self.host = QComboBox()
        self.device = QComboBox()
        self.device.addItems(sv.DEVICES)
        self.dtype = QComboBox()
        self.dtype.addItems(sv.DTYPES)
        self.quantization = QComboBox()
        self.quantization.addItems(sv.QUANTIZATIONS)
        self.engine = QComboBox()
        self.engine.addItems(sv.ENGINES)
        self.engine_reason = QLabel("")
        self.engine_reason.setWordWrap(True)
        #: The cards the server will hold: the place's card selection (Devices tab / a host's panel).
        self.cards_note = QLabel("")
        self.cards_note.setWordWrap(True)
        self.port = QSpinBox()
        self.port.setRange(1, 65535)
        self.port.setValue(sv.DEFAULT_PORT)
        self.prompt_tokens = QSpinBox()
        self.prompt_tokens.setRange(1, 1_000_000)
        self.prompt_tokens.setValue(1024)
        self.answer_tokens = QSpinBox()
        self.answer_tokens.setRange(1, 1_000_000)
        self.answer_tokens.setValue(256)
        self.context = QLabel("")
        # Wrapped: a long sentence here must not make the dock (and the window) wider than the screen.
        self.context.setWordWrap(True)
        self.api_key_env = QLineEdit()
        self.api_key_env.setPlaceholderText("name of an environment variable holding the key (vLLM)")
        self.listen_all = QCheckBox("listen on all interfaces (needs an API key)")
        self.adapter = QLineEdit()
        self.adapter.setPlaceholderText("a training run's adapter/ folder (optional)")
        #: FP8 (issue 39): a calibration of the model (served through vLLM's INC quantization); none: bf16.
        self.fp8 = Fp8Field(self, machine=machine,
                            serve_ranks=lambda: max(1, len(set(self._cards()))))
        self.field_error = QLabel("")
        self.field_error.setObjectName("serve_field_error")
        self.field_error.setWordWrap(True)

        form = QFormLayout()
        # A field that does not fit beside its label goes under it: the dock stays narrow enough for a
        # 1024-pixel screen beside the Model runner.
        form.setRowWrapPolicy(QFormLayout.RowWrapPolicy.WrapLongRows)
        # Download… beside the model when the chosen host's cache lacks it; the cached models are
        # offered as the user types, most recently used first (ui/model_field.py).
        self.download_button = QPushButton("Download…")
        # Under the field, at the start of its line: beside it, the narrow dock cut the model's id.
        self.model_cache = ModelCacheState(self.model, models, lambda: self._host_of(self.placement()),
                                           button=self.download_button, button_in_line=True,
                                           action="Start")
        form.addRow("Model", self.model)
        form.addRow("", self.model_cache)
        form.addRow("Host", self.host)
        form.addRow("Cards", self.cards_note)
        form.addRow("Device", self.device)
        form.addRow("Dtype", self.dtype)
        form.addRow("Quantization", self.quantization)
        form.addRow("FP8 calibration", self.fp8)
        form.addRow("Engine", self.engine)
        form.addRow("", self.engine_reason)
        form.addRow("Port", self.port)
        form.addRow("Expected prompt tokens", self.prompt_tokens)
        form.addRow("Expected answer tokens", self.answer_tokens)
        form.addRow("Max context length", self.context)
        form.addRow("API key", self.api_key_env)
        form.addRow("", self.listen_all)
        form.addRow("LoRA adapter", self.adapter)

        self.start_button = QPushButton("Start")
        self.stop_button = QPushButton("Stop")
        self.stop_button.setEnabled(False)
        self.copy_button = QPushButton("Copy URL")
        self.copy_button.setEnabled(False)
        self.queue_button = QPushButton("Queue")
        self.queue_button.setToolTip("put this server in this machine's queue: it starts by itself when "
                                     "its cards are free (View → Queue)")
        self.queue_button.setVisible(queue_for is not None)
        buttons = QHBoxLayout()
        for b in (self.start_button, self.stop_button, self.copy_button):
            buttons.addWidget(b)
        # Queue on a row of its own: a fourth button in the row above made the dock too wide for a
        # 1024-pixel screen beside the Model runner.
        queue_row = QHBoxLayout()
        queue_row.addWidget(self.queue_button)
        queue_row.addStretch(1)
        buttons.addStretch(1)
        # Its height is its text's at the dock's width: a two-line status ("stopped, port … is free —
        # energy … · N tokens generated · Wh per 1,000 tokens …") was cut to one line in the scroll area.
        self.status = WrappedLine("stopped")
        self.status.setObjectName("serve_status")
        self.status.setWordWrap(True)
        self.progress = QProgressBar()
        self.progress.setRange(0, 1000)
        self.progress.setVisible(False)
        self.url = QLabel("")
        self.url.setObjectName("serve_url")
        self.url.setWordWrap(True)
        self.snippets = QPlainTextEdit()
        self.snippets.setReadOnly(True)
        self.snippets.setMaximumHeight(180)
        self.requests = QTableWidget(0, len(COLUMNS))
        self.requests.setHorizontalHeaderLabels(list(COLUMNS))

        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.field_error)
        layout.addLayout(buttons)
        layout.addLayout(queue_row)
        layout.addWidget(self.status)
        layout.addWidget(self.progress)
        layout.addWidget(self.url)
        layout.addWidget(self.snippets)
        layout.addWidget(self.requests, 1)

        self.start_button.clicked.connect(self.start)
        # Ctrl+Return starts and Ctrl+. stops while the focus is in the panel (ui/shortcuts.py).
        self.shortcuts = start_stop_keys(self, self.start_button, self.stop_button)
        self.queue_button.clicked.connect(lambda _checked=False: self.queue_current())
        self.stop_button.clicked.connect(self.service.stop)
        self.copy_button.clicked.connect(self.copy_url)
        self._copied = QTimer(self)
        self._copied.setSingleShot(True)
        self._copied.setInterval(2000)
        self._copied.timeout.connect(self._copy_reset)
        for box in (self.engine, self.device, self.host):
            box.currentIndexChanged.connect(self._update_choice)
        self.host.currentIndexChanged.connect(lambda _index: self.model_cache.place_changed())
        self.host.currentIndexChanged.connect(lambda _index: self.fp8.set_local(self.placement().is_local))
        self.model.textChanged.connect(self.fp8.set_model)
        # A calibration chosen is checked as it enters (and served only by vLLM: said at once too).
        self.fp8.changed.connect(lambda _folder: self._fp8_refused())
        self.engine.currentIndexChanged.connect(lambda _index: self._fp8_refused())
        self.model_cache.download_requested.connect(self.download_requested)
        self.prompt_tokens.valueChanged.connect(self._update_choice)
        # The context said is the chosen model's own: read again when another model is typed.
        self.model.textChanged.connect(lambda _text: self._update_choice())
        self.answer_tokens.valueChanged.connect(self._update_choice)
        local = self._selection_for("local")
        if local is not None:  # the Devices tab's checks change what a start here would hold
            local.selection_changed.connect(self._on_selection_changed)
        service.state_changed.connect(self._on_state)
        service.progress.connect(self._on_progress)
        service.url_ready.connect(self._on_url)
        service.request.connect(self._on_request)
        service.failed.connect(self._on_failed)
        self.refresh_hosts()
        self._update_choice()
        self.fp8.set_model(self.model.text())
        if service.is_running():  # a server re-attached before the panel was first opened
            self._on_state(service.state, "running (re-attached)" if not service.url else "")
            if service.url:
                self._on_url(service.url)
            for record in service.requests:
                self._on_request(record)

    # -- the form ---------------------------------------------------------------------------------

    def refresh_hosts(self) -> None:
        current = self.host.currentText()
        self.host.blockSignals(True)
        self.host.clear()
        self.host.addItem(LOCAL_LABEL)
        for h in self._hosts():
            self.host.addItem(h.name)
        index = self.host.findText(current)
        self.host.setCurrentIndex(max(index, 0))
        self.host.blockSignals(False)
        if hasattr(self, "model_cache"):
            self.model_cache.place_changed()

    def placement(self) -> Placement:
        name = self.host.currentText()
        if name == LOCAL_LABEL or not name:
            return Placement.local()
        chosen = next((h for h in self._hosts() if h.name == name), None)
        return Placement.on_host(chosen or Host.parse(name))

    @staticmethod
    def _host_of(place: Placement) -> Host:
        return place.hosts[0] if place.hosts else Host.local()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self._update_cards()  # a host's choice may have changed in its panel meanwhile

    def _on_selection_changed(self, _ids: list) -> None:
        self._update_cards()

    def selection(self) -> DeviceSelection | None:
        place = self.placement()
        return self._selection_for("local" if place.is_local else place.hosts[0].name)

    def _card_selection(self) -> DeviceSelection | None:
        """The place's card choice when the server will run on its cards (None: on the CPU)."""
        chosen = self.selection()
        if chosen is None or not chosen.jobs_use_cards() or self.device.currentText() == "cpu":
            return None
        return chosen

    def _cards(self) -> tuple[int, ...]:
        chosen = self._card_selection()
        return tuple(chosen.selected) if chosen is not None else ()

    def _choice(self) -> sv.EngineChoice | None:
        if not self.placement().is_local:
            return None
        try:
            local = self._selection_for("local")
            probed = local.jobs_kind if local is not None else "cpu"
            return self.service.engine_choice(self.engine.currentText(), self.device.currentText(), probed)
        except sv.ServeError as exc:
            return sv.EngineChoice("", exc.message)

    def _update_cards(self) -> None:
        if self._card_selection() is None:
            self.cards_note.setText("none: the server runs on the CPU")
            return
        cards = self._cards()
        where = "this machine's Devices tab" if self.placement().is_local else "that host's card choice"
        self.cards_note.setText(f"{','.join(map(str, cards))} (the choice in {where})" if cards
                                else f"every card (none checked in {where})")

    def _update_choice(self) -> None:
        self._update_cards()
        choice = self._choice()
        if choice is None:
            self.engine_reason.setText("decided on the host when it starts (vLLM where importable there)")
        else:
            self.engine_reason.setText(choice.reason)
        model_max = self._model_context()
        uses_vllm = choice is None or choice.engine == "vllm" or self.engine.currentText() == "vllm"
        if not uses_vllm:
            # transformers serve is given no --max-model-len: the model's own limit is the server's.
            self.context.setText(f"{model_max} tokens: the model's own (its config and tokenizer)"
                                 if model_max else "the model's own (read from its files once it is here)")
            return
        try:
            sized = sv.size_max_model_len(self.prompt_tokens.value(), self.answer_tokens.value(),
                                          model_max=model_max)
        except sv.ServeError as exc:
            self.context.setText(exc.message)
            return
        self.context.setText(f"{sized} tokens (prompt + answer, whole {sv.BLOCK}-token blocks"
                             + (f"; the model takes at most {model_max})" if model_max else ")"))

    def _model_context(self) -> int | None:
        """The chosen model's own context (the smaller of its max_position_embeddings and its
        tokenizer's model_max_length), read from its files where they are on this machine."""
        if not self.placement().is_local:
            return None
        return generation.model_context(self.model.text())

    def spec(self) -> sv.ServeSpec:
        choice = self._choice()
        uses_vllm = choice is None or choice.engine == "vllm"
        sized = 0
        if uses_vllm and self.engine.currentText() != "transformers":
            try:
                sized = sv.size_max_model_len(self.prompt_tokens.value(), self.answer_tokens.value(),
                                              model_max=self._model_context())
            except sv.ServeError:
                sized = 0
        return sv.ServeSpec(model=self.model.text().strip(), engine=self.engine.currentText(),
                            port=self.port.value(), device=self.device.currentText(),
                            dtype=self.dtype.currentText(), quantization=self.quantization.currentText(),
                            adapter=self.adapter.text().strip(), max_model_len=sized,
                            api_key_env=self.api_key_env.text().strip(),
                            listen_all=self.listen_all.isChecked(), cards=self._cards(),
                            fp8=self.fp8.value())

    # -- actions ----------------------------------------------------------------------------------

    def start(self) -> None:
        self.field_error.setText("")
        if self._fp8_refused():
            return
        if self._problems_said(self.service.start(self.spec(), self.placement(), selection=self.selection())):
            return
        self.requests.setRowCount(0)
        self.start_button.setEnabled(False)
        self.stop_button.setEnabled(True)

    def _problems_said(self, problems: list[tuple[str, str]]) -> bool:
        """The form's problems under the fields, in one line (the FP8 field's at that field); whether
        there were any."""
        for field, message in problems:
            if field == "fp8":
                self.fp8.show_error(message)
        others = [(f, m) for f, m in problems if f != "fp8"]
        if others:
            self.field_error.setText("; ".join(f"{f.replace('_', ' ')}: {m}" if f else m
                                               for f, m in others))
        return bool(problems)

    def _fp8_refused(self) -> bool:
        """The chosen FP8 calibration refused at its field (``core.fp8.refusal``'s one line: another
        model, device or card generation, files missing; or no vLLM here to serve it); whether it was."""
        folder = self.fp8.value()
        line = self.fp8.problem()
        if folder and not line and (self.engine.currentText() == "transformers" or not sv.vllm_here()):
            line = f"--fp8 {folder}: {sv.FP8_NEEDS_VLLM}"  # what serve --fp8 says, before it starts
        self.fp8.show_error(line)
        return bool(line)

    def queue_current(self) -> None:
        """Queue: this server goes into the queue of the machine chosen (issue 29: this one's, or the
        host's own) as a serve job (the words ``gaudi-gui serve --detach`` would take) and starts by
        itself when its cards are free."""
        self.field_error.setText("")
        if self._queue_for is None or self._fp8_refused():
            return
        placement = self.placement()
        import dataclasses

        from gaudi_gui.core.queue import CardRequest
        spec = self.spec()
        if self._problems_said(spec.problems() if placement.is_local else []):  # a host's files: the host's
            return
        cards = CardRequest(ids=tuple(sorted(set(spec.cards))))
        words = dataclasses.replace(spec, cards=()).cli_args()  # the queue gives it its cards
        place = self._queue_for("local" if placement.is_local else placement.host.name)
        place.add_kind("serve", words, cards, on_answer=place.shown(self.status.setText, cards))

    def copy_url(self) -> None:
        if self.service.url:
            QGuiApplication.clipboard().setText(self.service.url)
            # Said where the click was: the button reads "Copied" for a moment.
            self.copy_button.setText("Copied ✓")
            self.copy_button.setToolTip(f"{self.service.url} is on the clipboard")
            self._copied.start()

    def _copy_reset(self) -> None:
        self.copy_button.setText("Copy URL")
        self.copy_button.setToolTip("")

    def shutdown(self) -> None:
        self._copied.stop()
        self.service.shutdown()

    # -- what the service says --------------------------------------------------------------------

    def _on_state(self, state: str, message: str) -> None:
        # "ready after 22.1 s: URL" says its state already: no "ready: ready after …".
        said = message.lower().startswith(state.lower()) if message else False
        self.status.setText(message if said else f"{state}: {message}" if message else state)
        running = state not in ("stopped", "failed")
        self.start_button.setEnabled(not running)
        self.stop_button.setEnabled(running)
        self.progress.setVisible(state == "warming")
        if not running:
            self.copy_button.setEnabled(False)
            self.url.setText("")
            self.snippets.setPlainText("")

    def _on_progress(self, fraction: float, eta: float, label: str) -> None:
        self.progress.setVisible(True)
        self.progress.setValue(int(fraction * 1000))
        left = f", about {eta:.0f} s left" if eta >= 0 else ""
        self.progress.setFormat(f"warm-up {label} ({fraction:.0%}{left})")

    def _on_url(self, url: str) -> None:
        self.url.setText(f'<a href="{html.escape(url)}">{html.escape(url)}</a>')
        self.copy_button.setEnabled(True)
        served = self.service.model_id or self.model.text().strip()
        key = self.api_key_env.text().strip()
        self.snippets.setPlainText(sv.curl_snippet(url, served, key) + "\n\n" +
                                   sv.python_snippet(url, served, key))

    def _on_request(self, record: dict[str, Any]) -> None:
        row = self.requests.rowCount()
        self.requests.insertRow(row)
        stamp = record.get("time")
        when = time.strftime("%H:%M:%S", time.localtime(float(stamp))) \
            if isinstance(stamp, (int, float)) else ""
        values = [when, record.get("method"), record.get("path"), record.get("status"),
                  record.get("prompt_tokens"), record.get("completion_tokens"), record.get("ttft_s"),
                  record.get("tokens_per_s")]
        for col, value in enumerate(values):
            self.requests.setItem(row, col, QTableWidgetItem("" if value is None else str(value)))

    def _on_failed(self, field: str, message: str) -> None:
        self.field_error.setText(f"{field.replace('_', ' ')}: {message}" if field else message)

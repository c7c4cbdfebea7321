"""The Queue view: this machine's queue (issue 29), kept by its agent (issue 38), seen at a glance.

One row per job: position (1 starts next; "–" once started), its id and name, its state as a person
reads it ("queued", "waiting for modules 2 and 3", "started on module 4", "ended: finished"), since
when, and why it waits (or how it ended, or its run). Remove takes the selected job out (a job not
started yet); Stop stops a started one as the Training tab's Stop does (``queue stop``: its run saves
a checkpoint at the end of the current step, then is killed after the grace period); Move up puts it
before the one above;
Pause / Resume stops starting jobs and starts them again. Plain text only. The Kind column says
what the job is (training, serve, evaluation, download).

The Machine selector shows this machine's queue or a saved host's (each machine's agent keeps its
own queue; a host's comes through this machine's agent and its one link to the host,
``HostQueueService``); the buttons act on the queue shown.

It only listens to the QueueService (or a HostQueueService): every change of the queue is an event
of its agent; it never reads the queue's files itself.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable

from PySide6.QtWidgets import (
    QAbstractItemView,
    QComboBox,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QPushButton,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core import queue
from gaudi_gui.core.queue import ACTIVE, Entry, QueueError, QueueState
from gaudi_gui.core.remote import LOCAL
from gaudi_gui.services.queue import HostQueueService, QueueService

COLUMNS = ("#", "Job", "Kind", "State", "Since", "Why / run")
POSITION, JOB, KIND, STATE, SINCE, WHY = range(len(COLUMNS))


def shown(state: QueueState) -> list[Entry]:
    """Not started yet (in the order they start), then starting/started, then ended (newest first)."""
    active = [e for e in state.entries if e.state in ACTIVE]
    ended = sorted((e for e in state.entries if e.state == "ended"), key=lambda e: -e.ended_at)
    return [*state.pending(), *active, *ended]


class QueueView(QWidget):
    def __init__(self, service: QueueService, parent: QWidget | None = None, *,
                 host_names: Callable[[], list[str]] | None = None,
                 host_queue: Callable[[str], HostQueueService] | None = None) -> None:
        """``host_names`` lists the saved hosts offered by the Machine selector, ``host_queue`` gives
        (and starts) a host's queue service; without them only this machine's queue is shown."""
        super().__init__(parent)
        self.service: QueueService | HostQueueService = service
        self._local = service
        self._host_names = host_names
        self._host_queue = host_queue
        self.machine = QComboBox(self)
        self.machine.setObjectName("queue_machine")
        self.machine.setToolTip("whose queue: this machine's, or a saved host's (each keeps its own)")
        self.machine.addItem("this machine", LOCAL)
        self.summary = QLabel("the queue is empty", self)
        self.summary.setWordWrap(True)
        self.table = QTableWidget(0, len(COLUMNS), self)
        self.table.setObjectName("queue_table")
        self.table.setHorizontalHeaderLabels(COLUMNS)
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setSelectionMode(QAbstractItemView.SelectionMode.SingleSelection)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.verticalHeader().setVisible(False)
        header = self.table.horizontalHeader()
        header.setSectionResizeMode(WHY, QHeaderView.ResizeMode.Stretch)
        for column in (POSITION, JOB, KIND, STATE, SINCE):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)
        self.remove_button = QPushButton("Remove", self)
        self.remove_button.setToolTip("take the selected job out of the queue (not started yet)")
        self.stop_button = QPushButton("Stop", self)
        self.stop_button.setObjectName("queue_stop")
        self.stop_button.setToolTip("stop the selected started job: it saves a checkpoint at the end of "
                                    "its current step, then ends (killed after the grace period)")
        self.up_button = QPushButton("Move up", self)
        self.up_button.setToolTip("start the selected job before the one above it (it takes its priority)")
        self.pause_button = QPushButton("Pause", self)
        self.pause_button.setToolTip("start no more jobs until Resume (running ones go on)")
        self.message = QLabel("", self)
        self.message.setWordWrap(True)
        buttons = QHBoxLayout()
        for b in (self.remove_button, self.stop_button, self.up_button, self.pause_button):
            buttons.addWidget(b)
        buttons.addStretch(1)
        top = QHBoxLayout()
        top.addWidget(QLabel("Machine:", self))
        top.addWidget(self.machine)
        top.addWidget(self.summary, 1)
        layout = QVBoxLayout(self)
        layout.addLayout(top)
        layout.addWidget(self.table, 1)
        layout.addLayout(buttons)
        layout.addWidget(self.message)
        # clicked(bool) would hand `checked` to a slot with an optional parameter: no-argument lambdas.
        self.remove_button.clicked.connect(lambda _checked=False: self._remove())
        self.up_button.clicked.connect(lambda _checked=False: self._move_up())
        self.stop_button.clicked.connect(lambda _checked=False: self._stop())
        self.pause_button.clicked.connect(lambda _checked=False: self._toggle_pause())
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self._entries: list[Entry] = []
        self.refresh_machines()
        self.machine.currentIndexChanged.connect(lambda _index: self._choose(self.machine.currentData()))
        self._bind(service)

    def refresh_machines(self) -> None:
        """The Machine selector's saved hosts, as the host list has them now."""
        names = self._host_names() if self._host_names is not None and self._host_queue is not None else []
        current = self.machine.currentData()
        self.machine.blockSignals(True)
        while self.machine.count() > 1:
            self.machine.removeItem(1)
        for name in names:
            self.machine.addItem(name, name)
        index = self.machine.findData(current)
        self.machine.setCurrentIndex(max(0, index))
        self.machine.blockSignals(False)
        if index < 0 and current != LOCAL:
            self._choose(LOCAL)

    def machine_name(self) -> str:
        return str(self.machine.currentData() or LOCAL)

    def _choose(self, name: object) -> None:
        if name == LOCAL or not name or self._host_queue is None:
            self._bind(self._local)
        else:
            self._bind(self._host_queue(str(name)))

    def _bind(self, service: QueueService | HostQueueService) -> None:
        old = self.service
        if old is not service:
            for signal, slot in ((old.state_changed, self._show), (old.request_answered, self._answered)):
                with contextlib.suppress(RuntimeError, TypeError):
                    signal.disconnect(slot)
            if isinstance(old, HostQueueService):
                with contextlib.suppress(RuntimeError, TypeError):
                    old.problem_changed.disconnect(self._problem)
        self.service = service
        service.state_changed.connect(self._show)
        service.request_answered.connect(self._answered)
        self.message.setText("")
        if isinstance(service, HostQueueService):
            service.problem_changed.connect(self._problem)
            if not service.known:
                self.table.setRowCount(0)
                self._entries = []
                self.summary.setText(service.problem or f"asking {service.place} for its queue…")
                self._update_buttons()
                return
        self._show(service.state)

    def _problem(self, problem: str) -> None:
        if problem:
            self.message.setText(f"{self.machine_name()}: {problem}")
        service = self.service
        if isinstance(service, HostQueueService) and not service.known:
            # Never answered: the summary says why instead of "asking…" for ever.
            self.summary.setText(problem or f"asking {service.place} for its queue…")

    def selected(self) -> Entry | None:
        rows = self.table.selectionModel().selectedRows()
        if not rows or rows[0].row() >= len(self._entries):
            return None
        return self._entries[rows[0].row()]

    def _show(self, state: QueueState) -> None:
        keep = self.selected()
        now = time.time()
        self._entries = shown(state)
        positions = state.positions()
        self.table.setRowCount(len(self._entries))
        for row, entry in enumerate(self._entries):
            why = entry.why or (entry.summary if entry.state == "ended" else "") or (
                f"run {entry.run_name}" if entry.run_name else "")
            if entry.run_name and entry.why:
                why += f" (run {entry.run_name})"
            values = (str(positions.get(entry.id, "–")), f"{entry.id} {entry.name}".strip(),
                      queue.KIND_TEXT.get(entry.kind, entry.kind), entry.state_text(),
                      queue.since_text(entry.since, now), why)
            for column, text in enumerate(values):
                item = QTableWidgetItem(text)
                item.setToolTip(text)
                self.table.setItem(row, column, item)
        if keep is not None:
            for row, entry in enumerate(self._entries):
                if entry.id == keep.id:
                    self.table.selectRow(row)
        pending = len(positions)
        running = sum(1 for e in state.entries if e.state in ACTIVE)
        text = f"{pending} queued, {running} started" if pending or running else "the queue is empty"
        if state.paused:
            text += " · paused: no job starts until Resume"
        if state.problem:
            text += f" · {state.problem}"
        if self.machine_name() != LOCAL:
            text = f"{self.machine_name()}: {text}"
        self.summary.setText(text)
        self.pause_button.setText("Resume" if state.paused else "Pause")
        self._update_buttons()

    def _update_buttons(self) -> None:
        entry = self.selected()
        pending = entry is not None and entry.state in ("queued", "waiting")
        self.remove_button.setEnabled(pending)
        self.stop_button.setEnabled(entry is not None and entry.state in ACTIVE)
        order = self.service.state.pending()
        self.up_button.setEnabled(pending and entry is not None and bool(order) and order[0].id != entry.id)

    def _remove(self) -> None:
        entry = self.selected()
        if entry is not None:
            self._run(lambda: self.service.remove(entry.id), f"removing {entry.id}…")

    def _stop(self) -> None:
        entry = self.selected()
        if entry is not None and entry.state in ACTIVE:
            self._run(lambda: self.service.stop(entry.id), f"stopping {entry.label()}…")

    def _move_up(self) -> None:
        entry = self.selected()
        order = [e.id for e in self.service.state.pending()]
        if entry is None or entry.id not in order or order.index(entry.id) == 0:
            return
        before = order[order.index(entry.id) - 1]
        self._run(lambda: self.service.move(entry.id, before), f"moving {entry.id} before {before}…")

    def _toggle_pause(self) -> None:
        paused = self.service.state.paused
        self._run(lambda: self.service.set_paused(not paused), "resuming…" if paused else "pausing…")

    def _run(self, send: object, note: str) -> None:
        try:
            send()  # type: ignore[operator]
        except QueueError as exc:
            self.message.setText(str(exc))
            return
        self.message.setText(note)

    def _answered(self, _request_id: str, ok: bool, message: str) -> None:
        self.message.setText(message if ok else f"refused: {message}")


__all__ = ["QueueView"]

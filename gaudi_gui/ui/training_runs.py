"""The history of training runs: status, duration, final loss; actions act on the selected rows."""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from PySide6.QtCore import Qt, QTimer, Signal, SignalInstance
from PySide6.QtGui import QHideEvent, QShowEvent
from PySide6.QtWidgets import (
    QAbstractItemView,
    QGridLayout,
    QLabel,
    QPushButton,
    QSplitter,
    QTableWidget,
    QTableWidgetItem,
    QVBoxLayout,
    QWidget,
)

from gaudi_gui.core import meter_account, meter_files, meter_words, run_copy
from gaudi_gui.core import prices as prices_mod
from gaudi_gui.core.dashboard import LABELS
from gaudi_gui.core.evaluation import latest_scores
from gaudi_gui.core.metrics import format_duration
from gaudi_gui.core.prices import Prices
from gaudi_gui.core.remote import Host
from gaudi_gui.core.runstore import FINAL_STATES, Run, RunStore
from gaudi_gui.core.sft import is_adapter_dir
from gaudi_gui.services import disk_watch
from gaudi_gui.services.agent_child import AgentChild, describe_exit
from gaudi_gui.services.dashboards import DashboardService
from gaudi_gui.services.jobs import JobRegistry
from gaudi_gui.services.queue import QueueService
from gaudi_gui.services.settings import Settings
from gaudi_gui.services.sft_tools import AdapterMerger
from gaudi_gui.ui.export_dialog import ExportDialog
from gaudi_gui.ui.prices_dialog import PricesDialog, prices_of

# What a run cost (card-hours, energy) sits beside how it went; "kind" and "started" come after the meter:
# the run's name already begins with its start time, a Serve or Evaluate run says its kind in its
# status tooltip, and the cost must stay in view in a 1024-pixel window.
COLUMNS = ("run", "status", "duration", "steps", "final loss", "card-hours", "energy", "tokens/s",
           "compilations", "kind", "started", "latest scores")
#: What only a training run offers (a Serve or Evaluate job has no job to clone, checkpoint or model).
TRAINING_ONLY = ("Reopen", "Clone", "Compare", "Resume", "Try in runner", "Merge and save", "Evaluate",
                 "Align with preferences…", "Profile…", "Calibrate FP8…")
#: The kinds Compare takes (among runs of one kind: curves of training runs, figures of benchmark runs).
COMPARABLE = frozenset(("train", "benchmark", "calibrate"))
#: A kind as a sentence names it.
KIND_WORDS = {"train": "training", "benchmark": "benchmark", "calibrate": "calibration"}
#: The columns whose figures are right-aligned.
_NUMBERS = frozenset(("duration", "steps", "final loss", "card-hours", "energy", "tokens/s", "compilations"))
#: The meter's columns (their tooltip is the whole meter).
_METER = frozenset(("card-hours", "energy", "tokens/s", "compilations"))
#: Where a cell keeps the figure it sorts by (None: no figure, sorted after every figure).
SORT_ROLE = Qt.ItemDataRole.UserRole + 1
#: Where the first cell of a row keeps its run folder (rows move when the list is sorted).
RUN_ROLE = Qt.ItemDataRole.UserRole + 2


def _num(value: Any) -> float | None:
    """A finite number, else None (a figure nobody measured is not 0)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def _own_prompts(run: Run) -> tuple[str, str]:
    """A finished run's own prompts for its FP8 calibration: (file, what it is), ("", "") when it has
    no local file (a Hub dataset, the built-in demo, a fraction of the train rows)."""
    try:
        data = run.job().dataset
    except (OSError, ValueError):
        return "", ""
    eval_source = str(data.eval.get("source") or "") if isinstance(data.eval, dict) else ""
    for source, what in ((eval_source, "the run's eval split"), (data.source, "the rows the run trained on")):
        if source and Path(source).expanduser().is_file():
            return str(Path(source).expanduser()), what
    return "", ""


class _Cell(QTableWidgetItem):
    """A cell sorted by its figure (``SORT_ROLE``) where it has one, else by its text; a cell without a
    figure ("not measured", "–") sorts after those with one, never as 0."""

    def __lt__(self, other: QTableWidgetItem) -> bool:
        mine, theirs = self.data(SORT_ROLE), other.data(SORT_ROLE)
        if mine is None and theirs is None:
            return self.text() < other.text()
        if mine is None or theirs is None:
            # After every figure whichever way the column is sorted (descending reverses the test).
            table = self.tableWidget()
            descending = table is not None and \
                table.horizontalHeader().sortIndicatorOrder() == Qt.SortOrder.DescendingOrder
            return mine is None if descending else mine is not None
        return bool(mine < theirs)
#: How often a shown Runs list looks for new runs and changed statuses (a stat per run folder) where
#: the runs folder cannot be watched (no inotify, a network file system).
WATCH_MS = 2000
#: A change seen on disk is shown this soon, and a busy run's status writes at most once a second.
CHANGE_MS, CHANGES_EVERY_MS = 150, 1000


class RunsTable(QWidget):
    #: Show this run's log and curves.
    reopen_requested = Signal(object)
    #: Copy this run's job into the form.
    clone_requested = Signal(object)
    #: Overlay the loss curves of these runs.
    compare_requested = Signal(list)
    #: Continue this run from its latest checkpoint.
    resume_requested = Signal(object)
    #: Open this run's trained model in the Model runner (an adapter: over its base, unmerged).
    load_in_runner_requested = Signal(object)
    #: Merge this run's LoRA adapter into its base model and save the full model.
    merge_requested = Signal(object)
    #: A merge ended: (ok, the merged folder or what went wrong).
    merge_finished = Signal(bool, str)
    #: Open the Evaluate window of this run (base vs tuned; ui/eval_view.py).
    evaluate_requested = Signal(object)
    #: Fill the form with a DPO job that starts from this finished SFT run's model or adapter.
    align_requested = Signal(object)
    #: Open the Calibrate window (FP8, ui/calibrate_view.py) on this finished run's saved model.
    calibrate_requested = Signal(object)
    #: An export (Export…) ended: what it wrote, or "⚠ why not" (emitted from the export's thread).
    export_finished = Signal(str)

    def __init__(self, store: RunStore, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.store = store
        self.table = QTableWidget(0, len(COLUMNS), self)
        self.table.setHorizontalHeaderLabels(list(COLUMNS))
        self.table.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.table.setEditTriggers(QAbstractItemView.EditTrigger.NoEditTriggers)
        self.table.horizontalHeader().setStretchLastSection(True)
        self.table.verticalHeader().setVisible(False)
        # Sorted by a click on a column's header; until then, newest first as the store lists them.
        self.table.horizontalHeader().setSortIndicatorClearable(True)
        self.table.horizontalHeader().setSortIndicator(-1, Qt.SortOrder.DescendingOrder)
        self.table.setSortingEnabled(True)
        self.table.doubleClicked.connect(lambda _i: self._one(self.reopen_requested))
        # Two rows (the run's own actions, then what to do with its model) so the Runs page fits
        # beside the form in a 1024-pixel window.
        buttons = QGridLayout()
        self.buttons: dict[str, QPushButton] = {}
        for name, handler in (("Reopen", lambda: self._one(self.reopen_requested)),
                              ("Clone", lambda: self._one(self.clone_requested)),
                              ("Compare", self._compare),
                              ("Resume", lambda: self._one(self.resume_requested)),
                              ("Try in runner", lambda: self._one(self.load_in_runner_requested)),
                              ("Merge and save", lambda: self._one(self.merge_requested)),
                              ("Evaluate", lambda: self._one(self.evaluate_requested)),
                              ("Align with preferences…", lambda: self._one(self.align_requested)),
                              ("Profile…", self.show_profile),
                              ("Calibrate FP8…", lambda: self._one(self.calibrate_requested)),
                              ("Export…", self.export_selected),
                              ("Open in TensorBoard", lambda: self.open_dashboard("tensorboard")),
                              ("Open in trackio", lambda: self.open_dashboard("trackio")),
                              ("Prices…", self.edit_prices),
                              ("Refresh", self.refresh)):
            button = QPushButton(name, self)
            button.clicked.connect(lambda _checked=False, h=handler: h())
            index = len(self.buttons)
            buttons.addWidget(button, index // 4, index % 4)
            self.buttons[name] = button
        buttons.setColumnStretch(4, 1)
        self.status = QLabel(self)
        self.status.setWordWrap(True)
        # Selectable: a dashboard's address is copied from here where no browser could be opened.
        self.status.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        # "Merge and save" runs its own small child (base + adapter -> <output>/merged).
        self.merger = AdapterMerger(self)
        self.merger.finished.connect(self._merged)
        # "Open in TensorBoard" / "Open in trackio": one dashboard per kind, started on first use and
        # reused; they end with the window (they are not jobs to keep).
        self.dashboards = DashboardService(self)
        self.dashboards.shown.connect(self._dashboard_opened)
        self.dashboards.failed.connect(lambda kind, why: self._dashboard_said(kind, f"⚠ {why}"))
        self.dashboards.state_changed.connect(self._dashboard_said)
        self.merge_requested.connect(self.merge)
        self.evaluate_requested.connect(self.evaluate)
        self.calibrate_requested.connect(self.calibrate)
        #: The Calibrate window (made on first use; its calibration is the agent's job).
        self.calibrate_dialog: QWidget | None = None
        #: Evaluate windows by run folder, and the compared runs' scores (made when first needed).
        self.eval_views: dict[Path, QWidget] = {}
        #: "Profile…": one page for the selected run's profile (ui/profile_view.py), made on first use.
        self.profile_view: QWidget | None = None
        #: Compare of benchmark runs (ui/benchmark_compare.py), made on first use.
        self.benchmark_compare: QWidget | None = None
        #: Compare of FP8 calibrations (ui/fp8_compare.py), made on first use.
        self.fp8_compare: QWidget | None = None
        #: The saved hosts an Evaluate window offers (the Training tab binds the app's host list).
        self.hosts: Callable[[], list[Host]] = list
        #: The app's job registry (the Training tab binds it): each Evaluate window's evaluation is a
        #: job the close dialog names.
        self.jobs: JobRegistry | None = None
        #: This machine's queue and the cards a queued evaluation waits for (the Training tab binds
        #: them): an Evaluate window's Queue button.
        self.queue: Callable[[], QueueService] | None = None
        self.queue_cards: Callable[[], tuple[int, ...]] = tuple
        #: This machine as an FP8 calibration records it (the Training tab binds ``AppServices.machine``):
        #: an Evaluate window's FP8 field checks a calibration against it.
        self.machine: Callable[[], dict[str, str]] | None = None
        self.scores_panel: QWidget | None = None
        #: The folder the last TensorBoard export went to (the next Export… starts there).
        self.export_dir = ""
        #: Export…'s dialog (TensorBoard or trackio), made on first use and kept (it remembers the
        #: trackio folder and project of the last export).
        self.export_dialog: ExportDialog | None = None
        self._exporting: Run | None = None
        #: The agent's ``runs export`` child (made on first use) and what it printed.
        self._export_child: AgentChild | None = None
        self._export_said: list[str] = []
        self.export_finished.connect(self._exported)
        #: Where Compare puts the scores: beside the curves when the Training tab gives a splitter
        #: (``scores_dock``), else a small window of their own.
        self.scores_dock: QSplitter | None = None
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.table, 1)
        layout.addLayout(buttons)
        layout.addWidget(self.status)
        self._runs: list[Run] = []
        self._compared: list[Run] = []
        self._seen: tuple[tuple[str, int], ...] = ()
        #: Each run's meter summary with the change time of its file (read again only when it changed:
        #: the list refreshes itself whenever any run's status moves).
        self._meters: dict[Path, tuple[tuple[int, ...], dict[str, Any] | None]] = {}
        #: Each Gaudi run's compile meter, with the summary it was read for.
        self._compiled: dict[Path, tuple[dict[str, Any], dict[str, Any] | None]] = {}
        self._by_folder: dict[str, Run] = {}
        #: The app's settings (the Training tab may bind them; else this list's own, on the same
        #: file): the prices that turn a meter into a cost.
        self.settings: Settings | None = None
        self.prices_dialog: PricesDialog | None = None
        self._prices = Prices()
        # While shown, new runs appear and running rows move on their own (no Refresh needed): the runs
        # folder and every run not ended yet are watched (disk_watch: inotify, no polling); where they
        # cannot be, the list looks every WATCH_MS.
        self._watch = QTimer(self)
        self._watch.setInterval(WATCH_MS)
        self._watch.timeout.connect(self.refresh_if_changed)
        self._watched: set[str] = set()
        self._soon = QTimer(self)
        self._soon.setSingleShot(True)
        self._soon.timeout.connect(self._on_settled)
        self._refreshed_at = 0.0
        #: The runs of the list that have not ended (their folders are watched while it is shown).
        self._moving: set[str] = set()
        disk_watch.shared().changed.connect(self._on_disk)
        self.table.itemSelectionChanged.connect(self._update_buttons)
        self.refresh()

    def showEvent(self, event: QShowEvent) -> None:
        super().showEvent(event)
        self.refresh_if_changed()
        self._follow_disk()  # (a list with nothing new was not refreshed: it watches all the same)

    def hideEvent(self, event: QHideEvent) -> None:
        self._watch.stop()
        self._soon.stop()
        disk_watch.shared().unwatch(self._watched)
        self._watched = set()
        super().hideEvent(event)

    def _follow_disk(self) -> None:
        """Watch the runs folder and the runs that may still move (the rest have ended)."""
        if not self.isVisible():
            return
        wanted = {str(self.store.root)} | self._moving
        watch = disk_watch.shared()
        watch.unwatch(self._watched - wanted)
        failed = watch.watch(wanted - self._watched)
        self._watched = (self._watched & wanted) | (wanted - self._watched - set(failed))
        if failed or not self._watched:
            self._watch.start()  # some of it cannot be watched: looked at instead
        else:
            self._watch.stop()

    def _on_disk(self, path: str) -> None:
        if path in self._watched and not self._soon.isActive():
            since_ms = (time.monotonic() - self._refreshed_at) * 1000
            self._soon.start(int(max(CHANGE_MS, CHANGES_EVERY_MS - since_ms)))

    def _on_settled(self) -> None:
        self.refresh_if_changed()

    def _signature(self) -> tuple[tuple[str, int], ...]:
        """The run folders and their status files' change times: what a refresh would show anew."""
        out = []
        for run in self.store.runs()[:500]:
            try:
                mtime = run.status_path.stat().st_mtime_ns
            except OSError:
                mtime = 0
            out.append((run.name, mtime))
        return tuple(out)

    def refresh_if_changed(self) -> None:
        seen = self._signature()
        if seen != self._seen:
            self.refresh(seen)

    def refresh(self, seen: tuple[tuple[str, int], ...] | None = None) -> None:
        """Read the history again; the selected runs stay selected (by run, not by row: a new run on
        top must not move the highlight onto another run that Resume or Evaluate would then take)."""
        selected = {run.folder for run in self.selected_runs()}
        at_current = self._run_at(self.table.currentRow())
        current_run = at_current.folder if at_current is not None else None
        self._seen = seen if seen is not None else self._signature()
        self._refreshed_at = time.monotonic()
        self._runs = self.store.runs()[:500]
        moving: set[str] = set()
        self._by_folder = {str(run.folder): run for run in self._runs}
        self._prices = self.prices()
        # Filled unsorted (a sorted table moves a row while its cells are being set), sorted after.
        self.table.setSortingEnabled(False)
        self.table.setRowCount(len(self._runs))
        damaged = 0
        for row, run in enumerate(self._runs):
            # A damaged folder is that run's problem, shown on its row: the other rows still fill.
            problems = run.problems()
            damaged += bool(problems)
            # A "running" run whose processes are gone is told as its events prove, not "running".
            st = run.reconcile()
            if st.state not in FINAL_STATES:
                moving.add(str(run.folder))
            loss = f"{st.final_loss:.4f}" if isinstance(st.final_loss, (int, float)) else "–"
            started = time.strftime("%Y-%m-%d %H:%M", time.localtime(st.started_at)) if st.started_at else "–"
            steps = f"{st.step}/{st.max_steps}" if st.max_steps else "–"
            state = f"{st.state} ⚠ {problems[0]}" if problems else st.state
            summary = self.meter(run)
            # No summary (an older run, or one still running): '–'; a summary whose energy nobody
            # measured: 'not measured', never 0.
            energy = "–" if summary is None else meter_words.kwh_text(summary)
            hours = meter_words.card_hours_text(summary) or "–"
            duration = format_duration(st.duration) if st.started_at else "–"
            scores = latest_scores(run) if st.kind == "train" else "–"
            rate, rate_text = self._tokens_per_s(st.kind, summary)
            compiled, compiled_text = self._compilations(run, st.kind, summary)
            figures: dict[str, float | None] = {
                "duration": st.duration if st.started_at else None, "steps": float(st.step) if st.max_steps
                else None, "final loss": st.final_loss if isinstance(st.final_loss, (int, float)) else None,
                "card-hours": _num((summary or {}).get("card_hours")),
                "energy": _num((summary or {}).get("energy_j")),
                "tokens/s": rate, "compilations": compiled, "started": st.started_at or None}
            tip = self._meter_tip(summary)
            for col, text in enumerate((run.name, state, duration, steps, loss, hours, energy, rate_text,
                                        compiled_text, st.kind, started, scores)):
                item = _Cell(text)
                item.setData(SORT_ROLE, figures.get(COLUMNS[col]))
                if col == 0:
                    item.setData(RUN_ROLE, str(run.folder))
                if COLUMNS[col] in _METER:
                    item.setToolTip(tip)
                if col == 1 and (st.summary or st.error or problems):
                    item.setToolTip("\n".join(dict.fromkeys([*problems, st.summary or st.error])))
                if col == 0 and st.resumed_from:
                    item.setToolTip(f"resumed from {Path(st.resumed_from).name}")
                    item.setText(f"{run.name} ↳ {Path(st.resumed_from).name}")
                if col == 0 and (origin := run_copy.origin(run.folder)) is not None:
                    # A run of a host brought back (its profile): its checkpoints and model are there.
                    item.setToolTip(f"brought back from {origin.get('host')} ({origin.get('folder')} there): "
                                    "its records and profile; its checkpoints and model stay on the host")
                if COLUMNS[col] in _NUMBERS:
                    item.setTextAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
                self.table.setItem(row, col, item)
        self.table.setSortingEnabled(True)
        self.table.resizeColumnsToContents()
        self._moving = moving
        self._follow_disk()
        self._reselect(selected, current_run)
        if damaged:
            self.status.setText(f"⚠ {damaged} damaged run folder(s): see the status column")

    def meter(self, run: Run) -> dict[str, Any] | None:
        """The run's meter summary (meter-summary.json; host 0's run of a multi-host job: the whole
        job's, meter-job.json), read again only when one of the files changed."""
        stamps = []
        for name in (meter_files.SUMMARY_NAME, meter_files.JOB_SUMMARY_NAME):
            try:
                stamps.append((run.folder / name).stat().st_mtime_ns)
            except OSError:
                stamps.append(-1)
        mtime = tuple(stamps)
        cached = self._meters.get(run.folder)
        if cached is not None and cached[0] == mtime:
            return cached[1]
        summary = meter_files.read_job_summary(run.folder) if max(stamps) >= 0 else None
        self._meters[run.folder] = (mtime, summary)
        return summary

    @staticmethod
    def _tokens_per_s(kind: str, summary: dict[str, Any] | None) -> tuple[float | None, str]:
        """(the figure, the cell): a training run's steady tokens/s, a Serve or Evaluate run's
        generated tokens/s; '–' without a meter summary, 'not measured' where it has none."""
        if summary is None:
            return None, "–"
        pace = summary.get("rates") if kind == "train" else summary
        value = _num((pace or {}).get("tokens_per_s")) if isinstance(pace, dict) else None
        if value is None or value <= 0:
            return None, meter_account.NOT_MEASURED
        return value, (f"{value:.3g}" if value < 100 else f"{value:.0f}")

    def _compilations(self, run: Run, kind: str, summary: dict[str, Any] | None) -> tuple[float | None, str]:
        """(the count, the cell) of the Gaudi compile meter: '12 (2 after warm-up)'; '–' where there is
        none to have (not a Gaudi training run, or no meter summary), 'not measured' on a Gaudi run
        whose bridge wrote nothing."""
        if summary is None or kind != "train" or summary.get("kind") != "hpu":
            return None, "–"
        cached = self._compiled.get(run.folder)
        if cached is None or cached[0] is not summary:
            compiled = None
            with contextlib.suppress(Exception):  # a damaged metrics file is that run's, not the list's
                compiled = meter_files.run_compile(run.folder, summary, run.events())
            cached = (summary, compiled)
            self._compiled[run.folder] = cached
        compiled = cached[1]
        if not compiled or "compilations" not in compiled:
            return None, meter_account.NOT_MEASURED
        total = _num(compiled.get("compilations"))
        steady = int(_num(compiled.get("steady_compilations")) or 0)
        return total, f"{int(total or 0)} ({steady} after warm-up)"

    def _meter_tip(self, summary: dict[str, Any] | None) -> str:
        if summary is None:
            return "no meter summary: an older run, or one still running"
        energy = meter_words.energy_text(summary)
        text = meter_words.describe(summary)
        if not meter_account.energy_measured(summary):
            text = f"{text}\n{energy}"
        cost = prices_mod.cost_text(summary, self._prices)
        return f"{text}\n{cost}" if cost else text

    # -- prices -----------------------------------------------------------------------------------------

    def _settings(self) -> Settings:
        if self.settings is None:
            self.settings = Settings(parent=self)
        return self.settings

    def prices(self) -> Prices:
        """The prices in the settings (none set: no cost is shown)."""
        return prices_of(self._settings())

    def edit_prices(self) -> None:
        """Prices…: the price of a kWh and of a card-hour, and their currency."""
        if self.prices_dialog is None:
            self.prices_dialog = PricesDialog(self._settings(), self)
            self.prices_dialog.prices_changed.connect(self._prices_saved)
        self.prices_dialog.show()
        self.prices_dialog.raise_()

    def _prices_saved(self) -> None:
        self.refresh()
        prices = self._prices
        said = [f"{prices_mod.money(price, prices.currency)} per {unit}"
                for price, unit in ((prices.per_kwh, "kWh"), (prices.per_card_hour, "card-hour"))
                if price is not None]
        self.status.setText(f"prices saved: {', '.join(said)}" if said
                            else "prices cleared: no cost is shown")
        if self.scores_panel is not None and self.scores_panel.isVisible() and self._compared:
            self.show_scores(self._compared)

    def _reselect(self, folders: set[Path], current: Path | None) -> None:
        model = self.table.selectionModel()
        self.table.blockSignals(True)
        try:
            self.table.clearSelection()
            for row in range(self.table.rowCount()):
                run = self._run_at(row)
                if run is None:
                    continue
                if run.folder in folders:
                    model.select(self.table.model().index(row, 0),
                                 model.SelectionFlag.Select | model.SelectionFlag.Rows)
                if run.folder == current:
                    self.table.setCurrentCell(row, 0, model.SelectionFlag.NoUpdate)
        finally:
            self.table.blockSignals(False)

    def _run_at(self, row: int) -> Run | None:
        """The run shown in ``row`` (rows move when the list is sorted: the row's first cell says)."""
        item = self.table.item(row, 0) if row >= 0 else None
        return self._by_folder.get(str(item.data(RUN_ROLE))) if item is not None else None

    def selected_runs(self) -> list[Run]:
        rows = sorted({i.row() for i in self.table.selectedIndexes()})
        return [run for run in (self._run_at(r) for r in rows) if run is not None]

    def select_row(self, row: int) -> None:
        self.table.selectRow(row)

    def _one(self, signal: SignalInstance) -> None:
        runs = self.selected_runs()
        if runs and runs[0].kind != "train":
            self.status.setText(f"{runs[0].name} is a {runs[0].kind} job: only its log, status and files "
                                f"are kept (gaudi-gui runs show {runs[0].name})")
        elif runs:
            signal.emit(runs[0])

    def _update_buttons(self) -> None:
        runs = self.selected_runs()
        training = all(run.kind == "train" for run in runs)
        for name in TRAINING_ONLY:
            self.buttons[name].setEnabled(training)
        # Benchmark runs compare among themselves; a selection mixing them with training runs keeps
        # Compare so that it can say why not.
        self.buttons["Compare"].setEnabled(all(run.kind in COMPARABLE for run in runs))

    def _compare(self) -> None:
        runs = self.selected_runs()
        kinds = {run.kind for run in runs}
        if len(kinds) > 1:
            said = " and ".join(f"a {KIND_WORDS.get(kind, kind)} run" for kind in sorted(kinds))
            self.status.setText(f"⚠ {said} cannot be compared: they measure different things (Compare runs "
                                "of one kind: training runs' curves, benchmark runs' figures, or "
                                "calibrations' manifests)")
            return
        if kinds == {"benchmark"}:
            self.compare_benchmarks(runs)
        elif kinds == {"calibrate"}:
            self.compare_calibrations(runs)
        elif runs:
            self.compare_requested.emit(runs)
            self.show_scores(runs)

    def _as_window(self, view: QWidget, width: int, height: int) -> None:
        """``view`` as a window of its own, ``width`` x ``height`` where the screen has room, else the
        screen less room for the frame (a 1024x700 screen)."""
        view.setWindowFlag(Qt.WindowType.Window, True)
        screen = (self.screen() or view.screen()).availableGeometry()
        view.resize(min(width, screen.width() - 24), min(height, screen.height() - 48))

    def compare_benchmarks(self, runs: list[Run]) -> None:
        """Compare of benchmark runs: one table of their figures, the later runs judged against the
        first (oldest first, whatever the list's order: the earlier run is the reference)."""
        from gaudi_gui.ui.benchmark_compare import BenchmarkCompare
        if len(runs) < 2:
            self.status.setText(f"select two or more benchmark runs to compare ({runs[0].name}'s own table: "
                                f"gaudi-gui benchmark --show {runs[0].name})")
            return
        ordered = sorted(runs, key=lambda run: (run.status().started_at or 0, run.name))
        if self.benchmark_compare is None:
            self.benchmark_compare = BenchmarkCompare(self)
            self._as_window(self.benchmark_compare, 1000, 520)
        assert isinstance(self.benchmark_compare, BenchmarkCompare)
        comparison = self.benchmark_compare.show_runs([(run.name, run.folder) for run in ordered])
        self.status.setText(f"comparing {len(ordered)} benchmark runs against {ordered[0].name}"
                            + (f" ({len(comparison.notes)} note(s) under the table)" if comparison.notes
                               else ""))
        self.benchmark_compare.show()
        self.benchmark_compare.raise_()

    def compare_calibrations(self, runs: list[Run]) -> None:
        """Compare of FP8 calibrations: their manifests side by side, the differences marked, and
        whether one can stand for another (oldest first)."""
        from gaudi_gui.ui.fp8_compare import CalibrationCompare
        if len(runs) < 2:
            self.status.setText(f"select two or more calibrations to compare ({runs[0].name}'s manifest: "
                                f"gaudi-gui doctor --fp8 {runs[0].name})")
            return
        ordered = sorted(runs, key=lambda run: (run.status().started_at or 0, run.name))
        if self.fp8_compare is None:
            self.fp8_compare = CalibrationCompare(self)
            self._as_window(self.fp8_compare, 900, 480)
        assert isinstance(self.fp8_compare, CalibrationCompare)
        comparison = self.fp8_compare.show_runs([(run.name, run.folder) for run in ordered])
        self.status.setText(f"comparing {len(comparison.names)} calibrations: {comparison.verdict()}")
        self.fp8_compare.show()
        self.fp8_compare.raise_()

    def show_scores(self, runs: list[Run]) -> None:
        """The compared runs' latest scores and meters beside the curves (when any was evaluated or
        metered)."""
        from gaudi_gui.ui.eval_view import ScoresPanel
        if self.scores_panel is None:
            if self.scores_dock is not None:
                self.scores_panel = ScoresPanel()
                self.scores_dock.addWidget(self.scores_panel)
            else:
                self.scores_panel = ScoresPanel(self)
                self.scores_panel.setWindowFlag(Qt.WindowType.Tool, True)
        assert isinstance(self.scores_panel, ScoresPanel)
        self._compared = list(runs)
        meters = {run.folder: self.meter(run) for run in runs}
        shown = self.scores_panel.show_runs(runs, meters)
        if shown:
            self._add_cost_row(runs, meters)
        if shown:
            self.scores_panel.show()
            self.scores_panel.raise_()
        else:
            self.scores_panel.hide()

    def _add_cost_row(self, runs: list[Run], meters: dict[Path, dict[str, Any] | None]) -> None:
        """Compare's cost row under the meter rows, where a price is set (none set: no row)."""
        prices = self.prices()
        table = getattr(self.scores_panel, "table", None)
        if not prices.any or not isinstance(table, QTableWidget):
            return
        by_name = {run.name: run for run in runs}
        row = table.rowCount()
        table.setRowCount(row + 1)
        table.setItem(row, 0, QTableWidgetItem("cost"))
        for col in range(1, table.columnCount()):
            header = table.horizontalHeaderItem(col)
            run = by_name.get(header.text()) if header is not None else None
            summary = meters.get(run.folder) if run is not None else None
            found = prices_mod.cost(summary, prices)
            if found is None:
                text = "–"
            elif found["total"] is None:
                text = "not known"
            else:
                text = prices_mod.money(found["total"], prices.currency)
            item = QTableWidgetItem(text)
            item.setToolTip(prices_mod.cost_text(summary, prices) or "no meter summary")
            table.setItem(row, col, item)
        table.resizeColumnsToContents()

    def evaluate(self, run: Run) -> None:
        """The run's Evaluate window (one per run; its results refresh this list)."""
        from gaudi_gui.ui.eval_view import EvalView
        if run.status().state not in ("finished", "stopped"):
            self.status.setText(f"{run.name} is {run.status().state}: evaluate a finished or stopped run")
            return
        view = self.eval_views.get(run.folder)
        if view is None:
            view = EvalView(run, parent=self, hosts=self.hosts, queue=self.queue, cards=self.queue_cards,
                            machine=self.machine)
            self._as_window(view, 1000, 760)
            view.service.result.connect(lambda _r: self.refresh())
            if self.jobs is not None:
                self.jobs.register(view.service)
            self.eval_views[run.folder] = view
        view.show()
        view.raise_()

    def show_profile(self) -> None:
        """The selected run's profile page (top operators, host vs device, what to do, Open trace);
        a run that was not profiled is said here, with how to profile one."""
        from gaudi_gui.ui.profile_view import ProfileView
        runs = self.selected_runs()
        if not runs:
            self.status.setText("select a run to see its profile")
            return
        run = runs[0]
        if self.profile_view is None:
            self.profile_view = ProfileView(self)
            self._as_window(self.profile_view, 900, 640)
        assert isinstance(self.profile_view, ProfileView)
        if not self.profile_view.show_run(run.folder, run.name):
            self.status.setText(self.profile_view.heading.text())
            self.profile_view.hide()
            return
        self.profile_view.show()
        self.profile_view.raise_()

    def export_selected(self) -> None:
        """Export… : the selected run's metrics and meter as TensorBoard event files (``DIR/<run
        name>/``) or into trackio's local storage, as the dialog's choice says (the same as ``gaudi-gui
        runs export RUN --tensorboard DIR`` / ``--trackio``)."""
        runs = self.selected_runs()
        if not runs:
            self.status.setText("select a run to export")
            return
        if self.export_dialog is None:
            self.export_dialog = ExportDialog(self)
            self.export_dialog.export_requested.connect(self._export_requested)
        self._exporting = runs[0]
        self.export_dialog.prepare(runs[0].name, self.export_dir)
        self.export_dialog.show()
        self.export_dialog.raise_()

    def _export_requested(self, tracker: str, folder: str, project: str) -> None:
        run = self._exporting
        if run is None:
            return
        if tracker == "tensorboard":
            self.export_dir = folder
        self.buttons["Export…"].setEnabled(False)
        where = f"trackio project {project!r} in {folder}" if tracker == "trackio" else folder
        self.status.setText(f"exporting {run.name} to {where}…")

        # The agent runs it (``runs export`` as its ``export`` child): a long run's meter is tens of MB
        # (10 hours of 8 cards: ~10 s to read and write on a busy machine), and trackio is never
        # imported here.
        if self._export_child is None:
            self._export_child = AgentChild(self, tail_lines=20)
            self._export_child.line_received.connect(self._export_line)
            self._export_child.finished.connect(self._export_ended)
        self._export_said = []
        args = {"folder": str(run.folder), "tracker": tracker}
        if tracker == "trackio":
            args.update({"trackio_dir": str(Path(folder).expanduser()), "project": project})
        else:
            args["tensorboard"] = folder
        self._export_child.start("export", args)

    def _export_line(self, stream: str, line: str) -> None:
        if stream == "stdout" and line.strip():
            self._export_said.append(line)

    def _export_ended(self, code: int, status: str) -> None:
        if code == 0 and self._export_said:
            self.export_finished.emit("\n".join(self._export_said))
            return
        assert self._export_child is not None
        said = [t.removeprefix("gaudi-gui runs export: ") for t in self._export_child.tail(3) if t.strip()]
        why = said[-1] if said else describe_exit(code, status)
        self.export_finished.emit(f"⚠ {why}")

    def _exported(self, text: str) -> None:
        self.buttons["Export…"].setEnabled(True)
        self.status.setText(text)

    def open_dashboard(self, kind: str) -> None:
        """Open in TensorBoard / trackio: the selected run exported for that dashboard and shown in it,
        on this machine (where the run folder is); the browser opens at the run once the page answers."""
        runs = self.selected_runs()
        if not runs:
            self.status.setText(f"select a run to open in {LABELS[kind]}")
            return
        self.buttons[f"Open in {LABELS[kind]}"].setEnabled(False)
        self.dashboards.open(str(runs[0].folder), kind)

    def _dashboard_said(self, kind: str, text: str) -> None:
        if not text.endswith("…"):
            self.buttons[f"Open in {LABELS[kind]}"].setEnabled(True)
        self.status.setText(text)

    def _dashboard_opened(self, kind: str, url: str, browsed: bool) -> None:
        """The page answers: where, and whether a browser was opened at it (said only when one was)."""
        where = "opened in the browser" if browsed else "no browser could be opened here: open this address"
        self._dashboard_said(kind, f"{LABELS[kind]}: {url} ({where}; the dashboard stops when this window "
                                   f"closes)")

    def merge(self, run: Run) -> None:
        """Merge the run's adapter into a full model in ``<output>/merged``."""
        out = run.output_dir()
        adapter = out / "adapter" if out else None
        if adapter is None or not is_adapter_dir(adapter):
            self.status.setText(f"{run.name} has no LoRA adapter to merge (only LoRA/QLoRA runs do)")
            return
        if self.merger.merge(adapter, adapter.parent / "merged"):
            self.buttons["Merge and save"].setEnabled(False)
            self.status.setText(f"merging {run.name}'s adapter into its base model…")

    def _merged(self, ok: bool, text: str) -> None:
        self.buttons["Merge and save"].setEnabled(True)
        self.status.setText(f"merged model saved in {text}" if ok else f"⚠ {text}")
        self.merge_finished.emit(ok, text)

    def calibrate(self, run: Run) -> None:
        """The Calibrate window on ``run``'s saved full model (the command finds final/ or merged/)."""
        from gaudi_gui.ui.calibrate_view import CalibrateDialog
        out = run.output_dir()
        if run.status().state != "finished" or out is None or not any(
                (out / n / "config.json").is_file() for n in ("final", "merged")):
            self.status.setText(f"{run.name}: calibrate a finished run with a saved full model (final/ or "
                                "merged/; Merge and save an adapter first)")
            return
        if self.calibrate_dialog is None:
            from gaudi_gui.services.agent_child import shared_client
            from gaudi_gui.services.calibrate import CalibrateJob
            self.calibrate_dialog = CalibrateDialog(CalibrateJob(shared_client, self), self,
                                                    model=str(run.folder))
        dialog = self.calibrate_dialog
        assert isinstance(dialog, CalibrateDialog)
        if not dialog.view.job.running:
            dialog.view.model.setText(str(run.folder))
            # Calibrated on the run's own data (its eval split's file, else the rows it trained on):
            # the prompts most like what the model will see.
            prompts, what = _own_prompts(run)
            if prompts:
                dialog.view.dataset.setText(prompts)
                dialog.view.status.setText(f"Calibration prompts: {what} ({prompts}); change them above.")
        dialog.show()
        dialog.raise_()

    def shutdown(self) -> None:
        if self.calibrate_dialog is not None:
            self.calibrate_dialog.shutdown()  # type: ignore[attr-defined]
        self.merger.shutdown()
        self.dashboards.shutdown()
        if self._export_child is not None and self._export_child.is_running():
            self._export_child.kill_tree()
        for view in self.eval_views.values():
            view.shutdown()  # type: ignore[attr-defined]

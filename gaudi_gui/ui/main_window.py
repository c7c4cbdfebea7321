"""The main window: four tabs, a status bar, shortcuts, saved geometry, and an orderly close."""

from __future__ import annotations

from typing import TYPE_CHECKING, cast

# What this module loads runs before the first paint. PySide6 builds a type's Python enums when the
# type is first imported: the ``Qt`` namespace alone is ~90 enums (~65 ms), so it is not imported here
# (the tabs load it after the first paint), and QMessageBox / QProgressDialog are imported by the
# methods that show them.
from PySide6.QtCore import QEvent, QObject, QTimer, Signal
from PySide6.QtGui import QAction, QCloseEvent, QKeySequence
from PySide6.QtWidgets import QDockWidget, QLabel, QMainWindow, QTabWidget, QWidget

from gaudi_gui import __version__
from gaudi_gui.services.context import AppServices
from gaudi_gui.services.jobs import ActiveJob, AgentJobs, JobOwner, close_question

if TYPE_CHECKING:
    from gaudi_gui.services.device_selection import DeviceSelection
    from gaudi_gui.services.queue import JobQueue, QueueService
    from gaudi_gui.ui.devices_tab import DevicesTab
    from gaudi_gui.ui.environment_tab import EnvironmentTab
    from gaudi_gui.ui.health_view import HealthView
    from gaudi_gui.ui.hosts_tab import HostsTab
    from gaudi_gui.ui.models_tab import ModelsTab
    from gaudi_gui.ui.queue_view import QueueView
    from gaudi_gui.ui.runner_tab import RunnerTab
    from gaudi_gui.ui.serve_panel import ServePanel
    from gaudi_gui.ui.training_tab import TrainingTab

#: (attribute, tab title) in tab order.
_TABS = (("devices_tab", "&Devices"), ("runner_tab", "&Model runner"), ("training_tab", "&Training"),
         ("environment_tab", "&Environment"), ("hosts_tab", "H&osts"), ("models_tab", "Mode&ls"))

#: How long "Stop and quit" waits for jobs to end before it gives up waiting and closes anyway
#: (the jobs' own escalation to SIGKILL still runs; this only bounds how long the window stays).
STOP_WAIT_MS = 60_000
#: A window that is not painted (started minimized) follows its jobs' reattach this long after it is made.
REATTACH_FALLBACK_MS = 2000


#: Below this window height, Serve and Health share the right-hand dock area as tabs.
SHARED_DOCKS_BELOW_PX = 900


class MainWindow(QMainWindow):
    """Tabs: Devices, Model runner, Training, Environment."""

    #: The window is about to close and every tab was shut down.
    closed = Signal()
    #: Every tab has been built (they are built after the first paint).
    tabs_ready = Signal()

    def __init__(self, services: AppServices, parent: QWidget | None = None) -> None:
        super().__init__(parent)
        self.services = services
        self.setWindowTitle("gaudi-gui")
        self.setObjectName("MainWindow")
        self.tabs = QTabWidget(self)
        self.tabs.setDocumentMode(True)
        # Tabs are built after the first frame is on screen (pyqtgraph alone costs ~0.4 s to import):
        # the window appears at once, then each tab replaces its "loading" page on its own event-loop
        # turn, the visible one first. Touching a tab attribute before then builds it on the spot.
        self._built: dict[str, QWidget] = {}
        for _key, title in _TABS:
            page = QLabel("Loading…")
            # Qt.AlignmentFlag.AlignCenter, set by name so that ``Qt`` is not imported (see the top).
            page.setProperty("alignment", "AlignCenter")
            self.tabs.addTab(page, title)
        self.setCentralWidget(self.tabs)

        self._device_label = QLabel("device: probing…")
        self._jobs_label = QLabel("")
        self.statusBar().addPermanentWidget(self._jobs_label)
        self.statusBar().addPermanentWidget(self._device_label)
        services.environment.probe_finished.connect(self._on_probe)
        services.environment.probe_failed.connect(
            lambda reason: self._device_label.setText("device: unknown (probe failed)"))

        self._build_menus()
        self._jobs_timer = QTimer(self)
        self._jobs_timer.setInterval(1000)
        self._jobs_timer.timeout.connect(self._update_jobs_label)
        self._jobs_timer.start()
        if services.training is not None:
            # Runs left going by an earlier session or started by `gaudi-gui train`: follow them
            # at once, whether or not the Training tab is ever opened.
            QTimer.singleShot(0, services.training, services.training.reattach)
        # Jobs left running by an earlier window (``_reattach_jobs``): followed again right after
        # the first paint (``eventFilter``), not before it: their services' modules (serve, placement,
        # Slurm, the hosts…) took 150-400 ms that the first frame waited for (bench/bench_startup.py:
        # 1.6x a bare window); or sooner, when a view is built before that paint (``_ensure_services``).
        # A window never painted (started minimized) follows them after REATTACH_FALLBACK_MS.
        self._reattached = False
        QTimer.singleShot(REATTACH_FALLBACK_MS, self, self._reattach_once)
        self._closing = False
        self._shut_down = False
        #: The Health view, in a dock made the first time it is asked for (see ``show_health``).
        self.health_view: HealthView | None = None
        self._health_dock: QDockWidget | None = None
        #: The Serve panel, in a dock made the first time it is asked for (``show_serve``, Ctrl+Shift+S).
        self.serve_panel: ServePanel | None = None
        self._serve_dock: QDockWidget | None = None
        #: The Queue view, in a dock made the first time it is asked for (``show_queue``, Ctrl+Shift+Q).
        self.queue_view: QueueView | None = None
        self._queue_dock: QDockWidget | None = None
        self._health_bound = False
        self._bind_health()
        self._restore()
        self.installEventFilter(self)

    # -- lazy tabs ------------------------------------------------------------------------------------

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if obj is self and event.type() == QEvent.Type.Paint:
            self.removeEventFilter(self)
            QTimer.singleShot(0, self, self._reattach_once)
            QTimer.singleShot(0, self, self._build_next_tab)
        return False

    def _reattach_once(self) -> None:
        if self._reattached or self._shut_down:
            return
        self._reattached = True
        self._reattach_jobs()

    def _build_next_tab(self) -> None:
        if self._shut_down:
            return
        order = [self.tabs.currentIndex(), *range(len(_TABS))]
        for index in order:
            key = _TABS[index][0]
            if key not in self._built:
                self._tab(key)
                QTimer.singleShot(0, self, self._build_next_tab)
                return
        self.tabs_ready.emit()

    def _tab(self, key: str) -> QWidget:
        widget = self._built.get(key)
        if widget is not None:
            return widget
        self._ensure_services()
        if key == "training_tab" and self.services.training is None:
            # Built before the app made its supervisor (after the first paint): make it now.
            self.services.ensure_training(self.services.settings.parent())
        widget = _construct(key, self.services, self)
        self._built[key] = widget
        index = [k for k, _ in _TABS].index(key)
        current = self.tabs.currentIndex()
        old = self.tabs.widget(index)
        self.tabs.removeTab(index)
        self.tabs.insertTab(index, widget, _TABS[index][1])
        self.tabs.setCurrentIndex(current)
        if old is not None:
            old.deleteLater()
        self._wire(key, widget)
        return widget

    def _ensure_services(self) -> None:
        """The services every view binds to (the hosts, health), which the app makes after the first
        paint: made on the spot when something is built sooner."""
        parent = self.services.settings.parent()
        self.services.ensure_hosts(parent)
        self.services.ensure_health(parent)
        self._bind_health()
        from gaudi_gui.core import queue as queue_mod
        if self.services.queue is None and queue_mod.state_path().exists():
            self._bind_queue()  # a queue kept on this machine: its "next:" line and notifications
        # Jobs left running are followed before a view built here can start one (else a job started
        # before the first paint would be re-attached as if an earlier window had left it).
        self._reattach_once()

    def _bind_health(self) -> None:
        """A view's request to see a host's health opens the Health dock (once the service exists)."""
        health = self.services.health
        if health is not None and not self._health_bound:
            health.view_requested.connect(self.show_health)
            self._health_bound = True

    def _wire(self, key: str, widget: QWidget) -> None:
        """Cross-tab connections, made once both ends exist."""
        if key == "training_tab" and hasattr(widget, "load_in_runner_requested"):
            widget.load_in_runner_requested.connect(self._load_in_runner)
        if key in ("runner_tab", "training_tab") and hasattr(widget, "download_requested"):
            widget.download_requested.connect(self._download_for)
        if key == "models_tab":
            models = cast("ModelsTab", widget)
            models.use_in_runner_requested.connect(self._model_to_runner)
            models.use_in_training_requested.connect(self._model_to_training)

    def download_model(self, model: str, host: str) -> None:
        """Open the Download dialog for ``model`` into ``host``'s cache (Evaluate's Download…)."""
        self._download_for(model, host)

    def _download_for(self, model: str, host: str) -> None:
        """Download… beside a model field (the runner, Serve, Evaluate, the Training form): the
        Models tab's Download dialog, with that field's model and place; the tab shows the download's
        row, and the field says "cached" once it is done."""
        from gaudi_gui.ui.model_field import hub_id_or_none

        models = self.models_tab
        self.tabs.setCurrentWidget(models)
        self.raise_()
        self.activateWindow()
        # A folder or builtin:demo is not a Hub id: the dialog opens empty then.
        models.open_download_dialog(hub_id_or_none(model) or "", host)

    def _model_to_runner(self, host: str, model: str) -> None:
        """A model from the Models tab into the runner's model field, its host chosen (Load is the
        user's click)."""
        runner = self.runner_tab
        index = runner.host_combo.findData(host)
        if index >= 0:
            runner.host_combo.setCurrentIndex(index)
        if runner.model.findText(model) < 0:
            runner.model.addItem(model)
        runner.model.setCurrentText(model)
        self.tabs.setCurrentIndex(1)

    def _model_to_training(self, host: str, model: str) -> None:
        """A model from the Models tab into the Training form, on the host where it is cached."""
        self.training_tab.placement.refresh_hosts(host)
        form = self.training_tab.form
        if form.model.findText(model) < 0:
            form.model.addItem(model)
        form.model.setCurrentText(model)
        self.tabs.setCurrentIndex(2)

    def _load_in_runner(self, path: str) -> None:
        runner = self.runner_tab
        if hasattr(runner, "load_model_requested_from"):
            runner.load_model_requested_from(path)
        self.tabs.setCurrentIndex(1)

    def ensure_tabs(self) -> None:
        """Build every tab now (tests, screenshots, and close before the lazy build finished)."""
        for key, _ in _TABS:
            self._tab(key)

    @property
    def devices_tab(self) -> DevicesTab:
        return cast("DevicesTab", self._tab("devices_tab"))

    @property
    def runner_tab(self) -> RunnerTab:
        return cast("RunnerTab", self._tab("runner_tab"))

    @property
    def training_tab(self) -> TrainingTab:
        return cast("TrainingTab", self._tab("training_tab"))

    @property
    def hosts_tab(self) -> HostsTab:
        return cast("HostsTab", self._tab("hosts_tab"))

    @property
    def models_tab(self) -> ModelsTab:
        return cast("ModelsTab", self._tab("models_tab"))

    @property
    def environment_tab(self) -> EnvironmentTab:
        return cast("EnvironmentTab", self._tab("environment_tab"))

    # -- construction ---------------------------------------------------------------------------------

    def _build_menus(self) -> None:
        file_menu = self.menuBar().addMenu("&File")
        quit_action = QAction("&Quit", self)
        # The platform's Quit key where it has one; Ctrl+Q everywhere (some platforms bind nothing).
        keys = [k for k in QKeySequence.keyBindings(QKeySequence.StandardKey.Quit) if not k.isEmpty()]
        ctrl_q = QKeySequence("Ctrl+Q")
        quit_action.setShortcuts(keys + ([ctrl_q] if ctrl_q not in keys else []))
        quit_action.triggered.connect(self.close)
        file_menu.addAction(quit_action)

        view_menu = self.menuBar().addMenu("&View")
        for index in range(self.tabs.count()):
            action = QAction(self.tabs.tabText(index).replace("&", ""), self)
            # setShortcuts([key]) is setShortcut(key); PySide6's overload check for setShortcut builds
            # the ``Qt`` namespace's ~90 enums (~40 ms before the first paint), the list form does not.
            action.setShortcuts([QKeySequence(f"Ctrl+{index + 1}")])
            action.triggered.connect(lambda _checked=False, i=index: self.tabs.setCurrentIndex(i))
            view_menu.addAction(action)

        health = QAction("&Health", self)
        health.setShortcuts([QKeySequence("Ctrl+H")])
        health.triggered.connect(lambda _checked=False: self.show_health("local"))
        view_menu.addAction(health)

        serve = QAction("&Serve", self)
        serve.setShortcuts([QKeySequence("Ctrl+Shift+S")])
        serve.triggered.connect(lambda _checked=False: self.show_serve())
        view_menu.addAction(serve)

        queue_action = QAction("&Queue", self)
        queue_action.setShortcuts([QKeySequence("Ctrl+Shift+Q")])
        queue_action.triggered.connect(lambda _checked=False: self.show_queue())
        view_menu.addAction(queue_action)

        help_menu = self.menuBar().addMenu("&Help")
        about = QAction("&About gaudi-gui", self)
        about.triggered.connect(self._about)
        help_menu.addAction(about)

    def _restore(self) -> None:
        settings = self.services.settings
        geometry = settings.get("window/geometry")
        self.fit_to_screen(restored=not geometry.isEmpty() and self.restoreGeometry(geometry))
        state = settings.get("window/state")
        if not state.isEmpty():
            self.restoreState(state)
        index = settings.get("window/tab")
        if 0 <= index < self.tabs.count():
            self.tabs.setCurrentIndex(index)

    def fit_to_screen(self, *, restored: bool) -> None:
        """The first size fits the screen's available area (a fixed 1280x860 put Health and the
        status bar below a 1024x700 or 800-px-high screen's edge); a restored geometry that no
        longer fits it is brought back on screen (core.window_fit)."""
        from PySide6.QtGui import QGuiApplication

        from gaudi_gui.core import window_fit

        screen = (QGuiApplication.screenAt(self.geometry().center()) if restored else None) \
            or self.screen() or QGuiApplication.primaryScreen()
        if screen is None:  # no screen at all: nothing to fit to
            if not restored:
                self.resize(*window_fit.PREFERRED)
            return
        if restored and (self.isMaximized() or self.isFullScreen()):
            return  # the window manager sizes those to the screen
        area = screen.availableGeometry()
        available = (area.x(), area.y(), area.width(), area.height())
        now = self.geometry()
        rect = window_fit.fit_saved((now.x(), now.y(), now.width(), now.height()), available) if restored \
            else window_fit.first_geometry(available)
        if rect != (now.x(), now.y(), now.width(), now.height()):
            self.setGeometry(*rect)

    def _about(self) -> None:
        from PySide6.QtWidgets import QMessageBox

        QMessageBox.about(self, "About gaudi-gui", (
            f"<b>gaudi-gui {__version__}</b><p>A control panel for Intel Gaudi, CUDA and CPU machines: "
            "devices, model runner and training.</p><p>Model work runs in child processes; this window "
            "never loads torch.</p>"))

    # -- health ---------------------------------------------------------------------------------------

    def show_health(self, host: str = "local") -> HealthView | None:
        """The Health view of ``host`` in its dock (made and checked on first use)."""
        if self._shut_down:
            return None
        self._ensure_services()
        health = self.services.health
        if health is None:
            return None
        if self._health_dock is None:
            from PySide6.QtCore import Qt

            from gaudi_gui.ui.health_view import HealthView

            dock = QDockWidget("Health", self)
            dock.setObjectName("health_dock")
            self.health_view = HealthView(health, dock)
            dock.setWidget(self.health_view)
            if self.height() < SHARED_DOCKS_BELOW_PX:
                # A short window (a 1024x700 or 800-px-high screen): below the tabs, Health's least
                # height plus the tallest tab's made the window taller than the screen, its status
                # bar and Health's own rows off the bottom edge. Beside the tabs it takes width only.
                self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, dock)
                self.resizeDocks([dock], [max(300, int(self.width() * 0.4))], Qt.Orientation.Horizontal)
            else:
                self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, dock)
                # Room for the findings (about ten rows at 1280x800), not the dock's bare minimum.
                self.resizeDocks([dock], [max(260, int(self.height() * 0.45))], Qt.Orientation.Vertical)
            self._health_dock = dock
        view = self.health_view
        assert view is not None and self._health_dock is not None
        view.show_host(host)
        self._health_dock.show()
        self._share_small_screen()
        self._health_dock.raise_()
        if health.health(host) is None and not health.is_checking(host):
            health.refresh(host)
        return view

    # -- queue ----------------------------------------------------------------------------------------

    def _bind_queue(self) -> QueueService:
        """This machine's queue service (made on first use) and the Devices tab's "next:" line."""
        made = self.services.queue is None
        queue = self.services.ensure_queue(self.services.settings.parent())
        devices = self._built.get("devices_tab")
        if made and devices is not None:
            cast("DevicesTab", devices).bind_queue(queue)
        hosts = self._built.get("hosts_tab")
        if made and hosts is not None:
            cast("HostsTab", hosts).bind_local_queue(queue)  # the local row's queue length
        return queue

    def _queue_for(self, place: str) -> JobQueue:
        """``AppServices.queue_for``, with this machine's queue bound to the views first."""
        if place == "local":
            self._bind_queue()
        return self.services.queue_for(place)

    def show_queue(self) -> QueueView | None:
        """The Queue view of this machine in its dock (made on first use)."""
        if self._shut_down:
            return None
        self._ensure_services()
        queue = self._bind_queue()
        if self._queue_dock is None:
            from PySide6.QtCore import Qt

            from gaudi_gui.ui.queue_view import QueueView

            dock = QDockWidget("Queue", self)
            dock.setObjectName("queue_dock")
            services = self.services
            self.queue_view = QueueView(
                queue, dock, host_names=lambda: [h.name for h in services.ensure_hosts().saved()],
                host_queue=services.ensure_host_queue)
            dock.setWidget(self.queue_view)
            self.addDockWidget(Qt.DockWidgetArea.BottomDockWidgetArea, dock)
            self._queue_dock = dock
        elif self.queue_view is not None:
            self.queue_view.refresh_machines()  # hosts added or removed since
        self._queue_dock.show()
        self._queue_dock.raise_()
        return self.queue_view

    def _reattach_jobs(self) -> None:
        parent = self.services.settings.parent()
        # Asked of the agents (this machine's, each saved host's: jobs.list), never of a file.
        hosts = self.services.ensure_hosts(parent).saved()
        self.services.ensure_serve(parent).reattach(hosts)
        self.services.ensure_evaluation(parent).reattach(hosts)
        # Downloads left running here or on a saved host (the agents' jobs.list too): followed again at
        # once, so the Models tab and the close dialog show them whether or not the Models tab is
        # ever opened.
        models = self.services.ensure_models(parent)
        models.reattach()
        models.reattach_hosts(self.services.ensure_hosts(parent).saved())

    def show_serve(self) -> ServePanel | None:
        """The Serve panel in its dock (made on first use; its server is the app's ServeService)."""
        if self._shut_down:
            return None
        self._ensure_services()
        if self.serve_panel is None:
            from PySide6.QtCore import Qt

            from gaudi_gui.ui.serve_panel import ServePanel

            dock = QDockWidget("Serve", self)
            dock.setObjectName("serve_dock")
            hosts = self.services.hosts
            services = self.services

            def selection_for(name: str) -> DeviceSelection | None:
                if name == "local":
                    return services.selection
                return hosts.selection(name) if hosts is not None else None

            self.serve_panel = ServePanel(services.ensure_serve(services.settings.parent()), dock,
                                          hosts=hosts.saved if hosts is not None else None,
                                          selection_for=selection_for, queue_for=self._queue_for,
                                          models=services.ensure_models(services.settings.parent()),
                                          machine=services.machine)
            self.serve_panel.download_requested.connect(self._download_for)
            if hosts is not None:
                hosts.changed.connect(self.serve_panel.refresh_hosts)
            runner = self._built.get("runner_tab")
            if runner is not None:  # built before the server existed: offer it the endpoint now
                cast("RunnerTab", runner).bind_serve(self.serve_panel.service)
            dock.setWidget(_scrolling(self.serve_panel))
            self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, dock)
            self._serve_dock = dock
        assert self._serve_dock is not None
        self._serve_dock.show()
        self._share_small_screen()
        self._serve_dock.raise_()
        return self.serve_panel

    def _share_small_screen(self) -> None:
        """Serve and Health both open in a window under 900 px tall: Health beside the tabs at the
        bottom left the runner's transcript about four lines and the Training tab's buttons hidden, so
        the two docks share the right-hand area as tabs (each a click away, the tabs their full
        height). A taller window keeps Health below, as the user may have arranged it."""
        from PySide6.QtCore import Qt

        serve, health = self._serve_dock, self._health_dock
        if serve is None or health is None or not (serve.isVisible() and health.isVisible()):
            return
        if self.height() >= SHARED_DOCKS_BELOW_PX or health.isFloating() or serve.isFloating():
            return
        if health in self.tabifiedDockWidgets(serve):
            return
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, health)
        self.tabifyDockWidget(serve, health)

    # -- status ---------------------------------------------------------------------------------------

    def _on_probe(self, info: dict) -> None:
        device = info.get("device", "cpu")
        detail = {"hpu": f"Gaudi ({info.get('hpu_count', 0)} HPU)",
                  "cuda": f"CUDA ({info.get('cuda_count', 0)} GPU)", "cpu": "CPU"}.get(device, device)
        self._device_label.setText(f"device: {detail}")

    def _owners(self) -> list[JobOwner]:
        """Every job owner: the app's registry (training, Serve, each Evaluate window) and the built
        tabs that own jobs (building one now would only be to ask it)."""
        owners = self.services.jobs.owners()
        return owners + [w for w in self._built.values() if isinstance(w, JobOwner)
                         and not any(w is o for o in owners)]

    def running_jobs(self) -> list[ActiveJob]:
        owners = self._owners()
        # A job of the agent's that a service follows (Serve, Evaluate) is named once, as that service
        # names it, not a second time in the agent's list.
        followed = {job_id for owner in owners for job_id in getattr(owner, "followed_jobs", list)()}
        return [ActiveJob(text, bool(owner.outlives_window)) for owner in owners
                for text in (owner.active_jobs(followed) if isinstance(owner, AgentJobs)
                             else owner.active_jobs())]

    def active_jobs(self) -> list[str]:
        return [job.text for job in self.running_jobs()]

    def _update_jobs_label(self) -> None:
        jobs = self.active_jobs()
        self._jobs_label.setText(f"{len(jobs)} job(s) running" if jobs else "")

    # -- closing --------------------------------------------------------------------------------------

    def closeEvent(self, event: QCloseEvent) -> None:
        if self._shut_down:
            event.accept()
            return
        jobs = self.running_jobs()
        if jobs and not self._closing:
            choice = self._ask_about_jobs(jobs)
            if choice == "cancel":
                event.ignore()
                return
            if choice == "stop":
                event.ignore()
                self._stop_then_close()
                return
            for owner in self._owners():
                if owner.outlives_window:
                    owner.detach_jobs()
            # The agent's jobs are the agent's: they go on whether the window follows them or not.
            if any(owner.active_jobs() for owner in self._owners() if not isinstance(owner, AgentJobs)):
                # The runner: it ends with the window; stopped cleanly, waited for.
                event.ignore()
                self._stop_then_close(leaving=True)
                return
        self._save()
        self._shutdown_tabs()
        event.accept()

    def _ask_about_jobs(self, jobs: list[ActiveJob]) -> str:
        """Every running job, and what each choice does to each kind (services/jobs.close_question)."""
        from PySide6.QtWidgets import QMessageBox

        box = QMessageBox(self)
        box.setObjectName("close_jobs_dialog")
        box.setIcon(QMessageBox.Icon.Question)
        box.setWindowTitle("Jobs are running")
        box.setText(f"{len(jobs)} job(s) are still running:")
        box.setInformativeText(close_question(jobs))
        stop = box.addButton("Stop and quit", QMessageBox.ButtonRole.DestructiveRole)
        leave = (box.addButton("Leave running and quit", QMessageBox.ButtonRole.AcceptRole)
                 if any(j.outlives_window for j in jobs) else None)
        box.addButton(QMessageBox.StandardButton.Cancel)
        box.setDefaultButton(QMessageBox.StandardButton.Cancel)
        box.exec()
        clicked = box.clickedButton()
        if clicked is stop:
            return "stop"
        if leave is not None and clicked is leave:
            return "leave"
        return "cancel"

    def _stop_then_close(self, *, leaving: bool = False) -> None:
        """Stop the jobs, wait for them (or Quit now), close. ``leaving``: only what ends with the window
        is stopped and waited for (the jobs left running go on: the agent's among them)."""
        self._closing = True
        ending = [o for o in self._owners() if not (leaving and o.outlives_window)]
        for owner in ending:
            owner.stop_jobs()
        from PySide6.QtWidgets import QProgressDialog

        dialog = QProgressDialog("Stopping jobs…", "Quit now", 0, 0, self)
        dialog.setWindowTitle("Stopping")
        dialog.setMinimumDuration(0)
        waited = QTimer(self)
        waited.setInterval(100)
        elapsed = [0]

        def check() -> None:
            elapsed[0] += waited.interval()
            if not any(o.active_jobs() for o in ending) or elapsed[0] >= STOP_WAIT_MS or dialog.wasCanceled():
                waited.stop()
                dialog.close()
                self._save()
                self._shutdown_tabs()
                self.close()

        waited.timeout.connect(check)
        waited.start()

    def _save(self) -> None:
        settings = self.services.settings
        settings.set("window/geometry", self.saveGeometry())
        settings.set("window/state", self.saveState())
        settings.set("window/tab", self.tabs.currentIndex())
        settings.sync()

    def _shutdown_tabs(self) -> None:
        if self._shut_down:
            return
        self._shut_down = True
        self._jobs_timer.stop()
        for owner in self._owners():
            owner.shutdown()
        for widget in self._built.values():
            # Views that own no job still hold timers and helper processes.
            shutdown = getattr(widget, "shutdown", None)
            if not isinstance(widget, JobOwner) and callable(shutdown):
                shutdown()
        if self.services.device_poller is not None:  # closed before it was made: nothing to stop
            self.services.device_poller.stop()
        self.services.environment.shutdown()
        if self.health_view is not None:
            self.health_view.shutdown()
        if self.services.serve is not None:
            self.services.serve.shutdown()
        if self.services.health is not None:
            self.services.health.shutdown()
        if self.services.notifier is not None:
            self.services.notifier.shutdown()
        if self.services.queue is not None:
            self.services.queue.shutdown()
        self.services.stop_host_queues()
        self.closed.emit()


class _Fitting(QWidget):
    """Holds a panel in a scroll area and asks it for the least height the panel needs at a width (its
    wrapped lines whole, its lists and logs at their minimum): QScrollArea sizes a widget whose
    layout has a height-for-width to that height, which by default is the preferred one (the panel
    would scroll on a 1280x800 screen where it fits)."""

    def heightForWidth(self, width: int) -> int:
        layout = self.layout()
        if layout is None:
            return super().heightForWidth(width)
        return layout.totalMinimumHeightForWidth(width)


def _scrolling(panel: QWidget) -> QWidget:
    """``panel`` in a vertical scroll area: a dock on a short screen (1024x700) scrolls its panel
    instead of squeezing its wrapped lines or holding the window's height; never narrower than the
    panel's own minimum."""
    from PySide6.QtCore import Qt
    from PySide6.QtWidgets import QFrame, QScrollArea, QVBoxLayout

    holder = _Fitting()
    layout = QVBoxLayout(holder)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(panel)
    scroll = QScrollArea()
    scroll.setWidget(holder)
    scroll.setWidgetResizable(True)
    scroll.setFrameShape(QFrame.Shape.NoFrame)
    scroll.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
    scroll.setMinimumWidth(panel.minimumSizeHint().width() + scroll.verticalScrollBar().sizeHint().width())
    return scroll


def _construct(key: str, services: AppServices, parent: QWidget) -> QWidget:
    """Import a tab's module only when it is built (the imports are what makes tabs costly)."""
    if key == "devices_tab":
        from gaudi_gui.ui.devices_tab import DevicesTab

        return DevicesTab(services, parent)
    if key == "hosts_tab":
        from gaudi_gui.ui.hosts_tab import HostsTab

        return HostsTab(services, parent)
    if key == "runner_tab":
        from gaudi_gui.ui.runner_tab import RunnerTab

        return RunnerTab(services, parent)
    if key == "training_tab":
        from gaudi_gui.ui.training_tab import TrainingTab

        return TrainingTab(services, parent)
    if key == "models_tab":
        from gaudi_gui.ui.models_tab import ModelsTab

        return ModelsTab(services, parent)
    from gaudi_gui.ui.environment_tab import EnvironmentTab

    return EnvironmentTab(services, parent)

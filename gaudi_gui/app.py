"""Start the GUI: one QApplication, the shared services, the main window."""

from __future__ import annotations

import sys
from collections.abc import Callable, Sequence

from PySide6.QtCore import QEvent, QObject, QTimer
from PySide6.QtWidgets import QApplication, QMainWindow, QWidget

from gaudi_gui.services.context import AppServices

#: How long after the first paint the first health check starts.
HEALTH_DELAY_MS = 3000


def create_services(parent: QObject | None = None, *, training: bool = True) -> AppServices:
    """The window's services, all of them made now. ``training=False`` leaves ``services.training``
    None for ``AppServices.ensure_training`` to fill in later."""
    services = window_services(parent)
    add_background_services(services, parent, training=training)
    return services


def window_services(parent: QObject | None = None) -> AppServices:
    """What the window needs before its first paint: the settings, the card selection and the
    environment probe. The app makes the rest with ``add_background_services`` once the window is
    painted: their modules (the device poller and hl-smi parsing, the hosts' ssh and multi-host
    helpers, the alerts, the training supervisor) are most of what the first paint would otherwise
    wait for."""
    from gaudi_gui.services.device_selection import DeviceSelection
    from gaudi_gui.services.environment_probe import EnvironmentProbe
    from gaudi_gui.services.garbage import collect_on_this_thread
    from gaudi_gui.services.jobs import JobRegistry
    from gaudi_gui.services.settings import Settings

    collect_on_this_thread()  # cycles holding Qt objects are never collected on another thread
    settings = Settings(parent=parent)
    selection = DeviceSelection(parent)
    environment = EnvironmentProbe(parent=parent)
    # Where jobs really run (cards seen but no habana_frameworks: the CPU), whether or not the
    # Devices tab is ever built.
    environment.probe_finished.connect(selection.set_environment)
    return AppServices(settings=settings, selection=selection, environment=environment,
                       jobs=JobRegistry(parent))


def add_background_services(services: AppServices, parent: QObject | None = None, *,
                            training: bool = True) -> None:
    """The services every view may bind to, made before any tab is built: the device poller, the saved
    hosts (hosts.json read once) and each host's card selection, health and the notifier, and
    (``training``) the training supervisor. Nothing is started."""
    services.ensure_poller(parent)
    services.ensure_hosts(parent)
    add_health(services, parent)
    if training:
        services.ensure_training(parent)


def add_health(services: AppServices, parent: QObject | None = None) -> None:
    """The health service (doctor reports and alerts) and the notifier; nothing runs until
    ``services.health.start()``."""
    services.ensure_health(parent)


class _FirstPaint(QObject):
    """Calls ``then`` once, on the event-loop turn after ``window``'s first paint (or after
    ``FALLBACK_MS`` if no paint comes: a window opened minimized, say)."""

    FALLBACK_MS = 2000

    def __init__(self, window: QWidget, then: Callable[[], object]) -> None:
        super().__init__(window)
        self._window = window
        self._then: Callable[[], object] | None = then
        window.installEventFilter(self)
        QTimer.singleShot(self.FALLBACK_MS, self, self._fire)

    def eventFilter(self, obj: QObject, event: QEvent) -> bool:
        if obj is self._window and event.type() == QEvent.Type.Paint:
            self._window.removeEventFilter(self)
            QTimer.singleShot(0, self, self._fire)
        return False

    def _fire(self) -> None:
        then, self._then = self._then, None
        if then is not None:
            then()


def _after_first_paint(window: QWidget, then: Callable[[], object]) -> None:
    _FirstPaint(window, then)


def _show_settings_problems(services: AppServices, window: QMainWindow) -> None:
    """Say in the status bar what was wrong with the settings file (it was also printed to stderr):
    the window starts either way, with defaults for what could not be used."""
    settings = services.settings
    settings.check_all()

    def show(message: str) -> None:
        count = len(settings.problems)
        more = f" (+{count - 1} more, see stderr)" if count > 1 else ""
        window.statusBar().showMessage(f"Settings: {message}{more}", 30_000)

    settings.problem_found.connect(show)
    if settings.problems:
        show(settings.problems[0])


def _close_asked(window: QMainWindow) -> None:
    """Close ``window`` as its close button does; while a dialog is up (the close question itself,
    after a first Ctrl-C), bring that dialog forward instead of asking a second time over it."""
    dialog = QApplication.activeModalWidget()
    if dialog is not None:
        dialog.raise_()
        dialog.activateWindow()
        return
    window.close()


def run_gui(argv: Sequence[str]) -> int:
    app = QApplication.instance() or QApplication([sys.argv[0], *argv])
    assert isinstance(app, QApplication)
    app.setApplicationName("gaudi-gui")
    app.setOrganizationName("gaudi-gui")
    from gaudi_gui.services.ctrl_c import CtrlC
    from gaudi_gui.ui.main_window import MainWindow

    # Before any view exists: from here Ctrl-C in the terminal never raises inside a view's slot.
    ctrl_c = CtrlC(app)
    services = window_services(app)
    window = MainWindow(services)
    # Ctrl-C asks to quit as the close button does (the question about running jobs included).
    ctrl_c.interrupted.connect(lambda: _close_asked(window))
    window.show()
    _show_settings_problems(services, window)
    # The hosts, health, the training supervisor, hl-smi and the probe child (a Python that imports
    # torch) compete with the first frame for the CPU: make and start them once the window has been
    # painted (this runs before the window builds its first tab, which binds to them).
    def start_background() -> None:
        add_background_services(services, app)
        training = services.ensure_training(app)
        # Runs left going by an earlier session or started by `gaudi-gui train`: followed at once,
        # whether or not the Training tab is ever opened.
        QTimer.singleShot(0, training, training.reattach)
        services.poller.start()
        services.environment.refresh()
        if services.health is not None:
            # The doctor child (hl-smi -q, one -n link per card) waits until the probe child that
            # imports torch has had the CPU for its start.
            QTimer.singleShot(HEALTH_DELAY_MS, services.health, services.health.start)

    _after_first_paint(window, start_background)
    code = int(app.exec())
    ctrl_c.uninstall()
    # The window holds no process (every child is an agent's): nothing to reap, nothing to orphan.
    return code

"""The training supervisor: owns the current and the re-attached runs, their card claims and their
persistence across app restarts. The Training tab only binds to it.

It outlives any view (as qutebrowser's GUIProcess outlives its views): a run started from the tab,
left running at exit, or started by ``gaudi-gui train`` in a terminal is found here at start-up
(``reattach``), whether or not the Training tab is ever opened.
"""

from __future__ import annotations

import contextlib
from typing import TYPE_CHECKING

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import Run, RunStore
from gaudi_gui.services.training_job import TrainingJob

if TYPE_CHECKING:
    from gaudi_gui.services.device_selection import DeviceSelection
    from gaudi_gui.services.settings import Settings


class TrainingService(QObject):
    """Training runs of this app, live and re-attached."""

    #: The job the Training tab shows changed (a new start, or a re-attached run): carries it.
    current_changed = Signal(object)
    #: Any run's state changed: carries the state (for the status bar's job count).
    job_state_changed = Signal(str)
    #: A run ended: carries the TrainingJob.
    job_finished = Signal(object)

    def __init__(self, settings: Settings, selection: DeviceSelection, environment: object,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.settings = settings
        self.selection = selection
        self.environment = environment
        runs_dir = settings.get("training/runs_dir")
        self.store = RunStore(runs_dir or None)
        self.jobs: list[TrainingJob] = []
        self.current = self._new_job()
        self._reattached = False

    # -- jobs -------------------------------------------------------------------------------------

    @property
    def device(self) -> str:
        kind = getattr(self.environment, "device", None)
        return kind if kind in ("cpu", "cuda", "hpu") else "cpu"

    def device_env(self) -> dict[str, str]:
        return dict(self.selection.env()) if self.device != "cpu" else {}

    def _grace(self) -> float:
        try:
            return float(self.settings.get("training/stop_grace_s"))
        except (TypeError, ValueError):
            return 120.0

    def _new_job(self) -> TrainingJob:
        job = TrainingJob(self.store, stop_grace_s=self._grace(), parent=self)
        job.status_changed.connect(self._on_state)
        job.finished.connect(self._on_job_finished)
        return job

    def _on_state(self, state: str) -> None:
        self.job_state_changed.emit(state)

    def _claim_name(self, job: TrainingJob) -> str:
        return f"training {job.run.name}" if job.run else "training"

    def _on_job_finished(self, *_args: object) -> None:
        job = self.sender()
        if not isinstance(job, TrainingJob):
            return
        with contextlib.suppress(Exception):
            self.selection.release(self._claim_name(job))
        self._persist_detached([j for j in self.jobs if j.is_running() and j is not job])
        self.job_finished.emit(job)

    def running(self) -> list[TrainingJob]:
        return [j for j in dict.fromkeys([self.current, *self.jobs]) if j.is_running()]

    def start(self, job: JobConfig, *, resumed_from: str = "") -> Run:
        """Start a run as the current job (PrepareError / OSError / RuntimeError on refusal)."""
        if self.current.is_running():
            raise RuntimeError("a run is already going: stop it first")
        fresh = self._new_job()
        fresh.stop_grace_s = self._grace()
        run = fresh.start(job, device=self.device, device_env=self.device_env(), resumed_from=resumed_from)
        self.settings.set("training/last_job", job.to_dict())
        self.jobs.append(fresh)
        self.current = fresh
        if self.device != "cpu":
            self.selection.claim(self._claim_name(fresh))
        self.current_changed.emit(fresh)
        return run

    def stop(self) -> None:
        """Stop the current run with a checkpoint; a second call while it stops kills it."""
        self.current.stop_grace_s = self._grace()
        self.current.stop()

    def kill(self) -> None:
        self.current.kill()

    # -- persistence ------------------------------------------------------------------------------

    def _persist_detached(self, jobs: list[TrainingJob]) -> None:
        folders = [str(j.run.folder) for j in jobs if j.run is not None]
        with contextlib.suppress(Exception):
            self.settings.set("training/detached_runs", folders)

    def reattach(self) -> list[TrainingJob]:
        """Follow the runs still going: those this app left running, and any in the store whose
        processes are alive (started by ``gaudi-gui train``); stale ones are reconciled."""
        if self._reattached:
            return []
        self._reattached = True
        folders: list[str] = []
        with contextlib.suppress(Exception):
            folders = [str(f) for f in self.settings.get("training/detached_runs") or []]
        candidates = [Run(f) for f in folders]
        for run in self.store.runs()[:50]:
            if run not in candidates:
                candidates.append(run)
        found: list[TrainingJob] = []
        for run in candidates:
            if not run.folder.is_dir():
                continue
            with contextlib.suppress(OSError):
                if run.status().state not in ("queued", "running"):
                    continue
            job = self._new_job()
            try:
                ok = job.attach(run)
            except OSError:
                ok = False
            if not ok:
                job.deleteLater()
                continue
            self.jobs.append(job)
            found.append(job)
            if self.device != "cpu":
                self.selection.claim(self._claim_name(job))
        if found:
            self.current = found[-1]
            self.current_changed.emit(self.current)
        self._persist_detached(found)
        return found

    # -- JobOwner ---------------------------------------------------------------------------------

    def active_jobs(self) -> list[str]:
        return [j.describe() for j in self.running()]

    def stop_jobs(self) -> None:
        for job in self.running():
            if not job.stopping:
                job.stop()

    def detach_jobs(self) -> list[str]:
        running = [j for j in self.running() if j.run is not None]
        for job in running:
            job.detach()
        self._persist_detached(running)
        return [str(j.run.folder) for j in running if j.run is not None]

    def shutdown(self) -> None:
        for job in dict.fromkeys([self.current, *self.jobs]):
            job.shutdown()


__all__ = ["TrainingService"]

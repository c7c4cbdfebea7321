"""The training supervisor service: owns the current and the re-attached runs, their card claims and
their persistence across app restarts. The Training tab only binds to it.

It outlives any view (as qutebrowser's GUIProcess outlives its views): a run started from the tab,
left running at exit, or started by ``gaudi-gui train`` in a terminal is found here at start-up
(``reattach``), whether or not the Training tab is ever opened. Every placement goes through the same
``TrainingJob`` (``launch``), is resumed the same way (``resume``) and remembered in one record
(``TrainingJob.to_record``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.outputs import own_checkpoint
from gaudi_gui.core.placement import Placement
from gaudi_gui.core.runstore import SLURM_INFO, Run, RunStore
from gaudi_gui.services.training_job import TrainingJob

if TYPE_CHECKING:
    from gaudi_gui.services.device_selection import DeviceSelection
    from gaudi_gui.services.settings import Settings

#: The runs being followed, one record per run in the same format for every placement.
FOLLOWED_KEY = "training/followed_runs"


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
        self._claims: dict[TrainingJob, str] = {}
        self.current = self._new_job(Placement.local())
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

    def _new_job(self, placement: Placement) -> TrainingJob:
        job = TrainingJob(placement, self.store, stop_grace_s=self._grace(), parent=self)
        job.status_changed.connect(self._on_state)
        job.finished.connect(self._on_job_finished)
        job.run_identified.connect(self._on_identified)
        return job

    def _on_state(self, state: str) -> None:
        self.job_state_changed.emit(state)

    def _on_identified(self, _folder: str) -> None:
        job = self.sender()
        if isinstance(job, TrainingJob) and job in self._claims:
            # The claim takes the run's name once it has one (the Devices tab shows who holds a card).
            self._release(job)
            self._claim(job)
        self._persist(self.running())

    def _claim(self, job: TrainingJob) -> None:
        """This machine's chosen cards are held by ``job`` while it runs (a run here on cards)."""
        if job.kind == "local" and self.device != "cpu":
            name = f"training {job.name}" if job.name else "training (starting)"
            self._claims[job] = name
            self.selection.claim(name)

    def _release(self, job: TrainingJob) -> None:
        name = self._claims.pop(job, None)
        if name is not None:
            with contextlib.suppress(Exception):
                self.selection.release(name)

    def _on_job_finished(self, *_args: object) -> None:
        job = self.sender()
        if not isinstance(job, TrainingJob):
            return
        self._release(job)
        self._persist([j for j in self.jobs if j.is_running() and j is not job])
        self.job_finished.emit(job)

    def running(self) -> list[TrainingJob]:
        return [j for j in dict.fromkeys([self.current, *self.jobs]) if j.is_running()]

    def launch(self, job: JobConfig, placement: Placement, *, resumed_from: str = "",
               main_ip: str = "", resumed_parts: Sequence[str] = (), gated: bool = False) -> TrainingJob:
        """Start ``job`` at ``placement`` as the current job: the one entry for every place (this
        machine, a host, several hosts, Slurm), each place with the cards the placement chose (this
        machine: the Devices tab's choice). ``main_ip``: host 0's address for the others on several
        hosts (empty: from ``ssh -G``). The outcome comes asynchronously; a job this machine can
        check is refused at once (``TrainingJob.start``'s PrepareError), as is a second run
        (RuntimeError)."""
        if self.current.is_running():
            raise RuntimeError("a run is already going: stop it first")
        device = "auto"
        if placement.kind == "local":
            device = self.device
            if device != "cpu" and self.selection.jobs_use_cards() and not placement.cards:
                placement = Placement.local(self.selection.selected)
        fresh = self._new_job(placement)
        fresh.start(job, device=device, resumed_from=resumed_from, main_ip=main_ip,
                    resumed_parts=resumed_parts, gated=gated)
        self.settings.set("training/last_job", job.to_dict())
        self.jobs.append(fresh)
        self.current = fresh
        self._claim(fresh)
        self.current_changed.emit(fresh)
        return fresh

    def start(self, job: JobConfig, *, resumed_from: str = "") -> TrainingJob:
        """Start ``job`` on this machine (``launch`` at ``Placement.local()``)."""
        return self.launch(job, Placement.local(), resumed_from=resumed_from)

    def resume(self, job: TrainingJob) -> TrainingJob:
        """A new run that resumes the stopped ``job`` from its latest complete checkpoint, where it
        ran and on the cards it had (its checkpoint was made for them). ValueError when there is
        none. A run on this machine resumes from its folder (``latest`` checkpoint there)."""
        run = job.run
        if run is not None:
            checkpoint = own_checkpoint(run)
            if checkpoint is None:
                raise ValueError(f"{run.name} has no complete checkpoint of its own to resume from")
            config = run.user_job()
            config.resume_from_checkpoint = str(checkpoint)
            config.training_args["output_dir"] = str(checkpoint.parent)
            return self.launch(config, job.placement, resumed_from=str(run.folder))
        placement = job.placement
        if placement.kind in ("host", "hosts"):
            cards = tuple((name, tuple(ids)) for name, ids in job.cards.items())
            placement = Placement(placement.kind, placement.hosts, cards or placement.cards)
        # Each host's part resumes that host's run (its checkpoint and folder are the host's).
        return self.launch(job.resume_config(), placement, resumed_from=job.folder, main_ip=job.main_ip,
                           resumed_parts=[p.folder for p in job.parts])

    def stop(self) -> None:
        """Stop the current run with a checkpoint; a second call while it stops kills it."""
        self.current.stop()

    def kill(self) -> None:
        self.current.kill()

    # -- persistence ------------------------------------------------------------------------------

    def _persist(self, jobs: list[TrainingJob]) -> None:
        """The runs being followed, one record each in one format for every placement
        (``TrainingJob.to_record``): followed again after a restart."""
        records = [r for r in (j.to_record() for j in dict.fromkeys(jobs)) if r is not None]
        with contextlib.suppress(Exception):
            self.settings.set(FOLLOWED_KEY, records)

    def _records(self) -> list[dict[str, Any]]:
        """The saved records, with those of earlier versions (a list of run folders and a list of
        host entries) taken over once."""
        records: list[dict[str, Any]] = []
        with contextlib.suppress(Exception):
            records = [r for r in self.settings.get(FOLLOWED_KEY) or [] if isinstance(r, dict)]
        with contextlib.suppress(Exception):
            for folder in self.settings.get("training/detached_runs") or []:
                records.append({"placement": {"kind": "local"},
                                "parts": [{"host": "local", "folder": str(folder)}]})
            for entry in self.settings.get("training/remote_runs") or []:
                if isinstance(entry, dict) and isinstance(entry.get("hosts"), list):
                    records.append({"placement": {"kind": "hosts", "hosts": [
                                        {"name": p.get("host", ""),
                                         "remote_command": p.get("remote_command", "")}
                                        for p in entry["hosts"] if isinstance(p, dict)]},
                                    "parts": entry["hosts"], "job": entry.get("job"),
                                    "main_ip": entry.get("main_ip", ""), "port": entry.get("port", 0)})
                elif isinstance(entry, dict):
                    records.append({"placement": {"kind": "host", "hosts": [
                                        {"name": entry.get("host", ""),
                                         "remote_command": entry.get("remote_command", "")}]},
                                    "parts": [entry], "job": entry.get("job"),
                                    "resumed_from": entry.get("resumed_from", "")})
            self.settings.set("training/detached_runs", [])
            self.settings.set("training/remote_runs", [])
        return records

    def reattach(self) -> list[TrainingJob]:
        """Follow the runs still going: those this app left running anywhere, and any in the store
        whose processes are alive (started by ``gaudi-gui train``); stale ones are reconciled."""
        if self._reattached:
            return []
        self._reattached = True
        remote_found: list[TrainingJob] = []
        local: list[Run] = []
        for record in self._records():
            try:
                placement = Placement.from_record(record.get("placement") or {})
            except ValueError:
                continue
            parts = [p for p in record.get("parts") or [] if isinstance(p, dict) and p.get("folder")]
            if placement.kind in ("local", "slurm"):
                local += [Run(str(p["folder"])) for p in parts[:1]]
                continue
            if not parts or len(parts) != len(placement.places):
                continue
            job = self._new_job(placement)
            job.follow(record)
            self.jobs.append(job)
            remote_found.append(job)
        for run in self.store.runs()[:50]:
            if run not in local:
                local.append(run)
        found = [j for j in map(self._follow_local, local) if j is not None] + remote_found
        if found:
            self.current = found[-1]
            self.current_changed.emit(self.current)
        self._persist(found)
        return found

    def follow_run(self, folder: str) -> TrainingJob | None:
        """Follow a run on this machine that another process started for this window (the queue,
        for a job queued from the Training tab) as if it had been started here: it becomes the
        current job, unless one is running. None when it is no longer going (the Runs list has it)."""
        run = Run(folder)
        known = next((j for j in self.jobs if j.kind == "local" and j.folder == str(run.folder)), None)
        job = known or self._follow_local(run)
        if job is None:
            return None
        if job is not self.current and not self.current.is_running():
            self.current = job
            self.current_changed.emit(job)
        self._persist(self.running())
        return job

    def _follow_local(self, run: Run) -> TrainingJob | None:
        """A run folder on this machine still going (a Slurm job's is followed through the queue)."""
        if not run.folder.is_dir():
            return None
        with contextlib.suppress(OSError):
            status = run.status()
            if status.state not in ("queued", "running") or status.kind != "train":
                return None  # Serve and Evaluate take up their own (services/kind_job.py)
        if (run.folder / SLURM_INFO).is_file():
            from gaudi_gui.services.run_parts import slurm_target_of
            try:
                target = slurm_target_of(run)
                user_job = run.user_job().to_dict()
            except (ValueError, OSError):
                return None
            job = self._new_job(Placement.on_slurm(target.to_record()))
            with contextlib.suppress(OSError, ValueError):
                job.follow({"parts": [{"host": "local", "folder": str(run.folder), "name": run.name}],
                            "job": user_job, "resumed_from": run.status().resumed_from or ""})
        else:
            job = self._new_job(Placement.local())
            try:
                ok = job.attach(run)
            except OSError:
                ok = False
            if not ok:
                job.blockSignals(True)  # retired: mute, then gone (it holds no process)
                job.deleteLater()
                return None
            self._claim(job)
        self.jobs.append(job)
        return job

    # -- JobOwner ---------------------------------------------------------------------------------

    #: Its runs are detached supervisors: left running, they are followed again at the next start.
    outlives_window = True

    def active_jobs(self) -> list[str]:
        return [j.describe() for j in self.running()]

    def followed_folders(self) -> set[str]:
        """The run folders on this machine it follows itself (``AgentJobs`` leaves them to it: the agent
        takes up a run that was running when it started, and the run would be counted twice)."""
        return {str(j.run.folder) for j in self.running() if j.run is not None}

    def stop_jobs(self) -> None:
        for job in self.running():
            if not job.stopping:
                job.stop()

    def detach_jobs(self) -> list[str]:
        running = self.running()
        # Remembered before the followers close: they are followed again at the next start.
        self._persist(running)
        for job in running:
            job.detach()
        return [job.folder if not job.is_remote or job.kind == "slurm" else f"{job.host.name}:{job.folder}"
                for job in running]

    def shutdown(self) -> None:
        for job in dict.fromkeys([self.current, *self.jobs]):
            job.shutdown()


__all__ = ["FOLLOWED_KEY", "TrainingService"]

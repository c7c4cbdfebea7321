"""The training supervisor: owns the current and the re-attached runs, their card claims and their
persistence across app restarts. The Training tab only binds to it.

It outlives any view (as qutebrowser's GUIProcess outlives its views): a run started from the tab,
left running at exit, or started by ``gaudi-gui train`` in a terminal is found here at start-up
(``reattach``), whether or not the Training tab is ever opened.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, TypeGuard

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.runstore import SLURM_INFO, Run, RunStore
from gaudi_gui.services.process import delete_when_reaped
from gaudi_gui.services.training_job import TrainingJob

if TYPE_CHECKING:
    from gaudi_gui.core.placement import Placement
    from gaudi_gui.core.remote import Host
    from gaudi_gui.core.slurm import SlurmTarget
    from gaudi_gui.services.device_selection import DeviceSelection
    from gaudi_gui.services.multi_host_training import MultiHostTrainingJob
    from gaudi_gui.services.remote_training import RemoteTrainingJob
    from gaudi_gui.services.settings import Settings
    from gaudi_gui.services.slurm_training import SlurmTrainingJob


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
        if _is_remote(job):
            return ""
        return f"training {job.run.name}" if job.run else "training"

    def _on_job_finished(self, *_args: object) -> None:
        job = self.sender()
        if not isinstance(job, TrainingJob):
            return
        if not _is_remote(job):
            with contextlib.suppress(Exception):
                self.selection.release(self._claim_name(job))
        self._persist([j for j in self.jobs if j.is_running() and j is not job])
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

    def launch(self, job: JobConfig, placement: Placement, *, resumed_from: str = "",
               main_ip: str = "") -> TrainingJob:
        """Start ``job`` at ``placement`` as the current job: the one entry for every place (this
        machine, a host, several hosts, Slurm), each host with the cards the placement chose.
        ``main_ip``: host 0's address for the others on several hosts (empty: from ``ssh -G``).
        Refusals raise PrepareError (the form's problems), ValueError, OSError or RuntimeError."""
        if placement.kind == "slurm":
            return self.start_slurm(job, placement.slurm_target(), resumed_from=resumed_from)
        if placement.kind == "hosts":
            return self.start_multi(list(placement.hosts), job, main_ip=main_ip,
                                    cards={h.name: placement.cards_of(h.name) for h in placement.hosts})
        if placement.kind == "host":
            return self.start_remote(placement.host, job, resumed_from=resumed_from,
                                     cards=placement.cards_of(placement.host.name))
        self.start(job, resumed_from=resumed_from)
        return self.current

    def resume(self, job: TrainingJob) -> TrainingJob:
        """A new run that resumes the stopped ``job`` from its latest complete checkpoint, where it
        ran and on the cards it had (its checkpoint was made for them). ValueError when there is
        none. A run on this machine is resumed from its folder (``start`` with ``resumed_from``)."""
        from gaudi_gui.services.multi_host_training import MultiHostTrainingJob
        from gaudi_gui.services.remote_training import RemoteTrainingJob
        from gaudi_gui.services.slurm_training import SlurmTrainingJob
        if isinstance(job, RemoteTrainingJob):
            return self.resume_remote(job)
        if isinstance(job, SlurmTrainingJob):
            return self.resume_slurm(job)
        if isinstance(job, MultiHostTrainingJob):
            checkpoint = job.checkpoint()
            if not checkpoint or not job.job_dict:
                raise ValueError("the run reported no complete checkpoint to resume from")
            config = JobConfig.from_dict({**job.job_dict, "resume_from_checkpoint": checkpoint})
            return self.start_multi(list(job.hosts), config, cards=dict(job.cards))
        if job.run is None or job.run.latest_checkpoint() is None:
            raise ValueError("the run has no complete checkpoint to resume from")
        config = job.run.user_job()
        config.resume_from_checkpoint = "latest"
        self.start(config, resumed_from=str(job.run.folder))
        return self.current

    def start_remote(self, host: Host, job: JobConfig, *, resumed_from: str = "",
                     cards: Sequence[int] = ()) -> RemoteTrainingJob:
        """Start a run on ``host`` as the current job: the answer comes asynchronously (the job's
        ``run_identified``, or ``finished`` with "failed"). The host's own device is used (its
        gaudi-gui picks hpu > cuda > cpu) and ``cards`` of the host's cards (the host's selection in
        the Hosts tab, sent as ``train --cards``; empty: all of them); this machine's card
        selection does not apply."""
        if self.current.is_running():
            raise RuntimeError("a run is already going: stop it first")
        fresh = self._new_remote_job(host)
        fresh.start_remote(job, device="auto", resumed_from=resumed_from, cards=cards)
        self.settings.set("training/last_job", job.to_dict())
        self.jobs.append(fresh)
        self.current = fresh
        self.current_changed.emit(fresh)
        return fresh

    def resume_remote(self, job: RemoteTrainingJob) -> RemoteTrainingJob:
        """Start a run on ``job``'s host that resumes it from its checkpoint there (ValueError when
        the host reported none)."""
        checkpoint = job.checkpoint()
        if not checkpoint or not job.job_dict:
            raise ValueError(f"{job.name or 'the run'} on {job.host.name} has no complete checkpoint "
                             f"to resume from")
        config = JobConfig.from_dict({**job.job_dict, "resume_from_checkpoint": checkpoint})
        # On the cards the run had: its checkpoint's sharding and batch size were made for them.
        return self.start_remote(job.host, config, resumed_from=job.folder, cards=job.cards)

    def start_multi(self, hosts: list[Host], job: JobConfig, *, main_ip: str = "",
                    cards: Mapping[str, Sequence[int]] | None = None) -> MultiHostTrainingJob:
        """Start one run across ``hosts`` (machine rank = position) as the current job: a pre-flight
        on every host first, then each host's part; the outcome comes asynchronously. ``cards``:
        each host's cards by host name (a host not in it uses all of its cards)."""
        if self.current.is_running():
            raise RuntimeError("a run is already going: stop it first")
        fresh = self._new_multi_job(hosts)
        fresh.start_multi(job, main_ip=main_ip, device="auto", cards=cards)
        self.settings.set("training/last_job", job.to_dict())
        self.jobs.append(fresh)
        self.current = fresh
        self.current_changed.emit(fresh)
        return fresh

    def start_slurm(self, job: JobConfig, target: SlurmTarget, *, resumed_from: str = "") -> SlurmTrainingJob:
        """Submit ``job`` to Slurm (``target``: sbatch options and login host) as the current job,
        through a ``gaudi-gui train --slurm`` child; the outcome comes asynchronously."""
        if self.current.is_running():
            raise RuntimeError("a run is already going: stop it first")
        fresh = self._new_slurm_job()
        fresh.start_slurm(job, target, resumed_from=resumed_from)
        self.settings.set("training/last_job", job.to_dict())
        self.jobs.append(fresh)
        self.current = fresh
        self.current_changed.emit(fresh)
        return fresh

    def _new_slurm_job(self) -> SlurmTrainingJob:
        from gaudi_gui.services.slurm_training import SlurmTrainingJob
        job = SlurmTrainingJob(self.store, stop_grace_s=self._grace(), parent=self)
        job.status_changed.connect(self._on_state)
        job.finished.connect(self._on_job_finished)
        return job

    def resume_slurm(self, job: SlurmTrainingJob) -> SlurmTrainingJob:
        """Submit a new Slurm job that resumes ``job`` from its checkpoint, with the same Slurm
        options (ValueError when it has none)."""
        checkpoint = job.checkpoint()
        if not checkpoint or not job.job_dict or job.target is None:
            raise ValueError(f"{job.name or 'the Slurm run'} has no complete checkpoint to resume from")
        config = JobConfig.from_dict({**job.job_dict, "resume_from_checkpoint": checkpoint})
        return self.start_slurm(config, job.target, resumed_from=job.folder)

    def _new_multi_job(self, hosts: list[Host]) -> MultiHostTrainingJob:
        from gaudi_gui.services.multi_host_training import MultiHostTrainingJob
        job = MultiHostTrainingJob(hosts, self.store, stop_grace_s=self._grace(), parent=self)
        job.status_changed.connect(self._on_state)
        job.finished.connect(self._on_job_finished)
        job.run_identified.connect(lambda _folder: self._persist(self.running()))
        return job

    def _new_remote_job(self, host: Host) -> RemoteTrainingJob:
        from gaudi_gui.services.remote_training import RemoteTrainingJob
        job = RemoteTrainingJob(host, self.store, stop_grace_s=self._grace(), parent=self)
        job.status_changed.connect(self._on_state)
        job.finished.connect(self._on_job_finished)
        job.run_identified.connect(lambda _folder: self._persist(self.running()))
        return job

    def stop(self) -> None:
        """Stop the current run with a checkpoint; a second call while it stops kills it."""
        self.current.stop_grace_s = self._grace()
        self.current.stop()

    def kill(self) -> None:
        self.current.kill()

    # -- persistence ------------------------------------------------------------------------------

    def _persist(self, jobs: list[TrainingJob]) -> None:
        """The runs being followed, one record each in one format for every placement
        (``record_of``): followed again after a restart."""
        records = [r for r in (record_of(j) for j in dict.fromkeys(jobs)) if r is not None]
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
                    records.append({"placement": {"kind": "hosts"}, "parts": entry["hosts"],
                                    "job": entry.get("job"), "main_ip": entry.get("main_ip", ""),
                                    "port": entry.get("port", 0)})
                elif isinstance(entry, dict):
                    records.append({"placement": {"kind": "host"}, "parts": [entry]})
            self.settings.set("training/detached_runs", [])
            self.settings.set("training/remote_runs", [])
        return records

    def reattach(self) -> list[TrainingJob]:
        """Follow the runs still going: those this app left running, and any in the store whose
        processes are alive (started by ``gaudi-gui train``); stale ones are reconciled."""
        if self._reattached:
            return []
        self._reattached = True
        records = self._records()
        folders = [str(part.get("folder")) for r in records if (r.get("placement") or {}).get("kind") in
                   ("local", "slurm") for part in r.get("parts") or [] if isinstance(part, dict)
                   and part.get("folder")]
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
            if (run.folder / SLURM_INFO).is_file():
                # A Slurm job goes on without the app: followed again through the queue.
                from gaudi_gui.core.remote import HostError
                slurm_job = self._new_slurm_job()
                try:
                    slurm_job.follow_existing(run)
                except (ValueError, HostError, OSError):
                    delete_when_reaped(slurm_job)
                    continue
                self.jobs.append(slurm_job)
                found.append(slurm_job)
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
        remote_found = self._reattach_remote(records)
        if found or remote_found:
            self.current = (found or remote_found)[-1]
            self.current_changed.emit(self.current)
        self._persist(found + remote_found)
        return found + remote_found

    def _reattach_remote(self, records: list[dict[str, Any]]) -> list[TrainingJob]:
        """Follow again the runs this app left going on SSH hosts (a run that ended meanwhile is
        followed to its end at once, so its outcome is shown)."""
        from gaudi_gui.core.remote import Host, HostError
        found: list[TrainingJob] = []
        for record in records:
            kind = (record.get("placement") or {}).get("kind")
            parts = [p for p in record.get("parts") or [] if isinstance(p, dict)]
            if kind == "hosts":
                multi = self._reattach_multi({**record, "hosts": parts})
                if multi is not None:
                    self.jobs.append(multi)
                    found.append(multi)
                continue
            if kind != "host" or len(parts) != 1 or not parts[0].get("folder"):
                continue
            entry = parts[0]
            try:
                host = Host.parse(str(entry.get("host", "")), str(entry.get("remote_command", "") or ""))
            except HostError:
                continue
            if host.is_local:
                continue
            job = self._new_remote_job(host)
            job_dict = entry.get("job")
            job.follow_existing(str(entry["folder"]), name=str(entry.get("name", "") or ""),
                                job=job_dict if isinstance(job_dict, dict) else None,
                                resumed_from=str(entry.get("resumed_from", "") or ""),
                                cards=entry.get("cards") or ())
            self.jobs.append(job)
            found.append(job)
        return found

    def _reattach_multi(self, entry: dict[str, Any]) -> TrainingJob | None:
        """A multi-host run left going: every host's part followed again."""
        from gaudi_gui.core.remote import Host, HostError
        parts = [p for p in entry["hosts"] if isinstance(p, dict) and p.get("folder")]
        try:
            hosts = [Host.parse(str(p.get("host", "")), str(p.get("remote_command", "") or ""))
                     for p in parts]
        except HostError:
            return None
        if len(hosts) < 2 or len(parts) != len(entry["hosts"]):
            return None
        job = self._new_multi_job(hosts)
        job_dict = entry.get("job")
        job.follow_existing(parts, job=job_dict if isinstance(job_dict, dict) else None,
                            main_ip=str(entry.get("main_ip", "") or ""), port=int(entry.get("port") or 0))
        return job

    # -- JobOwner ---------------------------------------------------------------------------------

    def active_jobs(self) -> list[str]:
        return [j.describe() for j in self.running()]

    def stop_jobs(self) -> None:
        for job in self.running():
            if not job.stopping:
                job.stop()

    def detach_jobs(self) -> list[str]:
        running = [j for j in self.running() if j.run is not None]
        remote_jobs = [j for j in self.running() if _is_remote(j)]
        # Remembered before the followers close: they are followed again at the next start.
        self._persist(self.running())
        for job in running:
            job.detach()
        for job in remote_jobs:
            job.detach()
        return [str(j.run.folder) for j in running if j.run is not None] + [
            f"{j.host.name}:{j.folder}" for j in remote_jobs]

    def shutdown(self) -> None:
        for job in dict.fromkeys([self.current, *self.jobs]):
            job.shutdown()


#: The runs being followed, one record per run in the same format for every placement.
FOLLOWED_KEY = "training/followed_runs"


def record_of(job: TrainingJob) -> dict[str, Any] | None:
    """What is kept to follow ``job`` again after a restart, the same for every placement:
    ``{"placement": Placement.to_record(), "parts": [{"host", "folder", "name", ...} per host],
    "job", "main_ip", "port"}``; None while there is nothing to follow yet (no run folder)."""
    from gaudi_gui.core.placement import Placement
    multi = sys.modules.get("gaudi_gui.services.multi_host_training")
    remote = sys.modules.get("gaudi_gui.services.remote_training")
    slurm = sys.modules.get("gaudi_gui.services.slurm_training")
    if multi is not None and isinstance(job, multi.MultiHostTrainingJob):
        parts = [p.to_entry() for p in job.parts]
        if not job.parts or not all(p["folder"] for p in parts):
            return None
        return {"placement": Placement.on_hosts(job.hosts, job.cards).to_record(), "parts": parts,
                "job": job.job_dict, "main_ip": job.main_ip, "port": job.port}
    if remote is not None and isinstance(job, remote.RemoteTrainingJob):
        if not job.folder or not getattr(job, "reattachable", True):
            return None
        return {"placement": Placement.on_host(job.host, job.cards).to_record(), "parts": [job.to_entry()],
                "job": job.job_dict}
    if slurm is not None and isinstance(job, slurm.SlurmTrainingJob):
        if not job.folder:
            return None
        target = job.target.to_record() if job.target is not None else {}
        return {"placement": Placement.on_slurm(target).to_record(),
                "parts": [{"host": "local", "folder": job.folder, "name": job.name}], "job": job.job_dict}
    if job.run is None:
        return None
    return {"placement": Placement.local().to_record(),
            "parts": [{"host": "local", "folder": str(job.run.folder), "name": job.run.name}]}


def _is_remote(job: object) -> TypeGuard[RemoteTrainingJob]:
    # No import of the remote module for a check: a local-only session never loads it.
    return bool(getattr(job, "is_remote", False))


__all__ = ["TrainingService"]

"""A training run submitted to Slurm, as the Training tab sees it: the same signals as a local
``TrainingJob``, fed by a ``gaudi-gui train --slurm`` child and the run folder it makes.

The child does the Slurm work (``commands/slurm_run.py``): it prepares the run folder (on the file
system the login host and the nodes share), writes the sbatch script, submits it on this machine or
on a login host over SSH, and follows the job with squeue / scontrol / sacct, printing the job's log
lines on stdout and its notes (``job N: pending``, ``job N: running on NODE``, the outcome) on
stderr. The job goes to it on stdin (``--config -``), never through a shell. Its first stdout lines
say ``submitted batch job N`` and ``run folder: PATH (…)``: from then on the run's events.jsonl is
followed here with the ``EventFollower`` a local run uses (metrics, progress, checkpoints).

Stop is SIGINT to the child, which asks the job to stop with a checkpoint (``scancel --batch
--signal=USR1``); a second Stop is SIGINT again, which cancels the job at once. A Stop pressed before
the job was submitted is sent as soon as it is (the child counts signals only from sbatch on). The
final state and summary are those the child wrote to the run's status (``core.outcome``), else its
exit. When the app exits while the job runs, the child is ended without a signal it would act on
(SIGKILL): the job goes on in Slurm.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import sys
from collections import deque
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core import protocol
from gaudi_gui.core import slurm as slurm_mod
from gaudi_gui.core.events import EventFollower
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.remote import LOCAL, Host
from gaudi_gui.core.runstore import Run, RunStore
from gaudi_gui.core.secrets import redact
from gaudi_gui.core.slurm import SlurmTarget, target_with_grace
from gaudi_gui.services.process import EXIT_FAILED_TO_START, ProcessRunner, describe_exit
from gaudi_gui.services.remote_training import HostedJob
from gaudi_gui.services.training_job import FOLLOW_MS


class SlurmTrainingJob(HostedJob):
    """One run submitted to Slurm and followed by a ``gaudi-gui train --slurm`` child.

    ``run`` stays None (the child owns the run's status file); ``slurm_run`` is the run folder once
    the child has made it."""

    #: The child made the run folder: carries its path.
    run_identified = Signal(str)

    def __init__(self, store: RunStore | None = None, *, stop_grace_s: float = 120.0,
                 parent: QObject | None = None) -> None:
        super().__init__(store, stop_grace_s=stop_grace_s, parent=parent)
        self.target: SlurmTarget | None = None
        self.host = Host.local()
        self.job_id = ""
        self.folder = ""
        self.name = ""
        self.slurm_run: Run | None = None
        #: The job as submitted (what a Resume submits again, with the checkpoint to resume from).
        self.job_dict: dict[str, Any] = {}
        #: The run this one resumes ("" for a fresh run).
        self.resumed_from = ""
        #: Slurm's word for the job ("pending", "running on NODE", …) from the child's notes.
        self.slurm_phase = ""
        self._err_tail: deque[str] = deque(maxlen=30)
        self._stop_pending = 0
        self._child = ProcessRunner(self, parse_protocol=False, tail_lines=60)
        self._child.started.connect(self._on_child_started)
        self._child.line_received.connect(self._on_child_line)
        self._child.finished.connect(self._on_child_finished)
        self._follow.timeout.disconnect(self._poll)
        self._follow.timeout.connect(self._poll_events)
        self._follow.setInterval(FOLLOW_MS)

    # -- state ------------------------------------------------------------------------------------

    # is_remote (HostedJob): the ranks are on the cluster's nodes, so this machine's cards and their
    # chart do not apply.
    #: Not in the remote runs the service remembers: after a restart a Slurm run is found in the run
    #: store (its slurm.json) and followed again with ``follow_existing``.
    reattachable = False

    def describe(self) -> str:
        job = f"Slurm job {self.job_id}" if self.job_id else "Slurm job (submitting)"
        return f"training run {self.name or '…'} as {job} ({self.state}, step {self.progress.step}/" \
               f"{self.progress.max_steps})"

    def checkpoint(self) -> str:
        """The run's latest complete checkpoint (its status's, else the newest on disk), or ""."""
        if self.slurm_run is None:
            return ""
        with contextlib.suppress(OSError, ValueError):
            recorded = self.slurm_run.status().checkpoint
            if recorded:
                return recorded
        with contextlib.suppress(OSError, ValueError):
            latest = self.slurm_run.latest_checkpoint()
            if latest is not None:
                return str(latest)
        return ""

    # -- starting ---------------------------------------------------------------------------------

    def start_slurm(self, job: JobConfig, target: SlurmTarget, *, resumed_from: str = "") -> None:
        """Submit ``job`` through a ``train --slurm`` child; the outcome comes asynchronously
        (``run_identified``, state changes, ``finished``)."""
        if self.is_running():
            raise RuntimeError("this job is already running")
        self._reset()
        self.job, self.job_dict, self.target = job, job.to_dict(), target
        self.resumed_from = resumed_from
        self.host = Host.local() if target.login in ("", LOCAL) else Host.parse(target.login)
        self._active = True
        argv = [sys.executable, "-m", "gaudi_gui",
                *target.argv(runs_dir=self.store.root, grace_s=self.stop_grace_s, resumed_from=resumed_from),
                "--events"]
        self._set_state("queued")
        where = "" if self.host.is_local else f" on {self.host.name}"
        self._set_summary(f"submitting the job to Slurm{where}…")
        # Its own session: a Ctrl-C in the terminal that started the app must not stop the job.
        if self._child.start(argv[0], argv[1:], stdin_open=True, new_session=True):
            self._child.write_line(json.dumps(self.job_dict))
            self._child.close_stdin()

    def follow_existing(self, run: Run) -> None:
        """Follow again a job submitted earlier (the app was closed while it ran): a ``gaudi-gui runs
        attach`` child reads its log and events from the start, and Stop, Kill now and Resume work
        as for a job submitted here (the options come from the run's slurm.json). ValueError when
        the folder is not a Slurm run."""
        if self.is_running():
            raise RuntimeError("this job is already running")
        info = slurm_mod.read_info(run)
        self._reset()
        login = str(info.get("login") or LOCAL)
        self.target = SlurmTarget(slurm_mod.options_of(info), login)
        self.host = Host.local() if login == LOCAL else Host.parse(login)
        with contextlib.suppress(Exception):
            job = run.user_job()  # as submitted (config.json is the job as the nodes run it)
            self.job, self.job_dict = job, job.to_dict()
        with contextlib.suppress(OSError, ValueError):
            self.resumed_from = run.status().resumed_from or ""
        self._active = True
        self._set_state("queued")
        self._set_summary(f"following Slurm job {info.get('job_id')} again…")
        argv = [sys.executable, "-m", "gaudi_gui", "runs", "attach", str(run.folder),
                "--grace", repr(float(self.stop_grace_s)), "--events"]
        self._child.start(argv[0], argv[1:], new_session=True)

    def _reset(self) -> None:
        super()._reset()
        self.job_id = self.folder = self.name = self.slurm_phase = ""
        self.slurm_run = None
        self._follower = None
        self._stop_sent = self._stop_pending = 0
        self._err_tail.clear()
        self._active = False

    # -- the child's output -----------------------------------------------------------------------

    def _on_child_started(self, pid: int) -> None:
        # After the tab has bound this job (the start returns first): the line is seen.
        given = " < job.json" if "--config" in self._child.argv else ""
        self.log_line_received.emit("[gaudi-gui] " + shlex.join(self._child.argv) + given)
        self.started.emit(pid)

    def _on_child_line(self, stream: str, line: str) -> None:
        message = protocol.decode(line) if stream == "stdout" else None
        if message is not None:
            # The child's structured lines (``--events``): what the job is, never read from its words.
            self._take_message(message)
            return
        text = redact(line)
        self.log_line_received.emit(text)
        if stream == "stderr":
            self._err_tail.append(text)
        self._poll_events()

    def _take_message(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "slurm_submitted" and not self.job_id:
            self.job_id = str(message.get("job_id") or "?")
            self._set_summary(f"Slurm job {self.job_id} submitted")
            if self._stop_pending:
                # Stop was pressed while sbatch ran: the child counts signals now.
                for _ in range(self._stop_pending):
                    self._signal_child()
        elif kind == "slurm_run_folder" and not self.folder and message.get("folder"):
            self._identify(str(message["folder"]))
        elif kind == "slurm_state":
            self._take_state(str(message.get("phase") or ""), str(message.get("state") or ""),
                             str(message.get("reason") or ""), str(message.get("nodes") or ""))
        self._poll_events()

    def _identify(self, folder: str) -> None:
        self.folder = folder
        self.name = Path(folder).name
        self.slurm_run = Run(folder)
        self._follower = EventFollower(self.slurm_run.events_path)
        self._follow.start()
        self.run_identified.emit(folder)

    def _take_state(self, phase: str, state: str, reason: str, nodes: str) -> None:
        """The job's Slurm state as the run's state and summary."""
        word = (f"pending ({reason})" if reason else "pending") if phase == "pending" else \
            f"running on {nodes or '?'}" if phase == "running" else state.lower()
        self.slurm_phase = word
        if self._stop_sent:
            self._set_summary(f"Slurm job {self.job_id} {word}; stopping…")
        elif phase == "pending":
            self._set_state("queued")
            self._set_summary(f"Slurm job {self.job_id} {word}")
        elif phase == "running":
            self._set_state("running")
            self._set_summary(f"Slurm job {self.job_id} {word}")
        else:
            self._set_summary(f"Slurm job {self.job_id}: {word}")

    def _take_event(self, event: dict[str, Any]) -> None:
        super()._take_event(event)
        if event.get("type") == "metrics" and not self._stop_sent and self.records:
            # The status line: where the job runs and how far it is.
            where = self.slurm_phase if self.slurm_phase.startswith("running") else "running"
            self._set_summary(f"Slurm job {self.job_id} {where}: step {self.progress.step} of "
                              f"{self.progress.max_steps}")

    # -- stopping ---------------------------------------------------------------------------------

    def stop(self, grace_s: float | None = None) -> None:
        """Stop with a checkpoint (SIGINT to the child); pressed again while stopping: cancel now."""
        if not self.is_running() or self._stop_sent >= 2:
            return
        self._stop_sent += 1
        first = self._stop_sent == 1
        if first:
            self._set_state("stopping")
            self._set_summary("stopping: the job saves a checkpoint at the end of its current step…"
                              if self.job_id else "stopping: the job is cancelled once submitted")
        else:
            self._set_summary(f"cancelling Slurm job {self.job_id or '(submitting)'} now (no checkpoint)")
        self.log_line_received.emit(
            "[gaudi-gui] stop: " + ("scancel --batch --signal=USR1: the ranks save a checkpoint, then end "
                                   "(press Kill now to cancel the job at once)" if first
                                   else "cancelling the job now"))
        if self.job_id:
            self._signal_child()
        else:
            self._stop_pending += 1

    def kill(self, reason: str = "request") -> None:
        """Cancel the job now (the child's second SIGINT)."""
        while self.is_running() and self._stop_sent < 2:
            self.stop()

    def _signal_child(self) -> None:
        pid = self._child.pid
        if pid > 0 and self._child.is_running():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGINT)

    # -- the end ----------------------------------------------------------------------------------

    def _on_child_finished(self, code: int, status: str) -> None:
        self._poll_events()
        tail = list(self._err_tail)
        if self._ended or not self._active:
            return
        result: dict[str, Any] = {}
        if self.slurm_run is not None:
            with contextlib.suppress(OSError, ValueError):
                st = self.slurm_run.status()
                if st.state not in ("queued", "running", "stopping") and st.summary:
                    result = {"state": st.state, "summary": st.summary}
        if not result:
            last = next((ln for ln in reversed(tail) if ln.strip()), "")
            why = "failed to start" if status == EXIT_FAILED_TO_START else describe_exit(code, status)
            if self._stop_sent and not self.job_id:
                result = {"state": "stopped", "summary": "Stopped before the job was submitted"}
            else:
                result = {"state": "failed",
                          "summary": f"Failed: gaudi-gui train --slurm {why}" + (f": {last}" if last else "")}
        self._ended = True
        self._follow.stop()
        state = str(result["state"])
        self._set_summary(str(result["summary"]))
        self._set_state(state)
        self.finished.emit(code, state, tail)

    def detach(self) -> None:
        """Stop following (the app exits): the job goes on in Slurm (``scancel JOB`` ends it)."""
        self._close_child()

    def shutdown(self) -> None:
        self._close_child()

    def _close_child(self) -> None:
        self._follow.stop()
        for timer in (self._tick, self._kill_timer):
            timer.stop()
        self._active = False
        if self._child.is_running():
            # SIGKILL, not SIGTERM: the child would take SIGTERM for a stop of the job.
            self._child.kill_tree()
            if self.job_id:
                self.log_line_received.emit(f"[gaudi-gui] Slurm job {self.job_id} goes on without the app; "
                                            f"scancel {self.job_id} ends it")


__all__ = ["SlurmTarget", "SlurmTrainingJob", "target_with_grace"]

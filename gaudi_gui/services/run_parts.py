"""The parts a run is followed through: what ``TrainingJob`` composes, one part per place.

Every placement runs a supervisor of the run: ``gaudi-gui train --config FILE --detach --json``
(``core.supervisor``: stop with a checkpoint, grace, kill-now, step writes, waiting for killed ranks,
leftovers, outcome), or for Slurm ``train --slurm … --detach --json`` (``commands/slurm_run``: it
submits the job, follows the queue and writes the outcome; SIGTERM is ``scancel --batch
--signal=USR1``, a checkpoint, kill now cancels). An ``AgentPart`` asks the agent of its place to start
it (``job.start`` of kind ``train``, the job the Training tab saves as its ``config``): this machine's
agent for this machine (the identity host) and for Slurm (the run folder is on the file system this
machine shares with the nodes), a host's agent through this machine's agent and its one ssh session to
the host. The window holds no process for it: the part follows the agent's job
(``services.agent_job.JobFollow``: its events, log and record replayed from the start, then live) and
stops it with ``job.stop`` (a second Stop kills now). A dropped connection (this machine's agent, or its
link to a host) is a state ("reconnecting"), never a dialog: the run goes on meanwhile, and what comes
again after it is back is what was not seen yet. The final state, summary, checkpoint and meter
summary are the supervisor's, as the agent's record of the job carries them.

Every command is a list of words: nothing a user typed reaches a shell as code (a host's agent is
reached over ssh with each word quoted for its shell).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, Signal

from gaudi_gui.core import slurm as slurm_mod
from gaudi_gui.core import visibility
from gaudi_gui.core.remote import LOCAL, Host
from gaudi_gui.core.runstore import Run
from gaudi_gui.core.slurm import SlurmTarget
from gaudi_gui.services.agent_child import shared_client
from gaudi_gui.services.agent_job import JobFollow

if TYPE_CHECKING:
    from gaudi_gui.services.agent_client import AgentClient

#: Connection states (``connection_changed``).
CONNECTING = "connecting"
FOLLOWING = "following"
RECONNECTING = "reconnecting"
CLOSED = "closed"


class AgentPart(QObject):
    """A run under ``gaudi-gui train [--slurm] --detach`` that the agent of ``host`` (this machine
    included) started and watches; followed through the agent: started here, or followed again after
    a restart. ``slurm``: the run is that Slurm target's job (this machine's agent supervises it)."""

    #: A console line of the run, or a line of this app about it ("[gaudi-gui] …").
    line_received = Signal(str)
    #: A worker event (metrics, phase, checkpoint_saving, error, …) as the run wrote it.
    event_received = Signal(dict)
    #: A sentence about the part that is no event (reconnecting, a refused stop).
    note_changed = Signal(str)
    #: The connection to the run changed: (connecting / following / reconnecting / closed, a line).
    connection_changed = Signal(str, str)
    #: The supervisor created the run folder: carries its path (on the host).
    identified = Signal(str)
    #: A stop could not be sent (now: the kill): the next press sends it again.
    stop_failed = Signal(bool, str)
    #: The run ended: (exit code, final state, summary, last lines).
    ended = Signal(int, str, str, list)
    #: The part's run meter summary (its supervisor's meter-summary.json, in the agent's last record
    #: of the job); None until then, or when the part has none (a Slurm run: the nodes run no meter yet).
    meter: dict[str, Any] | None = None
    #: Slurm's word for the job changed: ("queued" or "running", "pending" / "running on the cluster").
    slurm_state_changed = Signal(str, str)

    def __init__(self, host: Host, *, grace_s: float, runs_dir: str = "", slurm: SlurmTarget | None = None,
                 client: Callable[[], AgentClient] = shared_client, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self.slurm = slurm
        #: The Slurm job's id ("" elsewhere, or until sbatch took it) and Slurm's word for it.
        self.slurm_job_id = ""
        self.slurm_phase = ""
        self.grace_s = grace_s
        #: The run store on this machine (a host's agent uses the host's own).
        self.runs_dir = runs_dir
        #: The run folder (a path on the host; "" until the agent answered) and its name (the job id).
        self.folder = ""
        self.name = ""
        #: The supervisor's pid (on the host), 0 until known (and after a restart).
        self.pid = 0
        #: The host's cards this run was started on (``train --cards``); empty: the default.
        self.cards: list[int] = []
        #: The agent's last record of the job (state, step, summary, checkpoint, meter …).
        self.remote_status: dict[str, Any] = {}
        self.connection = CLOSED
        self._ended = False
        self.job = JobFollow(client, self)
        self.job.started.connect(self._on_started)
        self.job.refused.connect(self._on_refused)
        self.job.event_received.connect(self._on_event)
        self.job.line_received.connect(self._on_line)
        self.job.record_changed.connect(self._on_record)
        self.job.ended.connect(self._on_ended)
        self.job.link_changed.connect(self._on_link)
        self.job.stop_failed.connect(self._on_stop_failed)
        self.job.missing.connect(self._on_missing)

    @property
    def where(self) -> str:
        """" on HOST", or "" on this machine (for sentences)."""
        return "" if self.host.is_local else f" on {self.host.name}"

    @property
    def stop_sent(self) -> int:
        """0: no stop asked, 1: stop with a checkpoint, 2: kill now."""
        return self.job.stop_sent

    def is_running(self) -> bool:
        return self.job.running and not self._ended

    def checkpoint(self) -> str:
        """The latest complete checkpoint the supervisor reported (a path on the host), or ""."""
        return str(self.remote_status.get("checkpoint") or "")

    def to_entry(self) -> dict[str, Any]:
        """What is kept to follow this part again after a restart."""
        return {"host": self.host.name, "remote_command": self.host.remote_command, "folder": self.folder,
                "name": self.name, "cards": list(self.cards)}

    def _set_connection(self, state: str, message: str = "") -> None:
        self.connection = state
        self.connection_changed.emit(state, message)

    def _following(self) -> None:
        if self.connection in (CONNECTING, RECONNECTING) and not self._ended:
            self._set_connection(FOLLOWING, f"following {self.name}{self.where}")

    # -- starting ---------------------------------------------------------------------------------

    def start(self, job: dict[str, Any], *, device: str = "auto", resumed_from: str = "",
              cards: Sequence[int] = (), gated: bool = False) -> None:
        """Ask the place's agent to start ``job``; the answer (``identified``) or the refusal (``ended``
        with "failed") comes back asynchronously. ``gated``: the app's start gate checked these cards
        already, so the command does not check them again (the gate runs once a start)."""
        self.cards = sorted(set(cards))
        if self.slurm is not None:
            # The nodes pick their device and cards, each node checks its own: ``gated`` does not apply.
            words = self.slurm.words(grace_s=self.grace_s, resumed_from=resumed_from)
        else:
            words = ["--device", device, "--grace", repr(float(self.grace_s)),
                     *visibility.cards_argv(self.cards), *(["--no-preflight"] if gated else []),
                     *(["--resumed-from", resumed_from] if resumed_from else [])]
        self._set_connection(CONNECTING, "submitting the job to Slurm…" if self.slurm is not None
                             else f"starting the job{self.where}…")
        if self.host.is_local:
            # The run reads the window's relative paths and variables (HF_HOME, a token's …).
            self.job.start("train", words, config=job, origin="gui", runs_dir=self.runs_dir, cwd=os.getcwd(),
                           env=dict(os.environ))
        else:
            self.job.start("train", words, host=self.host.name, config=job, origin="gui")

    def _on_started(self, record: dict[str, Any]) -> None:
        self.folder = str(record.get("folder") or "")
        self.name = str(record.get("name") or self.folder.rstrip("/").rsplit("/", 1)[-1])
        self.pid = int(record.get("pid") or 0)
        self.remote_status = dict(record)
        self._slurm_record(record)
        if self.slurm_job_id:
            self.line_received.emit(f"[gaudi-gui] submitted batch job {self.slurm_job_id}; run folder: "
                                    f"{self.folder} (supervisor pid {self.pid}; the job goes on if the app "
                                    f"ends: gaudi-gui runs stop {self.name}, or scancel {self.slurm_job_id})")
            self._following()
            self.identified.emit(self.folder)
            return
        device = record.get("device") or "as asked"
        self.line_received.emit(f"[gaudi-gui] run folder{self.where}: {self.folder} (device {device}, "
                                f"supervisor pid {self.pid}; it goes on if the app"
                                f"{'' if self.host.is_local else ' or the connection'} ends)")
        self._following()
        self.identified.emit(self.folder)

    def _on_refused(self, words: str) -> None:
        self.line_received.emit(f"[gaudi-gui] the run did not start{self.where}: {words}")
        self._finish(self.job.refused_code or 1, "failed", f"Failed: {words}")

    def follow(self, folder: str, *, name: str = "", cards: Any = ()) -> None:
        """Follow a run started before (after a restart) from its beginning, so the curve and log are
        whole again: the agent finds it by its job id (the run folder's name) in its stores.
        ``cards``: what ``to_entry`` recorded (anything but a list of non-negative ints is taken as none)."""
        self.cards = sorted({c for c in cards if isinstance(c, int) and c >= 0}) \
            if isinstance(cards, (list, tuple)) else []
        self.folder, self.name = folder, name or folder.rstrip("/").rsplit("/", 1)[-1]
        self._set_connection(CONNECTING, f"connecting to {self.host.label}…")
        if self.host.is_local and self.runs_dir:
            # The agent looks the job up in the stores it knows: this one is named first.
            self.job.client().request("jobs.list", None, runs_dir=self.runs_dir)
        self.job.follow({"job_id": self.name, "folder": folder, "kind": "train"},
                        "" if self.host.is_local else self.host.name)

    # -- following --------------------------------------------------------------------------------

    def _on_event(self, event: dict[str, Any]) -> None:
        self._following()
        self.event_received.emit(event)

    def _on_line(self, line: str) -> None:
        self._following()
        self.line_received.emit(line)

    def _on_record(self, record: dict[str, Any]) -> None:
        self._following()
        self.remote_status = dict(record)
        self._slurm_record(record)

    def _slurm_record(self, record: dict[str, Any]) -> None:
        """A Slurm job's id, and its state (queued: pending, running) as its supervisor writes it."""
        if self.slurm is None:
            return
        self.slurm_job_id = str(record.get("slurm_job_id") or self.slurm_job_id)
        state = str(record.get("state") or "")
        word = {"queued": "pending", "running": "running on the cluster"}.get(state, "")
        if word and word != self.slurm_phase and self.slurm_job_id and not self._ended:
            self.slurm_phase = word
            self.slurm_state_changed.emit(state, word)

    def _on_missing(self, words: str) -> None:
        """The place's agent has no such run (a record kept across a restart whose folder was deleted
        since): said, and the part ends, rather than "re-attaching…" for ever with nothing coming."""
        said = f"{words}{f' (on {self.host.name})' if self.where else ''}"
        self.line_received.emit(f"[gaudi-gui] {said}")
        self._finish(1, "failed", f"Not followed: {said}")

    def _on_link(self, state: str, words: str) -> None:
        if self._ended:
            return
        if state == "up":
            self._set_connection(FOLLOWING, words)
            return
        again = "" if "reconnecting" in words else " — reconnecting"
        message = f"{words}{again} (the run goes on{self.where})"
        self._set_connection(RECONNECTING, message)
        self.note_changed.emit(message)
        self.line_received.emit(f"[gaudi-gui] {message}")

    # -- stopping ---------------------------------------------------------------------------------

    def stop(self) -> None:
        """``job.stop``: the supervisor stops the ranks with a checkpoint at the end of their step."""
        if self.is_running() and not self.stop_sent:
            self.job.stop()

    def kill(self) -> None:
        """``job.stop`` now: the supervisor kills the run's processes (no checkpoint)."""
        if self.is_running():
            self.job.kill()

    def _on_stop_failed(self, now: bool, words: str) -> None:
        if not self._ended:
            self.stop_failed.emit(now, f"{'kill' if now else 'stop'}{self.where} failed: {words}")

    # -- the end ----------------------------------------------------------------------------------

    def _on_ended(self, state: str, summary: str) -> None:
        self.meter = self.remote_status.get("meter") if isinstance(self.remote_status.get("meter"), dict) \
            else None
        code = self.remote_status.get("exit_code")
        self._finish(code if isinstance(code, int) else 1, state, summary + (f" (on {self.host.name})"
                                                                             if self.where else ""))

    def _finish(self, code: int, state: str, summary: str) -> None:
        if self._ended:
            return
        self._ended = True
        self.job.detach()
        self._set_connection(CLOSED, "")
        # The supervisor decided how the run ended; the code says only "went well" or not.
        self.ended.emit(0 if state in ("finished", "stopped") else (code or 1), state, summary, [])

    def detach(self) -> None:
        """Stop following (the app exits): the run goes on, the agent's, followed again next time."""
        if self.slurm_job_id and self.is_running():
            self.line_received.emit(f"[gaudi-gui] Slurm job {self.slurm_job_id} goes on without the app; "
                                    f"gaudi-gui runs stop {self.name} or scancel {self.slurm_job_id} ends it")
        self.job.detach()

    def shutdown(self) -> None:
        self.detach()


def slurm_target_of(run: Run) -> SlurmTarget:
    """The Slurm target a run's slurm.json recorded (ValueError when it is not a Slurm run)."""
    info = slurm_mod.read_info(run)
    return SlurmTarget(slurm_mod.options_of(info), str(info.get("login") or LOCAL))


__all__ = ["CLOSED", "CONNECTING", "FOLLOWING", "RECONNECTING", "AgentPart", "slurm_target_of"]

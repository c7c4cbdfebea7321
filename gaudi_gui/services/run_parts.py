"""The parts a run is followed through: what ``TrainingJob`` composes, one part per place.

Every placement but Slurm runs the same supervisor: ``gaudi-gui train --config FILE --detach --json``
(``core.supervisor``: stop with a checkpoint, grace, kill-now, step writes, waiting for killed ranks,
leftovers, outcome). An ``AgentPart`` asks the agent of its place to start it (``job.start`` of kind
``train``, the job the Training tab saves as its ``config``): this machine's agent for this machine (the
identity host), a host's agent through this machine's agent and its one ssh session to the host. The
window holds no process for it: the part follows the agent's job (``services.agent_job.JobFollow``: its
events, log and record replayed from the start, then live) and stops it with ``job.stop`` (a second
Stop kills now). A dropped connection (this machine's agent, or its link to a host) is a state
("reconnecting"), never a dialog: the run goes on meanwhile, and what comes again after it is back is
what was not seen yet. The final state, summary, checkpoint and meter summary are the supervisor's, as
the agent's record of the job carries them.

A ``SlurmPart`` follows a ``gaudi-gui train --slurm --events`` child instead (the job runs on the
cluster's nodes; the child submits it and follows the queue): its structured lines say what Slurm
does, the run's events.jsonl (on the shared file system) says what the ranks do. Stop is SIGINT to
the child (``scancel --batch --signal=USR1``: a checkpoint), a second SIGINT cancels the job.

Both kinds give the job the same signals and the same few words (``start``/``follow``, ``stop``,
``kill``, ``detach``, ``shutdown``, ``is_running``, ``folder``, ``checkpoint``, ``to_entry``); the
job never asks which kind a part is. Every command is a list of words: nothing a user typed reaches a
shell as code (a host's agent is reached over ssh with each word quoted for its shell).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import signal
import sys
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.core import protocol, visibility
from gaudi_gui.core import slurm as slurm_mod
from gaudi_gui.core.events import EventFollower
from gaudi_gui.core.remote import LOCAL, Host
from gaudi_gui.core.runstore import Run
from gaudi_gui.core.secrets import redact
from gaudi_gui.core.slurm import SlurmTarget
from gaudi_gui.services.agent_child import shared_client
from gaudi_gui.services.agent_job import JobFollow
from gaudi_gui.services.process import EXIT_FAILED_TO_START, ProcessRunner, describe_exit

if TYPE_CHECKING:
    from gaudi_gui.services.agent_client import AgentClient

#: Connection states (``connection_changed``).
CONNECTING = "connecting"
FOLLOWING = "following"
RECONNECTING = "reconnecting"
CLOSED = "closed"
#: How often a Slurm run's event file is read (also at once whenever the child prints a line).
FOLLOW_MS = 250


class PartSignals(QObject):
    """What every part of a run tells its job (the signals only: each part is its own class)."""

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
    #: of the job); None until then, or when the part has none (a Slurm part: the nodes run no meter yet).
    meter: dict[str, Any] | None = None


class AgentPart(PartSignals):
    """A run under ``gaudi-gui train --detach`` that the agent of ``host`` (this machine included)
    started and watches; followed through the agent: started here, or followed again after a restart."""

    def __init__(self, host: Host, *, grace_s: float, runs_dir: str = "",
                 client: Callable[[], AgentClient] = shared_client, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.host = host
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
        words = ["--device", device, "--grace", repr(float(self.grace_s)), *visibility.cards_argv(self.cards),
                 *(["--no-preflight"] if gated else []), *(["--resumed-from", resumed_from] if resumed_from
                                                           else [])]
        self._set_connection(CONNECTING, f"starting the job{self.where}…")
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
        device = record.get("device") or "as asked"
        self.line_received.emit(f"[gaudi-gui] run folder{self.where}: {self.folder} (device {device}, "
                                f"supervisor pid {self.pid}; it goes on if the app"
                                f"{'' if self.host.is_local else ' or the connection'} ends)")
        self._following()
        self.identified.emit(self.folder)

    def _on_refused(self, words: str) -> None:
        self.line_received.emit(f"[gaudi-gui] the run did not start{self.where}: {words}")
        self._finish(1, "failed", f"Failed: {words}")

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

    def _on_link(self, state: str, words: str) -> None:
        if self._ended:
            return
        if state == "up":
            self._set_connection(FOLLOWING, words)
            return
        message = f"{words} — reconnecting (the run goes on{self.where})"
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
        self.job.detach()

    def shutdown(self) -> None:
        self.detach()


class SlurmPart(PartSignals):
    """A run submitted to Slurm and followed by a ``gaudi-gui train --slurm --events`` child (or a
    ``runs attach`` child for a job submitted before a restart). The run folder is on the file
    system this machine shares with the nodes."""

    #: Slurm's word for the job changed: ("queued" or "running", "pending (Resources)" / "running on NODE" …).
    slurm_state_changed = Signal(str, str)

    def __init__(self, target: SlurmTarget, *, grace_s: float, runs_dir: str,
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.target = target
        self.grace_s = grace_s
        self.runs_dir = runs_dir
        self.host = Host.local() if target.login in ("", LOCAL) else Host.parse(target.login)
        self.job_id = ""
        self.folder = ""
        self.name = ""
        self.pid = 0
        self.cards: list[int] = []
        self.connection = CLOSED
        #: Slurm's word for the job ("pending", "running on NODE", …) from the child's structured lines.
        self.slurm_phase = ""
        self.stop_sent = 0
        self.run: Run | None = None
        self._status: dict[str, Any] = {}
        self._status_key: tuple[int, int] | None = None
        self._stop_pending = 0
        self._active = False
        self._ended = False
        self._err_tail: deque[str] = deque(maxlen=30)
        self._events: EventFollower | None = None
        self._child = ProcessRunner(self, parse_protocol=False, tail_lines=60)
        self._child.started.connect(self._on_child_started)
        self._child.line_received.connect(self._on_child_line)
        self._child.finished.connect(self._on_child_finished)
        self._follow = QTimer(self)
        self._follow.setInterval(FOLLOW_MS)
        self._follow.timeout.connect(self._poll_events)

    @property
    def remote_status(self) -> dict[str, Any]:
        """The run's status.json, read again only when the file changed (the tab asks often)."""
        if self.run is None:
            return {}
        try:
            stat = self.run.status_path.stat()
        except OSError:
            return {}
        key = (stat.st_mtime_ns, stat.st_size)
        if key != self._status_key:
            with contextlib.suppress(OSError, ValueError):
                self._status = dataclasses.asdict(self.run.status())
                self._status_key = key
        return self._status

    def is_running(self) -> bool:
        return self._active and not self._ended

    def checkpoint(self) -> str:
        """The run's latest complete checkpoint (its status's, else the newest on disk), or ""."""
        if self.run is None:
            return ""
        recorded = str(self.remote_status.get("checkpoint") or "")
        if recorded:
            return recorded
        with contextlib.suppress(OSError, ValueError):
            latest = self.run.latest_checkpoint()
            if latest is not None:
                return str(latest)
        return ""

    def to_entry(self) -> dict[str, Any]:
        return {"host": LOCAL, "folder": self.folder, "name": self.name}

    # -- starting ---------------------------------------------------------------------------------

    def start(self, job: dict[str, Any], *, device: str = "auto", resumed_from: str = "",
              cards: Sequence[int] = (), gated: bool = False) -> None:
        """Submit ``job`` through a ``train --slurm`` child (the nodes pick their device and cards,
        and each node checks its own: ``gated`` does not apply)."""
        self._active = True
        argv = [sys.executable, "-m", "gaudi_gui",
                *self.target.argv(runs_dir=self.runs_dir, grace_s=self.grace_s, resumed_from=resumed_from),
                "--events"]
        # Its own session: a Ctrl-C in the terminal that started the app must not stop the job.
        if self._child.start(argv[0], argv[1:], stdin_open=True, new_session=True):
            self._child.write_line(json.dumps(job))
            self._child.close_stdin()

    def follow(self, folder: str, *, name: str = "", cards: Any = ()) -> None:
        """Follow again a job submitted earlier: a ``runs attach`` child reads its log and events
        from the start; Stop and Kill now work as for a job submitted here."""
        self._active = True
        argv = [sys.executable, "-m", "gaudi_gui", "runs", "attach", folder,
                "--grace", repr(float(self.grace_s)), "--events"]
        self._child.start(argv[0], argv[1:], new_session=True)

    # -- the child's output -----------------------------------------------------------------------

    def _on_child_started(self, pid: int) -> None:
        self.pid = pid
        given = " < job.json" if "--config" in self._child.argv else ""
        self.line_received.emit("[gaudi-gui] " + shlex.join(self._child.argv) + given)

    def _on_child_line(self, stream: str, line: str) -> None:
        message = protocol.decode(line) if stream == "stdout" else None
        if message is not None:
            # The child's structured lines (``--events``): what the job is, never read from its words.
            self._take_message(message)
            return
        text = redact(line)
        self.line_received.emit(text)
        if stream == "stderr":
            self._err_tail.append(text)
        self._poll_events()

    def _take_message(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == "slurm_submitted" and not self.job_id:
            self.job_id = str(message.get("job_id") or "?")
            self.note_changed.emit(f"Slurm job {self.job_id} submitted")
            # Stop was pressed while sbatch ran: the child counts signals from now on.
            for _ in range(self._stop_pending):
                self._signal_child()
        elif kind == "slurm_run_folder" and not self.folder and message.get("folder"):
            self.folder = str(message["folder"])
            self.name = Path(self.folder).name
            self.run = Run(self.folder)
            self._events = EventFollower(self.run.events_path)
            self._follow.start()
            self.identified.emit(self.folder)
        elif kind == "slurm_state":
            phase, reason = str(message.get("phase") or ""), str(message.get("reason") or "")
            word = (f"pending ({reason})" if reason else "pending") if phase == "pending" else \
                f"running on {message.get('nodes') or '?'}" if phase == "running" \
                else str(message.get("state") or "").lower()
            self.slurm_phase = word
            self.slurm_state_changed.emit("queued" if phase == "pending" else "running" if phase == "running"
                                          else "", word)
        self._poll_events()

    def _poll_events(self) -> None:
        if self._events is not None:
            for event in self._events.read():
                self.event_received.emit(event)

    # -- stopping ---------------------------------------------------------------------------------

    def stop(self) -> None:
        """SIGINT to the child: the job saves a checkpoint, then ends (cancelled if not yet submitted)."""
        if self.is_running() and self.stop_sent < 1:
            self._escalate()

    def kill(self) -> None:
        """The child's second SIGINT: the job is cancelled at once."""
        while self.is_running() and self.stop_sent < 2:
            self._escalate()

    def _escalate(self) -> None:
        self.stop_sent += 1
        if self.job_id:
            self._signal_child()
        else:
            self._stop_pending += 1

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
        if self.run is not None:
            with contextlib.suppress(OSError, ValueError):
                st = self.run.status()
                if st.state not in ("queued", "running", "stopping") and st.summary:
                    result = {"state": st.state, "summary": st.summary}
        if not result:
            last = next((ln for ln in reversed(tail) if ln.strip()), "")
            why = "failed to start" if status == EXIT_FAILED_TO_START else describe_exit(code, status)
            if self.stop_sent and not self.job_id:
                result = {"state": "stopped", "summary": "Stopped before the job was submitted"}
            else:
                result = {"state": "failed",
                          "summary": f"Failed: gaudi-gui train --slurm {why}" + (f": {last}" if last else "")}
        self._ended = True
        self._active = False
        self._follow.stop()
        self.ended.emit(code, str(result["state"]), str(result["summary"]), tail)

    def detach(self) -> None:
        """Stop following (the app exits): the job goes on in Slurm (``scancel JOB`` ends it)."""
        self._follow.stop()
        self._active = False
        if self._child.is_running():
            # SIGKILL, not SIGTERM: the child would take SIGTERM for a stop of the job.
            self._child.kill_tree()
            if self.job_id:
                self.line_received.emit(f"[gaudi-gui] Slurm job {self.job_id} goes on without the app; "
                                        f"scancel {self.job_id} ends it")

    def shutdown(self) -> None:
        self.detach()


def slurm_target_of(run: Run) -> SlurmTarget:
    """The Slurm target a run's slurm.json recorded (ValueError when it is not a Slurm run)."""
    info = slurm_mod.read_info(run)
    return SlurmTarget(slurm_mod.options_of(info), str(info.get("login") or LOCAL))


__all__ = ["CLOSED", "CONNECTING", "FOLLOWING", "RECONNECTING", "AgentPart", "PartSignals", "SlurmPart",
           "slurm_target_of"]

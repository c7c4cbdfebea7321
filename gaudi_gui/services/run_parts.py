"""The parts a run is followed through: what ``TrainingJob`` composes, one part per place.

Every placement but Slurm runs the same supervisor: ``gaudi-gui train --config - --detach --json``
(``core.supervisor``: stop with a checkpoint, grace, kill-now, step writes, waiting for killed ranks,
leftovers, outcome), on this machine (the identity host: a child of this process) or on a host over
ssh. A ``SupervisedPart`` sends it the job on stdin, learns the run folder from its answer, then
follows the run with ``runs follow FOLDER --events-from N --log-from M`` (JSON lines; the offsets let
a follower whose connection dropped go on exactly where it was) and stops it with ``runs stop
[--now]``. A dropped connection is a state ("reconnecting in N s", back-off 1 s → 30 s), never a
dialog: the run goes on meanwhile. The final state and summary are the supervisor's.

A ``SlurmPart`` follows a ``gaudi-gui train --slurm --events`` child instead (the job runs on the
cluster's nodes; the child submits it and follows the queue): its structured lines say what Slurm
does, the run's events.jsonl (on the shared file system) says what the ranks do. Stop is SIGINT to
the child (``scancel --batch --signal=USR1``: a checkpoint), a second SIGINT cancels the job.

Both kinds give the job the same signals and the same few words (``start``/``follow``, ``stop``,
``kill``, ``detach``, ``shutdown``, ``is_running``, ``folder``, ``checkpoint``, ``to_entry``); the
job never asks which kind a part is. Every command is an argv list (``Host.wrap`` quotes each word
for a remote shell): nothing a user typed reaches a shell as code.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import signal
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.core import protocol, remote, visibility
from gaudi_gui.core import slurm as slurm_mod
from gaudi_gui.core.backoff import Backoff
from gaudi_gui.core.events import EventFollower
from gaudi_gui.core.remote import LOCAL, SSH_FAILED, Host
from gaudi_gui.core.runstore import Run
from gaudi_gui.core.secrets import redact
from gaudi_gui.core.slurm import SlurmTarget
from gaudi_gui.services.process import EXIT_FAILED_TO_START, ProcessRunner, describe_exit

#: Connection states (``connection_changed``).
CONNECTING = "connecting"
FOLLOWING = "following"
RECONNECTING = "reconnecting"
CLOSED = "closed"
#: A follower silent this long is taken for dead (``runs follow`` sends a heartbeat every second).
SILENCE_S = 20.0
#: How long a short call (start, stop) may take before it counts as failed.
CALL_TIMEOUT_MS = 180_000
#: How often a Slurm run's event file is read (also at once whenever the child prints a line).
FOLLOW_MS = 250


class RemoteCall(QObject):
    """One short command on a host (``train --detach``, ``runs stop``): its whole output at the end."""

    #: The call ended: (exit code, stdout, stderr); code -1 when it could not be started or timed out.
    finished = Signal(int, str, str)

    def __init__(self, host: Host, argv: list[str], *, input_text: str = "",
                 timeout_ms: int = CALL_TIMEOUT_MS, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self.argv = argv
        self.input_text = input_text
        self.out: list[str] = []
        self.err: list[str] = []
        self._runner = ProcessRunner(self, parse_protocol=False, tail_lines=50)
        self._runner.line_received.connect(self._on_line)
        self._runner.finished.connect(self._on_finished)
        self._timeout = QTimer(self)
        self._timeout.setSingleShot(True)
        self._timeout.setInterval(timeout_ms)
        self._timeout.timeout.connect(self._on_timeout)
        self._timed_out = False

    def start(self) -> None:
        cmd = self.host.wrap(self.argv)
        if self._runner.start(cmd[0], cmd[1:], stdin_open=True):
            if self.input_text:
                self._runner.write_line(self.input_text)
            self._runner.close_stdin()
            self._timeout.start()

    def is_running(self) -> bool:
        return self._runner.is_running()

    def kill(self) -> None:
        self._timeout.stop()
        self._runner.kill_tree()

    def _on_line(self, stream: str, line: str) -> None:
        (self.out if stream == "stdout" else self.err).append(line)

    def _on_timeout(self) -> None:
        self._timed_out = True
        self.err.append(f"{self.host.label} did not answer within {self._timeout.interval() / 1000:g} s")
        self._runner.kill_tree()

    def _on_finished(self, code: int, status: str) -> None:
        self._timeout.stop()
        if status == EXIT_FAILED_TO_START:
            self.err += self._runner.tail(3)
        self.finished.emit(-1 if self._timed_out or status == EXIT_FAILED_TO_START else code,
                           "\n".join(self.out), "\n".join(self.err))


def explain_call(host: Host, code: int, err: str, what: str) -> str:
    """One line for a person about a failed call on ``host``."""
    last = next((ln.strip() for ln in reversed(err.splitlines()) if ln.strip()), "")
    if code == SSH_FAILED and not host.is_local:
        return remote.explain_ssh_failure(host.name, err)[1]
    if not host.is_local and (code in (126, 127) or "No module named" in err):
        return (f"{host.name} has no gaudi-gui behind `{host.remote_command}` ({last or f'exit {code}'}); "
                f"fix: {remote.fix_command(host)}, or set the host's remote command")
    where = "" if host.is_local else f" on {host.name}"
    return f"{what}{where} failed: {last or f'exit {code}'}"


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
    #: The part's run meter summary (its supervisor's meter-summary.json, sent with the follow's end);
    #: None until then, or when the part has none (a Slurm part: the nodes run no meter yet).
    meter: dict[str, Any] | None = None


class SupervisedPart(PartSignals):
    """A run under ``gaudi-gui train --detach`` at one host (this machine included), followed by
    ``runs follow``: started here, or followed again after a restart."""

    def __init__(self, host: Host, *, grace_s: float, runs_dir: str = "",
                 parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.host = host
        self.grace_s = grace_s
        #: The run store on this machine (a host's supervisor uses the host's own).
        self.runs_dir = runs_dir
        #: The run folder (a path on the host; "" until the supervisor answered) and its name.
        self.folder = ""
        self.name = ""
        #: The supervisor's pid (on the host), 0 until known.
        self.pid = 0
        #: The host's cards this run was started on (``train --cards``); empty: the default.
        self.cards: list[int] = []
        #: The run's last status as the supervisor wrote it (state, step, checkpoint, summary …).
        self.remote_status: dict[str, Any] = {}
        self.connection = CLOSED
        #: 0: no stop asked, 1: stop with a checkpoint, 2: kill now.
        self.stop_sent = 0
        self.backoff_initial_s = 1.0
        self.backoff_max_s = 30.0
        self._backoff = Backoff(self.backoff_initial_s, self.backoff_max_s)
        self._active = False
        self._ended = False
        self._events_from = 0
        self._log_from = 0
        self._final: dict[str, Any] | None = None
        self._err_tail: deque[str] = deque(maxlen=20)
        self._calls: list[RemoteCall] = []
        self._last_contact = 0.0
        self._follower = ProcessRunner(self, parse_protocol=False, tail_lines=20)
        self._follower.line_received.connect(self._on_follow_line)
        self._follower.finished.connect(self._on_follow_finished)
        self._retry = QTimer(self)
        self._retry.setSingleShot(True)
        self._retry.timeout.connect(self._follow_again)
        self._watchdog = QTimer(self)
        self._watchdog.setInterval(2000)
        self._watchdog.timeout.connect(self._check_silence)

    @property
    def where(self) -> str:
        """" on HOST", or "" on this machine (for sentences)."""
        return "" if self.host.is_local else f" on {self.host.name}"

    def is_running(self) -> bool:
        return self._active and not self._ended

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

    # -- starting ---------------------------------------------------------------------------------

    def start(self, job: dict[str, Any], *, device: str = "auto", resumed_from: str = "",
              cards: Sequence[int] = (), gated: bool = False) -> None:
        """Send ``job`` to the host's ``train --detach``; the answer (``identified``) or the refusal
        (``ended`` with "failed") comes back asynchronously. ``gated``: the app's start gate checked
        these cards already, so the command does not check them again (the gate runs once a start)."""
        self.cards = sorted(set(cards))
        self._active = True
        argv = ["train", "--config", "-", "--detach", "--json", "--device", device,
                "--grace", repr(float(self.grace_s)), *visibility.cards_argv(self.cards),
                *(["--no-preflight"] if gated else [])]
        if self.host.is_local:
            argv += ["--origin", "gui", *(["--runs-dir", self.runs_dir] if self.runs_dir else [])]
        if resumed_from:
            argv += ["--resumed-from", resumed_from]
        self._set_connection(CONNECTING, f"starting the job{self.where}…")
        self._call(argv, self._on_started, input_text=json.dumps(job))

    def _on_started(self, code: int, out: str, err: str) -> None:
        if self._ended:
            return
        info: Any = None
        if code == 0:
            with contextlib.suppress(ValueError, IndexError):
                info = json.loads(out.strip().splitlines()[-1])
        if not isinstance(info, dict) or not info.get("folder"):
            text = (explain_call(self.host, code, err, "starting the run") if code != 0
                    else f"{self.host.label} answered something unexpected: {out.strip()[:200]!r}")
            for line in err.splitlines()[-20:]:
                self.line_received.emit(line)
                self._err_tail.append(line)
            self._finish(code if code != 0 else 1, {"state": "failed", "summary": f"Failed: {text}"})
            return
        self.folder = str(info["folder"])
        self.name = str(info.get("name") or self.folder.rstrip("/").rsplit("/", 1)[-1])
        self.pid = int(info.get("pid") or 0)
        self.line_received.emit(f"[gaudi-gui] run folder{self.where}: {self.folder} (device "
                                f"{info.get('device', 'as asked')}, supervisor pid {self.pid}; it goes on if "
                                f"the app"
                                f"{'' if self.host.is_local else ' or the connection'} ends)")
        self.identified.emit(self.folder)
        if self.stop_sent:
            # Stop was pressed while the supervisor was starting the run: send it now.
            self._send_stop(now=self.stop_sent > 1)
        self._follow_again()

    def follow(self, folder: str, *, name: str = "", cards: Any = ()) -> None:
        """Follow a run started before (after a restart) from its beginning, so the curve and log
        are whole again. ``cards``: what ``to_entry`` recorded (anything but a list of
        non-negative ints is taken as none)."""
        self.cards = sorted({c for c in cards if isinstance(c, int) and c >= 0}) \
            if isinstance(cards, (list, tuple)) else []
        self.folder, self.name = folder, name or folder.rstrip("/").rsplit("/", 1)[-1]
        self._active = True
        self._follow_again()

    # -- following --------------------------------------------------------------------------------

    def _follow_again(self) -> None:
        if self._ended or not self.folder or self._follower.is_running():
            return
        argv = self.host.gaudi_gui_argv("runs", "follow", self.folder, "--events-from",
                                        str(self._events_from), "--log-from", str(self._log_from))
        cmd = self.host.wrap(argv)
        self._err_tail.clear()
        if self.connection != RECONNECTING:
            self._set_connection(CONNECTING, f"connecting to {self.host.label}…")
        self._last_contact = time.monotonic()
        # stdin stays open: the follower ends itself when it closes (ssh sends no signal).
        self._follower.start(cmd[0], cmd[1:], stdin_open=True)
        self._watchdog.start()

    def _on_follow_line(self, stream: str, line: str) -> None:
        if stream != "stdout":
            self._err_tail.append(line)
            return
        try:
            msg = json.loads(line)
        except ValueError:
            return
        if not isinstance(msg, dict):
            return
        self._last_contact = time.monotonic()
        if self.connection != FOLLOWING:
            self._backoff = Backoff(self.backoff_initial_s, self.backoff_max_s)
            self._set_connection(FOLLOWING, f"following {self.name}{self.where}")
        kind = msg.get("t")
        if kind == "event":
            event = msg.get("event")
            if isinstance(event, dict):
                self.event_received.emit(event)
            if isinstance(msg.get("end"), int):
                self._events_from = msg["end"]
        elif kind == "log":
            self.line_received.emit(str(msg.get("line", "")))
        elif kind == "log_offset":
            if isinstance(msg.get("end"), int):
                self._log_from = msg["end"]
        elif kind == "status":
            status = msg.get("status")
            if isinstance(status, dict):
                self.remote_status = status
        elif kind == "end":
            status = msg.get("status")
            self._final = status if isinstance(status, dict) else {}
            meter = msg.get("meter")
            self.meter = meter if isinstance(meter, dict) else None
            self.remote_status = self._final or self.remote_status
            self._follower.close_stdin()

    def _check_silence(self) -> None:
        if self._follower.is_running() and time.monotonic() - self._last_contact > SILENCE_S:
            # A link that hangs without closing: end this follower, the next one reconnects.
            self._err_tail.append(f"no answer from {self.host.label} for {SILENCE_S:g} s")
            self._follower.kill_tree()

    def _on_follow_finished(self, code: int, status: str) -> None:
        self._watchdog.stop()
        if self._ended:
            return
        if self._final is not None:
            self._finish(0, None)
            return
        if not self._active:
            return
        tail = "\n".join(self._err_tail)
        if code == SSH_FAILED and not self.host.is_local:
            why = remote.explain_ssh_failure(self.host.name, tail)[1]
        elif status == EXIT_FAILED_TO_START:
            why = tail
        else:
            why = f"the follower{self.where} exited with {code}: {tail[-200:]}"
        delay = self._backoff.next()
        message = f"{why}; reconnecting in {delay:g} s (the run goes on{self.where})"
        self._set_connection(RECONNECTING, message)
        self.note_changed.emit(message)
        self.line_received.emit(f"[gaudi-gui] {message}")
        self._retry.start(int(delay * 1000))

    # -- stopping ---------------------------------------------------------------------------------

    def stop(self) -> None:
        """``runs stop``: the supervisor stops the ranks with a checkpoint at the end of their step."""
        if self.is_running() and not self.stop_sent:
            self.stop_sent = 1
            if self.folder:
                self._send_stop(now=False)

    def kill(self) -> None:
        """``runs stop --now``: the supervisor kills the run's processes (no checkpoint)."""
        if self.is_running() and self.stop_sent < 2:
            self.stop_sent = 2
            if self.folder:
                self._send_stop(now=True)

    def _send_stop(self, *, now: bool) -> None:
        args = ["runs", "stop", self.folder, *(["--now"] if now else [])]
        self.line_received.emit(f"[gaudi-gui] {self.host.shell_preview(self.host.gaudi_gui_argv(*args))}")
        self._call(args, lambda code, out, err: self._on_stop_sent(now, code, out, err))

    def _on_stop_sent(self, now: bool, code: int, out: str, err: str) -> None:
        if code == 0:
            if out.strip():
                self.line_received.emit(f"[{self.host.label}] {out.strip()}")
            return
        # Not sent: the next press sends it again (the same kind of stop).
        self.stop_sent = 1 if now else 0
        if not self._ended:
            self.stop_failed.emit(now, explain_call(self.host, code, err, "kill" if now else "stop"))

    # -- calls ------------------------------------------------------------------------------------

    def _call(self, args: list[str], done: Callable[[int, str, str], None], *, input_text: str = "") -> None:
        call = RemoteCall(self.host, self.host.gaudi_gui_argv(*args), input_text=input_text, parent=self)
        self._calls.append(call)

        def finished(code: int, out: str, err: str) -> None:
            with contextlib.suppress(ValueError):
                self._calls.remove(call)
            call.deleteLater()
            done(code, out, err)

        call.finished.connect(finished)
        call.start()

    # -- the end ----------------------------------------------------------------------------------

    def _finish(self, code: int, override: dict[str, Any] | None) -> None:
        if self._ended:
            return
        self._ended = True
        self._active = False
        for timer in (self._retry, self._watchdog):
            timer.stop()
        final = override if override is not None else (self._final or {})
        state = str(final.get("state") or "failed")
        summary = str(final.get("summary") or state)
        if override is None and self.folder:
            summary += f" (on {self.host.name})" if self.where else ""
        self._set_connection(CLOSED, "")
        # The supervisor decided how the run ended; the code says only "went well" or not.
        self.ended.emit(0 if state in ("finished", "stopped") else (code or 1), state, summary,
                        list(self._err_tail))

    def detach(self) -> None:
        """Stop following (the app exits): the run goes on, followed again next time."""
        self._active = False
        for timer in (self._retry, self._watchdog):
            timer.stop()
        if self._follower.is_running():
            self._follower.close_stdin()
            self._follower.kill_tree()

    def shutdown(self) -> None:
        self.detach()
        for call in list(self._calls):
            call.kill()


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


__all__ = ["CLOSED", "CONNECTING", "FOLLOWING", "RECONNECTING", "RemoteCall", "SlurmPart",
           "SupervisedPart", "explain_call", "slurm_target_of"]

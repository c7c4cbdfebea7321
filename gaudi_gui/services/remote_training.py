"""A training run on a host over SSH, as the Training tab sees it: the same signals as a local
``TrainingJob``, fed by the host's ``gaudi-gui runs follow``.

The run lives on the host, never in this process: the job (its paths are the host's) goes on stdin to
the host's ``gaudi-gui train --config - --detach --json``, which starts the run in a session of its
own there and answers with its folder. From then on a ``runs follow FOLDER --events-from N
--log-from M`` over ssh streams the run's events.jsonl lines and log as JSON lines; the offsets let
a follower whose connection dropped go on exactly where it was. A dropped connection is a state
("reconnecting in N s", back-off 1 s → 30 s), never a dialog: the run goes on on the host meanwhile.
Stop sends ``runs stop`` (the host's supervisor stops the ranks with a checkpoint), a second Stop
``runs stop --now``. The final state and summary are the host's (its supervisor applies
``core.outcome``). The app may exit while the run goes on; ``TrainingService`` remembers host and
folder and follows it again at the next start.

Every command is an argv list wrapped by ``Host.wrap`` (each word shlex-quoted for the remote shell):
nothing a user typed reaches a shell as code.
"""

from __future__ import annotations

import contextlib
import json
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.core import remote, visibility
from gaudi_gui.core.backoff import Backoff
from gaudi_gui.core.jobconfig import JobConfig
from gaudi_gui.core.remote import SSH_FAILED, Host
from gaudi_gui.core.runstore import RunStore
from gaudi_gui.services.process import EXIT_FAILED_TO_START, ProcessRunner
from gaudi_gui.services.training_job import TrainingJob

#: Connection states (``connection_changed``).
CONNECTING = "connecting"
FOLLOWING = "following"
RECONNECTING = "reconnecting"
CLOSED = "closed"
#: A follower silent this long is taken for dead (``runs follow`` sends a heartbeat every second).
SILENCE_S = 20.0
#: How long a short call (start, stop) may take before it counts as failed.
CALL_TIMEOUT_MS = 180_000


class RemoteCall(QObject):
    """One short command on a host (``train --detach``, ``runs stop``): its whole output at the end."""

    #: The call ended: (exit code, stdout, stderr); code -1 when ssh could not be started or timed out.
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
        self.err.append(f"{self.host.name} did not answer within {self._timeout.interval() / 1000:g} s")
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
    if code == SSH_FAILED:
        return remote.explain_ssh_failure(host.name, err)[1]
    if code in (126, 127) or "No module named" in err:
        return (f"{host.name} has no gaudi-gui behind `{host.remote_command}` ({last or f'exit {code}'}); "
                f"fix: {remote.fix_command(host)}, or set the host's remote command")
    return f"{what} on {host.name} failed: {last or f'exit {code}'}"


class HostedJob(TrainingJob):
    """What a run on one or several hosts has in common for the tab and the supervisor: it runs while
    it is followed and has not ended (``_active``, ``_ended``), and a stop was asked of it when
    ``_stop_sent`` > 0 (1: with a checkpoint, 2: kill)."""

    _active = False
    _ended = False
    _stop_sent = 0

    def is_running(self) -> bool:
        return self._active and not self._ended

    @property
    def attached(self) -> bool:
        return self.is_running()

    @property
    def stopping(self) -> bool:
        return self._stop_sent > 0 and self.is_running()

    @property
    def is_remote(self) -> bool:
        return True

    def stop(self, grace_s: float | None = None) -> None:
        """Stop with a checkpoint (the hosts' ranks save at the end of their current step); pressed
        again: kill now."""
        if not self.is_running():
            return
        if self._stop_sent:
            self.kill()
            return
        self._stop_sent = 1
        self._set_state("stopping")
        self._request_stop()

    def _request_stop(self) -> None:
        """Ask the host(s) for the stop with a checkpoint (``_stop_sent`` and the state are set)."""
        raise NotImplementedError


class RemoteTrainingJob(HostedJob):
    """One training run on a host over SSH (started here, or followed again after a restart).

    It is a ``TrainingJob`` for the views and the supervisor (same signals, ``records``,
    ``progress``, ``summary``; events are taken by the same code), with ``run`` None: the run folder
    is on the host (``folder``)."""

    #: The connection to the host changed: (connecting / following / reconnecting / closed, a line
    #: for a person). A dropped connection is only this state: the run goes on on the host.
    connection_changed = Signal(str, str)
    #: The host created the run folder: carries the folder (a path on the host).
    run_identified = Signal(str)

    def __init__(self, host: Host, store: RunStore | None = None, *, stop_grace_s: float = 120.0,
                 parent: QObject | None = None) -> None:
        super().__init__(store, stop_grace_s=stop_grace_s, parent=parent)
        self.host = host
        #: The run folder on the host ("" until the host answered) and its name.
        self.folder = ""
        self.name = ""
        #: The job as sent (what a Resume sends again, with the checkpoint to resume from).
        self.job_dict: dict[str, Any] = {}
        #: The run this one resumes (a folder on the host), "" for a fresh run.
        self.resumed_from = ""
        #: The host's cards this run was started on (``train --cards``); empty: all of them.
        self.cards: list[int] = []
        #: The host's last status of the run (state, step, checkpoint, summary ...).
        self.remote_status: dict[str, Any] = {}
        self.connection = CLOSED
        self.backoff_initial_s = 1.0
        self.backoff_max_s = 30.0
        self._backoff = Backoff(self.backoff_initial_s, self.backoff_max_s)
        self._active = False
        self._stop_sent = 0  # 1: `runs stop` sent, 2: `runs stop --now` sent
        self._stop_at = 0.0
        self._events_from = 0
        self._log_from = 0
        self._final: dict[str, Any] | None = None
        self._err_tail: deque[str] = deque(maxlen=20)
        self._calls: list[RemoteCall] = []
        self._last_contact = 0.0
        self._follower_proc = ProcessRunner(self, parse_protocol=False, tail_lines=20)
        self._follower_proc.line_received.connect(self._on_follow_line)
        self._follower_proc.finished.connect(self._on_follow_finished)
        self._retry = QTimer(self)
        self._retry.setSingleShot(True)
        self._retry.timeout.connect(self._follow_again)
        self._watchdog = QTimer(self)
        self._watchdog.setInterval(2000)
        self._watchdog.timeout.connect(self._check_silence)

    # -- state ------------------------------------------------------------------------------------

    def describe(self) -> str:
        return (f"training run {self.name or 'starting'} on {self.host.name} ({self.state}, step "
                f"{self.progress.step}/{self.progress.max_steps})")

    def checkpoint(self) -> str:
        """The latest complete checkpoint the host reported (a path on the host), or ""."""
        return str(self.remote_status.get("checkpoint") or "")

    def to_entry(self) -> dict[str, Any]:
        """What the supervisor keeps to follow this run again after a restart."""
        return {"host": self.host.name, "remote_command": self.host.remote_command, "folder": self.folder,
                "name": self.name, "job": self.job_dict, "resumed_from": self.resumed_from,
                "cards": list(self.cards)}

    def _set_connection(self, state: str, message: str = "") -> None:
        self.connection = state
        self.connection_changed.emit(state, message)

    # -- starting ---------------------------------------------------------------------------------

    def start_remote(self, job: JobConfig, *, device: str = "auto", resumed_from: str = "",
                     cards: Sequence[int] = ()) -> None:
        """Send ``job`` to the host's ``train --detach``; the answer (the run folder) or the refusal
        comes back asynchronously (``run_identified``, or ``finished`` with state "failed").
        ``cards``: the host's cards the run may use (``train --cards``; empty: all of them)."""
        if self.is_running():
            raise RuntimeError("this job is already running")
        self._reset()
        self.job = job
        self.job_dict = job.to_dict()
        self.resumed_from = resumed_from
        self.cards = sorted(set(cards))
        self._active = True
        argv = ["train", "--config", "-", "--detach", "--json", "--device", device,
                "--grace", repr(float(self.stop_grace_s)), *visibility.cards_argv(self.cards)]
        if resumed_from:
            argv += ["--resumed-from", resumed_from]
        self._set_state("queued")
        self._set_summary(f"starting the run on {self.host.name}…")
        self._set_connection(CONNECTING, f"connecting to {self.host.name}…")
        self._call(argv, self._on_started_remote, input_text=json.dumps(self.job_dict))

    def _on_started_remote(self, code: int, out: str, err: str) -> None:
        if self._ended:
            return
        info: Any = None
        if code == 0:
            with contextlib.suppress(ValueError, IndexError):
                info = json.loads(out.strip().splitlines()[-1])
        if not isinstance(info, dict) or not info.get("folder"):
            text = (explain_call(self.host, code, err, "starting the run") if code != 0
                    else f"{self.host.name} answered something unexpected: {out.strip()[:200]!r}")
            for line in err.splitlines()[-20:]:
                self.log_line_received.emit(line)
            self._finish(code if code != 0 else 1, {"state": "failed", "summary": f"Failed: {text}"})
            return
        self.folder = str(info["folder"])
        self.name = str(info.get("name") or self.folder.rstrip("/").rsplit("/", 1)[-1])
        self.log_line_received.emit(f"[gaudi-gui] run folder on {self.host.name}: {self.folder} (device "
                                    f"{info.get('device')}; the run goes on if the app or the connection "
                                    f"ends)")
        self._set_state("running")
        self.run_identified.emit(self.folder)
        if self._stop_sent:
            # Stop was pressed while the host was starting the run: send it now.
            self._send_stop(now=self._stop_sent > 1)
        self._follow_again()

    def follow_existing(self, folder: str, *, name: str = "", job: dict[str, Any] | None = None,
                        resumed_from: str = "", cards: Any = ()) -> None:
        """Follow a run this app started on the host before (after a restart): from its beginning,
        so the curve and log are whole again. ``cards``: what ``to_entry`` recorded (kept for a
        Resume; anything but a list of non-negative ints is taken as none)."""
        self._reset()
        self.cards = sorted({c for c in cards if isinstance(c, int) and c >= 0}) \
            if isinstance(cards, (list, tuple)) else []
        self.folder, self.name = folder, name or folder.rstrip("/").rsplit("/", 1)[-1]
        self.job_dict = dict(job or {})
        with contextlib.suppress(Exception):
            self.job = JobConfig.from_dict(self.job_dict)
        self.resumed_from = resumed_from
        self._active = True
        self._set_state("running")
        self._set_summary(f"re-attaching to {self.name} on {self.host.name}…")
        self._follow_again()

    def _reset(self) -> None:
        super()._reset()
        self._stop_sent = 0
        self._stop_at = 0.0
        self._events_from = self._log_from = 0
        self._final = None
        self._err_tail.clear()
        self._backoff = Backoff(self.backoff_initial_s, self.backoff_max_s)
        self._active = False

    # -- following --------------------------------------------------------------------------------

    def _follow_again(self) -> None:
        if self._ended or not self.folder or self._follower_proc.is_running():
            return
        argv = self.host.gaudi_gui_argv("runs", "follow", self.folder, "--events-from",
                                        str(self._events_from), "--log-from", str(self._log_from))
        cmd = self.host.wrap(argv)
        self._err_tail.clear()
        if self.connection != RECONNECTING:
            self._set_connection(CONNECTING, f"connecting to {self.host.name}…")
        self._last_contact = time.monotonic()
        # stdin stays open: the host's follower ends itself when it closes (ssh sends no signal).
        self._follower_proc.start(cmd[0], cmd[1:], stdin_open=True)
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
            self._set_connection(FOLLOWING, f"following {self.name} on {self.host.name}")
            if self._stop_sent:
                self._set_summary(f"stopping on {self.host.name}: checkpoint at the end of the current step…")
            elif self.progress.step:
                self._set_summary(f"training on {self.host.name}: step {self.progress.step} of "
                                  f"{self.progress.max_steps}")
        kind = msg.get("t")
        if kind == "event":
            event = msg.get("event")
            if isinstance(event, dict):
                self._take_event(event)
            if isinstance(msg.get("end"), int):
                self._events_from = msg["end"]
        elif kind == "log":
            self.log_line_received.emit(str(msg.get("line", "")))
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
            self.remote_status = self._final or self.remote_status
            self._follower_proc.close_stdin()

    def _check_silence(self) -> None:
        if self._follower_proc.is_running() and time.monotonic() - self._last_contact > SILENCE_S:
            # A link that hangs without closing: end this follower, the next one reconnects.
            self._err_tail.append(f"no answer from {self.host.name} for {SILENCE_S:g} s")
            self._follower_proc.kill_tree()

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
        if code == SSH_FAILED or status == EXIT_FAILED_TO_START:
            why = remote.explain_ssh_failure(self.host.name, tail)[1] if code == SSH_FAILED else tail
        else:
            why = f"the follower on {self.host.name} exited with {code}: {tail[-200:]}"
        delay = self._backoff.next()
        message = f"{why}; reconnecting in {delay:g} s (the run goes on on {self.host.name})"
        self._set_connection(RECONNECTING, message)
        self._set_summary(message)
        self.log_line_received.emit(f"[gaudi-gui] {message}")
        self._retry.start(int(delay * 1000))

    # -- stopping ---------------------------------------------------------------------------------

    def _request_stop(self) -> None:
        """``runs stop`` on the host (the ranks checkpoint at the end of the current step)."""
        self._stop_at = time.time()
        self._set_summary(f"stopping on {self.host.name}: checkpoint at the end of the current step…")
        self._tick.start()
        if self.folder:
            self._send_stop(now=False)

    def kill(self, reason: str = "request") -> None:
        """Kill the run's processes on the host now (no checkpoint from this stop)."""
        if not self.is_running():
            return
        self._stop_sent = 2
        self._stop_at = self._stop_at or time.time()
        self._set_state("stopping")
        self.log_line_received.emit(f"[gaudi-gui] killing the run on {self.host.name} now")
        if self.folder:
            self._send_stop(now=True)

    def _send_stop(self, *, now: bool) -> None:
        args = ["runs", "stop", self.folder, *(["--now"] if now else [])]
        self.log_line_received.emit(f"[gaudi-gui] {self.host.shell_preview(self.host.gaudi_gui_argv(*args))}")
        self._call(args, lambda code, out, err: self._on_stop_sent(now, code, out, err))

    def _on_stop_sent(self, now: bool, code: int, out: str, err: str) -> None:
        if code == 0:
            if out.strip():
                self.log_line_received.emit(f"[{self.host.name}] {out.strip()}")
            return
        text = explain_call(self.host, code, err, "kill" if now else "stop")
        # Not sent: the next press sends it again (the same kind of stop).
        self._stop_sent = 1 if now else 0
        if not self._ended:
            self._set_summary(f"could not stop the run: {text}; press Stop again")
            self.log_line_received.emit(f"[gaudi-gui] could not stop the run: {text}")
            if not now:
                self._tick.stop()
                self._set_state("running")

    def _on_tick(self) -> None:
        if self.saving_since:
            name = f"checkpoint-{self.progress.step}" if self.progress.step else "checkpoint"
            self._set_summary(f"saving {name}… {time.time() - self.saving_since:.0f} s")
        elif self._stop_sent and self.is_running() and self.connection == FOLLOWING:
            self._set_summary(f"stopping on {self.host.name}: waiting for the current step to end "
                              f"({time.time() - self._stop_at:.0f} s; press Stop again to kill now)")

    # -- calls ------------------------------------------------------------------------------------

    def _call(self, args: list[str], done: Any, *, input_text: str = "") -> None:
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
        for timer in (self._retry, self._watchdog, self._tick, self._kill_timer, self._follow):
            timer.stop()
        final = override if override is not None else (self._final or {})
        state = str(final.get("state") or "failed")
        summary = str(final.get("summary") or state)
        if override is None and self.folder:
            summary += f" (on {self.host.name})"
        self._set_connection(CLOSED, "")
        self._set_summary(summary)
        self._set_state(state)
        # The host's supervisor decided how the run ended; the code says only "went well" or not.
        self.finished.emit(0 if state in ("finished", "stopped") else (code or 1), state,
                           list(self._err_tail))

    def detach(self) -> None:
        """Stop following (the app exits): the run goes on on the host, followed again next time."""
        self._close_follower()

    def shutdown(self) -> None:
        self._close_follower()
        for call in list(self._calls):
            call.kill()

    def _close_follower(self) -> None:
        self._active = False
        for timer in (self._retry, self._watchdog, self._tick, self._kill_timer, self._follow):
            timer.stop()
        if self._follower_proc.is_running():
            self._follower_proc.close_stdin()
            self._follower_proc.kill_tree()


__all__ = ["CLOSED", "CONNECTING", "FOLLOWING", "RECONNECTING", "RemoteCall", "RemoteTrainingJob",
           "explain_call"]

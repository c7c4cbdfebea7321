"""The model runner's service: one generate worker child, spoken to over the JSON-lines protocol.

The worker is started lazily (on the first load) by this machine's agent (its ``generate`` child: the
window starts no process) with the device environment of the cards checked in
the Devices tab, keeps its model between prompts, and is stopped with the window. While a model is
loaded the cards are claimed in the DeviceSelection so the training tab can warn about sharing them.

A failed load leaves the loaded model (the worker keeps it until a new one is ready). A load can be
cancelled: that kills the worker (a load cannot be interrupted inside it) and, when a model was loaded
before, starts a fresh worker that loads that model again. Every generate has a request id; cancel
names it, and events of an earlier request are ignored.

A client has a host (``core.remote.Host``; "local" by default). On a saved host the worker is that
host's agent's ``generate`` child, reached through this machine's agent and its one ssh session to the
host (the request names the host; the lines come back as events): the window starts no process. When
this app or the connection goes, the host's agent ends the worker with the link's session. The host's
device environment (its card selection) travels as the request's ``env``, data in a JSON message. A
failure to reach the host is said in the link's words with its kind (``remote.failure_kind``: auth,
hostkey, unreachable, dropped, missing...), never as "exit 255". ``set_host`` retires the current
worker (it is shut down in the background) and the next load starts one on the new host.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.core import generation, remote
from gaudi_gui.core.generation import GenerationParams, LoadOptions
from gaudi_gui.core.remote import Host
from gaudi_gui.services.agent_child import EXIT_NORMAL, AgentChild, describe_exit
from gaudi_gui.services.device_selection import DeviceSelection

#: The worker's runner: an agent's child (this machine's agent's, or a host's agent's).
Runner = AgentChild

JOB_NAME = "Model runner"

#: Client states, in the order a session usually goes through them.
STOPPED, STARTING, IDLE, LOADING, LOADED, GENERATING = (
    "stopped", "starting", "idle", "loading", "loaded", "generating")


class GenerationClient(QObject):
    """Starts, talks to and stops ``python -m gaudi_gui.workers.generate``."""

    #: The state changed: one of stopped, starting, idle, loading, loaded, generating.
    state_changed = Signal(str)
    #: Loading went on: (stage text, seconds since the load began, as the worker measured).
    loading_progressed = Signal(str, float)
    #: A loading stage with a known size moved on (the demo model's first build): (done, total).
    load_progress_changed = Signal(int, int)
    #: A load failed; the model loaded before (if any) is still loaded: (kind, message).
    load_failed = Signal(str, str)
    #: A load was cancelled (the worker was killed); carries the model being reloaded, or "".
    load_cancelled = Signal(str)
    #: A model is loaded: the worker's 'loaded' event (load_s, device, dtype, parameters, memory_bytes...).
    model_loaded = Signal(dict)
    #: The model was unloaded (on request, or because the worker ended).
    model_unloaded = Signal()
    #: A piece of generated text.
    token_received = Signal(str)
    #: An answer is complete: its stats (ttft_s, tokens, decode_tokens_per_s, total_s, stop_reason,
    #: memory_bytes, memory_kind).
    generation_finished = Signal(dict)
    #: Something failed: (kind from core.generation.ERROR_KINDS or "crashed", message).
    error_occurred = Signal(str, str)
    #: A note from the worker worth showing (e.g. torch.compile becomes hpu_backend on Gaudi).
    info_received = Signal(str)
    #: A log line from the worker's stderr (library warnings, progress bars).
    log_received = Signal(str)
    #: The worker process ended: (exit code, exit status, its last output lines). Unexpected ends are
    #: also reported through error_occurred("crashed", ...).
    worker_exited = Signal(int, str, str)

    #: The host changed (its name); the previous host's worker is being shut down.
    host_changed = Signal(str)

    def __init__(self, selection: DeviceSelection | None = None, python: str | None = None,
                 parent: QObject | None = None, *, host: Host | None = None) -> None:
        super().__init__(parent)
        self._selection = selection
        #: The Python of a local worker ('': the agent's own).
        self._python = python or ""
        self._host = host or Host.local()
        #: Runners of earlier hosts still shutting down (kept so kill() reaches them).
        self._retired: list[Runner] = []
        self._runner = self._new_runner(self._host)
        self._state = STOPPED
        self._expect_exit = False
        #: Why the worker was refused (another gaudi-gui on the host), said once it has ended.
        self._refused = ""
        #: Why a host's worker could not start or was lost (the link's words), said once it has ended.
        self._host_words = ""
        self._restart_after_exit = False
        self._options: LoadOptions | None = None      # of the loaded model (what restart reloads)
        self._pending: LoadOptions | None = None      # of the load in progress
        self._loaded: dict[str, Any] = {}
        self._request = 0
        self._cancelling_load = False

    def _new_runner(self, host: Host) -> Runner:
        """The worker's runner: this machine's agent's child, or ``host``'s agent's."""
        runner = AgentChild(self, tail_lines=60, host=None if host.is_local else host.name)

        def current(slot: Callable[..., None]) -> Callable[..., None]:
            # A retired runner (an earlier host's worker shutting down) must not move this client.
            return lambda *a: slot(*a) if runner is self._runner else None

        runner.message_received.connect(current(self._on_message))
        runner.line_received.connect(current(self._on_line))
        runner.error_occurred.connect(current(self._on_runner_error))
        runner.finished.connect(current(self._on_finished))
        return runner

    def _on_runner_error(self, reason: str) -> None:
        if self._host.is_local:
            self.error_occurred.emit("crashed", reason)
        else:
            # The host could not be reached, or its link dropped: said with its kind once the
            # runner's end follows (``_on_finished``), as one error.
            self._host_words = reason

    # -- properties ---------------------------------------------------------------------------------

    @property
    def host(self) -> Host:
        """Where the worker runs ("local", or an ssh destination)."""
        return self._host

    @property
    def state(self) -> str:
        return self._state

    @property
    def loaded_info(self) -> dict[str, Any]:
        """The last 'loaded' event while a model is loaded, else {}."""
        return dict(self._loaded)

    @property
    def options(self) -> LoadOptions | None:
        """The options of the loaded model (None when none is loaded)."""
        return self._options

    @property
    def request_id(self) -> int:
        """The id of the latest generate request."""
        return self._request

    def is_running(self) -> bool:
        return self._runner.is_running()

    def pid(self) -> int:
        return self._runner.pid

    def tail(self, count: int = 20) -> list[str]:
        return self._runner.tail(count)

    # -- requests -----------------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker (no model yet). Harmless when it is already running."""
        if self._runner.is_running():
            return
        self._expect_exit = False
        extra = self._selection.env() if self._selection is not None else {}
        self._set_state(STARTING)
        self._host_words = ""
        # The Python given is this machine's: a host's agent runs its own.
        python = {"python": self._python} if self._python and self._host.is_local else {}
        self._runner.start("generate", {"env": extra, **python})

    def set_host(self, host: Host, selection: DeviceSelection | None = None) -> None:
        """Run the worker on ``host`` from the next load on, with ``selection`` (the host's card
        selection, for its device environment and claims; None: no cards restricted). The current
        worker, if any, is shut down in the background and its model dropped."""
        if host == self._host and selection is self._selection:
            return
        old = self._runner
        if old.is_running():
            self._retired.append(old)
            old.finished.connect(lambda *_a: self._forget(old))
            old.write_line(generation.shutdown_command())
            old.close_stdin()
            QTimer.singleShot(3000, old, lambda: old.terminate_tree(3000))
        else:
            old.deleteLater()
        self._runner = self._new_runner(host)
        self._drop_model()
        self._options = None
        self._pending = None
        self._request = 0
        self._cancelling_load = False
        self._restart_after_exit = False
        self._expect_exit = False
        self._host = host
        self._selection = selection
        self._set_state(STOPPED)
        self.host_changed.emit(host.name)

    def _forget(self, runner: Runner) -> None:
        if runner in self._retired:
            self._retired.remove(runner)
        runner.deleteLater()

    def load(self, options: LoadOptions) -> bool:
        """Load a model (starting the worker first if needed); False when the options are invalid."""
        problems = options.validate()
        if problems:
            self.error_occurred.emit("bad_parameters", "; ".join(problems))
            return False
        if self._state in (LOADING, GENERATING):
            self.error_occurred.emit("busy", f"the worker is {self._state}; wait or stop it first")
            return False
        self.start()
        self._pending = options
        self._set_state(LOADING)
        self._runner.write_line(generation.load_command(options))
        return True

    def cancel_load(self) -> None:
        """Abandon the load in progress: kill the worker; reload the previous model, if there was one."""
        if self._state != LOADING or not self._runner.is_running():
            return
        self._pending = None
        self._cancelling_load = True
        self._restart_after_exit = self._options is not None and bool(self._loaded)
        self._expect_exit = True
        self._runner.kill_tree()

    def generate(self, params: GenerationParams, *, prompt: str | None = None,
                 messages: list[dict[str, str]] | None = None, profile: bool = False) -> bool:
        """Ask for an answer to a plain prompt or to chat messages; False when it cannot start.
        ``profile``: the worker records the answer's decode steps with torch.profiler."""
        problems = params.validate()
        if problems:
            self.error_occurred.emit("bad_parameters", "; ".join(problems))
            return False
        if self._state != LOADED:
            self.error_occurred.emit("not_loaded" if self._state in (STOPPED, IDLE) else "busy",
                                     "load a model first" if self._state in (STOPPED, IDLE)
                                     else f"the worker is {self._state}")
            return False
        self._request += 1
        self._set_state(GENERATING)
        self._runner.write_line(generation.generate_command(params, prompt=prompt, messages=messages,
                                                            request_id=self._request, profile=profile))
        return True

    def cancel(self) -> None:
        """Stop the current answer; the worker ends it within one token and sends 'finished'."""
        if self._state == GENERATING:
            self._runner.write_line(generation.cancel_command(self._request))

    def unload(self) -> None:
        if self._runner.is_running() and self._state in (LOADED, GENERATING):
            self._runner.write_line(generation.unload_command())

    def restart(self) -> None:
        """Kill the worker (whatever it is doing) and start a fresh one, reloading the last model."""
        if self._runner.is_running():
            self._restart_after_exit = True
            self._expect_exit = True
            self._runner.kill_tree()
        else:
            self._start_and_reload()

    def _start_and_reload(self) -> None:
        self.start()
        if self._options is not None:
            self.load(self._options)

    def shutdown(self, grace_ms: int = 3000) -> None:
        """Ask the worker to exit; escalate to SIGTERM/SIGKILL if it does not within ``grace_ms``."""
        self._restart_after_exit = False
        if not self._runner.is_running():
            return
        self._expect_exit = True
        self._runner.write_line(generation.shutdown_command())
        self._runner.close_stdin()
        # Give the worker the grace period to exit by itself before SIGTERM (then SIGKILL).
        runner = self._runner  # not a later host's worker, should the host change meanwhile
        QTimer.singleShot(grace_ms, runner, lambda: runner.terminate_tree(grace_ms))

    def kill(self) -> None:
        self._restart_after_exit = False
        self._expect_exit = True
        self._runner.kill_tree()
        for runner in list(self._retired):
            runner.kill_tree()

    # -- worker events ------------------------------------------------------------------------------

    def _set_state(self, state: str) -> None:
        if state != self._state:
            self._state = state
            self.state_changed.emit(state)

    def _on_message(self, message: dict) -> None:
        kind = message.get("type")
        if kind == "ready":
            problem = worker_mismatch(self._host, message)
            if problem is not None:
                # Another gaudi-gui on the host: its worker may read the commands differently. Said
                # once it is gone (after worker_exited, so a view's last word is the reason).
                self._refused = problem
                self._restart_after_exit = False
                self._runner.kill_tree()
                return
            if self._state == STARTING:
                self._set_state(IDLE)
        elif kind == "loading":
            self.loading_progressed.emit(str(message.get("stage", "")), float(message.get("elapsed_s") or 0))
            progress = message.get("progress")
            if isinstance(progress, list) and len(progress) == 2 and all(isinstance(v, int)
                                                                         for v in progress):
                self.load_progress_changed.emit(progress[0], progress[1])
        elif kind == "loaded":
            self._loaded = {k: v for k, v in message.items() if k != "type"}
            self._options = self._pending or self._options
            self._pending = None
            if self._selection is not None:
                self._selection.claim(JOB_NAME)
            self._set_state(LOADED)
            self.model_loaded.emit(dict(self._loaded))
        elif kind == "token":
            if self._current(message):
                self.token_received.emit(str(message.get("text", "")))
        elif kind == "finished":
            if self._current(message):
                self._set_state(LOADED)
                self.generation_finished.emit(dict(message.get("stats") or {}))
        elif kind == "unloaded":
            self._drop_model()
        elif kind == "info":
            self.info_received.emit(str(message.get("message", "")))
        elif kind == "error":
            command = message.get("command")
            kind_, text = str(message.get("kind", "internal")), str(message.get("message", ""))
            if command == "load":
                # The worker kept the model it had: back to that state, options unchanged.
                self._pending = None
                if self._state == LOADING:
                    self._set_state(LOADED if self._loaded else IDLE)
                self.load_failed.emit(kind_, text)
            elif command == "generate":
                if message.get("request_id") not in (None, self._request):
                    return  # about an earlier request
                if self._state == GENERATING:
                    self._set_state(LOADED)
            self.error_occurred.emit(kind_, text)

    def _current(self, message: dict) -> bool:
        """False for an event of an earlier request (a cancelled answer's last tokens)."""
        request = message.get("id")
        return request is None or request == self._request

    def _drop_model(self) -> None:
        had = bool(self._loaded)
        self._loaded = {}
        if self._runner.is_running():
            self._options = None  # an unload; a dead worker keeps them so restart() can reload
        if self._selection is not None:
            self._selection.release(JOB_NAME)
        if self._runner.is_running():
            self._set_state(IDLE)
        if had:
            self.model_unloaded.emit()

    def _on_line(self, stream: str, line: str) -> None:
        if line.strip():
            self.log_received.emit(line)

    def _on_finished(self, code: int, status: str) -> None:
        tail = "\n".join(self._runner.tail(12))
        was = self._state
        self._drop_model()
        self._pending = None
        self._set_state(STOPPED)
        cancelled_load = self._cancelling_load
        reload = ""
        if cancelled_load:
            self._cancelling_load = False
            reload = self._options.model if self._restart_after_exit and self._options else ""
            if not self._restart_after_exit:
                self._options = None
        expected = self._expect_exit or (status == EXIT_NORMAL and code == 0 and was in (IDLE, STOPPED))
        refused, self._refused = self._refused, ""
        host_words, self._host_words = self._host_words, ""
        self.worker_exited.emit(code, status, tail)
        if refused:
            self.error_occurred.emit("version", refused)
            expected = True
        if cancelled_load:
            # After worker_exited, so a view shows the cancel rather than the kill it took.
            self.load_cancelled.emit(reload)
        if not expected:
            during = f" while {was}" if was not in (IDLE, STOPPED, STARTING) else ""
            problem = remote_failure(self._host, host_words)
            if problem is not None:
                self.error_occurred.emit(*problem)
            else:
                self.error_occurred.emit("crashed", f"the model worker {describe_exit(code, status)}"
                                         f"{during}; restart it to go on.\n{tail}".strip())
        if self._restart_after_exit:
            self._restart_after_exit = False
            self._start_and_reload()


def worker_mismatch(host: Host, ready: dict[str, Any]) -> str | None:
    """What is wrong when a worker on ``host`` is not this gaudi-gui (its ``ready`` message names
    its version and protocol), with the command that fixes it; None when it matches or is local."""
    from gaudi_gui import __version__
    from gaudi_gui.core import protocol
    if host.is_local:
        return None
    version, proto = ready.get("gaudi_gui"), ready.get("protocol")
    if version == __version__ and proto == protocol.PROTOCOL_VERSION:
        return None
    theirs = f"gaudi-gui {version}" if version else "an older gaudi-gui"
    return (f"{host.name} runs {theirs} (worker protocol {proto}); this is {__version__} (protocol "
            f"{protocol.PROTOCOL_VERSION}). Fix: {remote.fix_command(host)}")


def remote_failure(host: Host, words: str) -> tuple[str, str] | None:
    """(kind, message) when a host's worker ended because the host could not be reached or its link
    dropped (``words``: the link's sentence), else None (the worker's own end)."""
    if host.is_local or not words:
        return None
    return remote.failure_kind(host.name, words) or "crashed", words

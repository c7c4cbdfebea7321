"""Serve in the app: ``gaudi-gui serve … --detach``, the agent's job with a run folder, followed
(``KindJob``).

The view gives this service a ``core.serve.ServeSpec`` (and where it runs, a ``Placement``: this machine,
or a saved host whose agent starts it) and binds to what comes back: the state (starting, loading,
warming, ready, stopped, failed), the warm-up fraction with its ETA, the endpoint URL, each request from
the engine's access log. Stop is ``job.stop`` (the command ends the engine's whole tree and frees the
port). The server outlives the window when the user leaves it running, and the next window re-attaches
to it (``reattach``). A host's endpoint is its own loopback: this machine's agent forwards a port here to
it (``hosts.forward``), asked again when a lost connection is back.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from PySide6.QtCore import QObject, QTimer, Signal

from gaudi_gui.core.events import EventType
from gaudi_gui.core.placement import Forward, Placement
from gaudi_gui.core.serve import (
    EngineChoice,
    ServeSpec,
    choose_engine,
    device_here,
    endpoint_url,
    port_free,
    vllm_here,
)
from gaudi_gui.services.device_selection import DeviceSelection
from gaudi_gui.services.endpoint_chat import EndpointChat
from gaudi_gui.services.forwards import request_forward
from gaudi_gui.services.kind_job import KindJob

#: Tries of the agent's forward (1 s, then 2 s apart) before the forward is said to have failed.
FORWARD_ATTEMPTS = 3
#: The settings key of the ports of the servers on hosts left running (what only the window knows).
FORWARDS_KEY = "serve/host_forwards"


class ServeService(KindJob):
    #: (state, message): starting, loading, warming, ready, stopped, failed.
    state_changed = Signal(str, str)
    #: (fraction 0-1, seconds left or -1 while unknown, "Prompt 3/24").
    progress = Signal(float, float, str)
    #: The endpoint answers: its URL (``http://127.0.0.1:PORT/v1``).
    url_ready = Signal(str)
    #: One request: time, method, path, status (tokens / TTFT where the engine prints them).
    request = Signal(dict)
    #: (field or "", message) for refused input, a failed start, a server that ended by itself.
    failed = Signal(str, str)
    #: The child is gone: (stopped by the user).
    finished = Signal(bool)

    KIND = "serve"
    COMMAND = "serve"

    def __init__(self, parent: QObject | None = None) -> None:
        super().__init__(parent)
        self.url = ""
        #: The id the server answers to (what a request's "model" must be, or leave out).
        self.model_id = ""
        #: The model as the user chose it (``builtin:demo``, a Hub id, a folder): what the window names.
        self.model_name = ""
        #: The longest request the server takes, prompt and answer, in tokens (0: not known): the chat
        #: leaves out its oldest turns to stay within it.
        self.context_length = 0
        self.state = "stopped"
        #: The environment variable holding the server's API key ("" for none): the chat sends it.
        self.api_key_env = ""
        #: The runner's chat through this server (``chat.generate(self.url, self.model_id, …)``).
        self.chat = EndpointChat(self)
        #: The name of the server's claim on its cards ("Serve :8000").
        self.claim_name = ""
        self._selection: DeviceSelection | None = None
        self._claim_ids: list[int] = []
        self._failure: dict[str, Any] | None = None
        #: A host's endpoint forwarded to this machine (None here).
        self._forward: Forward | None = None
        self._forward_attempts = 0
        #: The requests of the running server so far (what a panel opened later shows).
        self.requests: list[dict[str, Any]] = []

    def engine_choice(self, engine: str, device: str, probed: str = "cpu") -> EngineChoice:
        """Which engine a start here would use, and why (ServeError: vLLM asked for, not importable).
        ``probed``: where the environment probe says jobs run here (what "auto" means; the window's
        thread never starts a probe of its own)."""
        return choose_engine(engine, vllm_importable=vllm_here(), device=device_here(device, probed))

    def start(self, spec: ServeSpec, placement: Placement | None = None, *,
              remote_port: int = 0, selection: DeviceSelection | None = None) -> list[tuple[str, str]]:
        """Start the server; the problems at their fields instead (nothing started then). With the
        placement's card ``selection``, the server holds its cards there while it runs (a claim the
        Devices and Hosts views show, and other starts warn about)."""
        if self.is_running():
            return [("", "a server is already running: stop it first")]
        problems = spec.problems(local=placement is None or placement.is_local)
        if problems:
            return problems
        self.url, self._failure, self.requests = "", None, []
        self.model_name, self.context_length = spec.model.strip(), 0
        self.api_key_env = spec.api_key_env
        self._release()
        self._selection = selection
        self._claim_ids = list(spec.cards) if spec.cards else (selection.job_ids() if selection else [])
        self.claim_name = f"Serve :{spec.port}"
        placement = placement or Placement.local()
        self._forward = None
        if placement.is_local:
            self._set_state("starting", "starting")
            self.start_words(spec.cli_args())
            return []
        # On a host: the host's own serve --detach (its supervisor outlives the connection), reached
        # here through a forward of spec.port that this machine's agent holds, asked for once it answers.
        if not port_free(spec.port):
            return [("port", f"port {spec.port} is already taken here; choose another")]
        self._forward = Forward(spec.port, remote_port or spec.port)
        self._set_state("starting", f"starting on {placement.host.name}")
        self.start_words(dataclasses.replace(spec, port=self._forward.remote_port).cli_args(), placement.host)
        return []

    def attached(self, record: dict[str, Any]) -> None:
        job_id = str(record.get("job_id") or "")
        self.url, self._failure, self.requests, self._forward = "", None, [], None
        if self.host.is_local:
            self.claim_name = f"Serve (re-attached {job_id})"
            self._set_state("starting", f"following the server of {job_id}, left running earlier")
            return
        self._forward = self._kept_forward(job_id, str(record.get("url") or ""))
        self.claim_name = f"Serve on {self.host.name}"
        self._set_state("starting", f"following the server on {self.host.name}, left running earlier")

    def _kept_forward(self, job_id: str, url: str) -> Forward | None:
        """The forward of a host's server left running: the ports kept at exit, else its own port here."""
        for kept in self._forwards():
            ports = kept.get("ports")
            if (kept.get("host"), kept.get("job_id")) == (self.host.name, job_id) \
                    and isinstance(ports, list) and [type(p) for p in ports] == [int, int]:
                self._keep_forwards([k for k in self._forwards() if k is not kept])
                return Forward(ports[0], ports[1])
        port = url.rsplit(":", 1)[-1].split("/", 1)[0]
        return Forward(int(port), int(port)) if port.isdigit() else None

    def _forwards(self) -> list[dict[str, Any]]:
        kept = self.settings.get(FORWARDS_KEY) if self.settings is not None else []
        return [k for k in kept or [] if isinstance(k, dict)]

    def _keep_forwards(self, kept: list[dict[str, Any]]) -> None:
        if self.settings is not None:
            self.settings.set(FORWARDS_KEY, kept)

    def detach_jobs(self) -> list[str]:
        forward, job_id, host = self._forward, self.job.job_id, self.host
        left = super().detach_jobs()
        if left and forward is not None and not host.is_local:
            others = [k for k in self._forwards() if (k.get("host"), k.get("job_id")) != (host.name, job_id)]
            self._keep_forwards([*others, {"host": host.name, "job_id": job_id,
                                           "ports": [forward.local_port, forward.remote_port]}])
        return left

    def link_changed(self, state: str, words: str) -> None:
        # Lost: the job goes on there (a host's forward went with the connection); back: followed again.
        self._set_state(self.state, words)
        if state != "up":
            return
        if self.model_id and not self.host.is_local:
            self._ask_forward()  # the endpoint was announced: forward it again on the new connection
        elif self.url:
            self.url_ready.emit(self.url)

    def _ask_forward(self, cancel: bool = False) -> None:
        """The host's endpoint forwarded here (or given back), asked of this machine's agent (it runs
        the forward on its connection to the host; the window never waits for it); the URL is said
        once the forward is made."""
        if self._forward is None:
            return
        attempt = self._forward_attempts = 0 if cancel else self._forward_attempts + 1
        url = endpoint_url(self._forward.local_port)
        request_forward(self.host.name, self._forward, None if cancel else
                        lambda ok, why: self._forwarded(url, ok, why, attempt), cancel=cancel)

    def _forwarded(self, url: str, ok: bool, why: str, attempt: int) -> None:
        if not ok and self.is_running() and attempt < FORWARD_ATTEMPTS:
            # A connection that is being made again refuses for a moment: asked again, with back-off.
            QTimer.singleShot(int(1000 * attempt), self, self._ask_forward)
            return
        if not ok or not self.is_running():
            self.failed.emit("", f"the forward of {url} to {self.host.name} failed"
                                 f"{': ' + why if why else ' (the server ended)'}")
            return
        self._forward_attempts = 0
        self.url = url
        self.url_ready.emit(url)
    # -- JobOwner (services/jobs.py) ----------------------------------------------------------------

    def active_jobs(self) -> list[str]:
        if not self.is_running():
            return []
        where = f"at {self.url}" if self.url else f"({self.state})"
        return [f"Serve: {self.model_name or self.model_id or 'a model'} {where}"]

    def _set_state(self, state: str, message: str) -> None:
        self.state = state
        self.state_changed.emit(state, message)

    def take_event(self, message: dict[str, Any]) -> None:
        kind = message.get("type")
        if kind == EventType.SERVE_STATE:
            state = str(message.get("state", ""))
            if state == "failed":
                self._failure = message
                return
            if state == "stopped":
                # The server is down, but its job is not over until its supervisor has recorded the
                # end (take_end): "stopped" said now would let the window close and then ask about
                # a server it had just called stopped.
                self._set_state("stopping", "the server stopped; recording its end…")
                return
            self._set_state(state, str(message.get("message", "")))
        elif kind == EventType.SERVE_PROGRESS:
            eta = message.get("eta_s")
            label = f"{message.get('phase', '')} {message.get('step', 0)}/{message.get('total', 0)}"
            self.progress.emit(float(message.get("fraction") or 0.0),
                               float(eta) if isinstance(eta, (int, float)) else -1.0, label)
        elif kind == EventType.SERVE_URL:
            self.model_id = str(message.get("model", ""))
            # A server re-attached from an earlier window: its own event says what the user chose.
            self.model_name = str(message.get("name") or self.model_name or self.model_id)
            context = message.get("context")
            self.context_length = context if isinstance(context, int) and not isinstance(context, bool) \
                and context > 0 else 0
            if self._selection is not None:
                self._selection.claim(self.claim_name, self._claim_ids)
            if not self.host.is_local:
                self._ask_forward()  # the host's URL is its own loopback: the forward's end is here
                return
            self.url = str(message.get("url", ""))
            self.url_ready.emit(self.url)
        elif kind == EventType.SERVE_REQUEST:
            self.requests = [*self.requests[-499:], message]
            self.request.emit(message)

    def ready(self) -> bool:
        """The endpoint answers (the chat can talk to it)."""
        return self.state == "ready" and bool(self.url)

    def generate(self, params: Any, *, messages: list[dict[str, str]] | None = None,
                 prompt: str | None = None) -> bool:
        """One streamed answer from the running server (``chat``'s signals carry it)."""
        if not self.ready():
            return False
        return self.chat.generate(self.url, self.model_id, params, api_key_env=self.api_key_env,
                                  messages=messages, prompt=prompt, context=self.context_length)

    def _release(self) -> None:
        if self._selection is not None and self.claim_name:
            self._selection.release(self.claim_name)
        self._selection = None

    def take_end(self, state: str, summary: str) -> None:
        if not self.host.is_local:
            self._ask_forward(cancel=True)  # the connection would hold the local port until it ends
        self.chat.cancel()
        self._release()
        self.url = ""
        stopped = bool(self.stop_sent)
        if state in ("stopped", "finished") and self._failure is None:
            self._set_state("stopped", summary.removeprefix("Stopped: ").removeprefix("Stopped") or "stopped")
        else:
            failure = self._failure or {}
            message = str(failure.get("message") or summary.removeprefix("Failed: "))
            lines = [str(t) for t in (failure.get("lines") or [])][-4:]
            if lines and not message.startswith("--"):
                message += ": " + " | ".join(lines)
            field = ""
            head, sep, rest = message.partition(": ")
            if head.startswith("--") and sep:  # "--port: port 8000 is already taken ..."
                field, message = head[2:].replace("-", "_"), rest
            self._set_state("failed", message)
            self.failed.emit(field, message)
        self.finished.emit(stopped)

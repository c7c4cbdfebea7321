"""The model runner's worker: ``python -m gaudi_gui.workers.generate``.

Reads commands (``gaudi_gui.core.generation``: load, generate, cancel, unload, shutdown) as protocol
lines on stdin and writes events to stdout. Library noise (transformers warnings, stray prints) must
never corrupt the protocol stream, so at start the original stdout fd is duplicated for the protocol
and fd 1 is pointed at stderr.

Threads: a reader thread parses stdin, so a ``cancel`` arrives while the main thread is generating;
it only marks requests cancelled, and a StoppingCriteria checks that after every token, so the worker
really stops within one token step. A cancel names a request id (or, without one, every generate
received before it), so a generate sent right after a cancel never revives the cancelled one.
``model.generate`` runs in the main thread with a streamer (``_Detokenizer``) whose callback writes
token events (measured: a TextIteratorStreamer drained from a second thread halves a small model's
decoding rate); the ids are decoded and the events sent at most once per ~20 ms, the first token of an
answer always at once. Stop
strings are generate's own ``stop_strings``. The model stays loaded between prompts; a failed load
keeps the previous model.

The worker ends itself when its parent goes: stdin EOF (also over SSH, where no signal arrives) and,
on Linux, PR_SET_PDEATHSIG. SIGINT (Ctrl+C in a terminal reaches the whole process group) cancels the
answer and exits with 130, without a traceback.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import queue
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import urlparse

from gaudi_gui.core import generation, paths, protocol
from gaudi_gui.core.generation import GenerationParams, LoadOptions

#: Token events are coalesced: at most one per this many seconds (the first of an answer at once).
FLUSH_INTERVAL_S = 0.02
#: How long the Hub reachability probe may take before a load is called offline.
HUB_PROBE_TIMEOUT_S = 3.0
#: After stdin closes or SIGINT, how long the main thread gets to finish before the process ends anyway
#: (a load or a compile cannot be interrupted).
EXIT_GRACE_S = 3.0
#: A command line longer than this is refused (and skipped) instead of read into memory.
MAX_COMMAND_BYTES = 16 << 20

class WorkerError(Exception):
    """An error with a kind from ``generation.ERROR_KINDS``, reported as an 'error' event."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class Output:
    """The protocol stream: a private dup of the original stdout, written under a lock."""

    def __init__(self) -> None:
        fd = os.dup(1)
        # From here on anything printed to fd 1 (by us or a C library) lands on stderr.
        os.dup2(2, 1)
        sys.stdout = sys.stderr
        self._file = os.fdopen(fd, "w", encoding="utf-8", buffering=1)
        self._lock = threading.Lock()

    def emit(self, event_type: str, /, **fields: Any) -> None:
        line = protocol.encode({"type": event_type, **fields})
        with self._lock:
            try:
                self._file.write(line + "\n")
                self._file.flush()
            except (BrokenPipeError, ValueError):
                pass  # the parent is gone; the reader sees EOF and we shut down


_OOM_PATTERNS = ("out of memory", "can't allocate memory", "cannot allocate memory",
                 "not enough memory", "failed to allocate", "allocation failed", "insufficient memory",
                 "pt_devmem", "resource_exhausted")


def _is_oom(exc: BaseException) -> bool:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__
        text = str(current).lower()
        if isinstance(current, MemoryError) or name in ("OutOfMemoryError", "OOMError") \
                or any(p in text for p in _OOM_PATTERNS):
            return True
        current = current.__cause__ or current.__context__
    return False


def _first_line(text: str, limit: int = 400) -> str:
    lines = text.strip().splitlines()
    return lines[0][:limit] if lines else ""


def _classify(exc: BaseException, model: str = "") -> WorkerError:
    """Turn a library exception into a kind and a sentence the user can act on."""
    if isinstance(exc, WorkerError):
        return exc
    text = str(exc) or type(exc).__name__
    name = type(exc).__name__
    if _is_oom(exc):
        # Before the OSError branch: the CPU allocator's "Cannot allocate memory" is errno 12 text.
        return WorkerError("out_of_memory", f"out of memory: {_first_line(text, 300)}. Try a smaller "
                           "model, fewer new tokens, bf16 or 4-bit quantization, or free the device.")
    if isinstance(exc, OSError):
        lowered = text.lower()
        if _offline() and not os.path.isdir(os.path.expanduser(model)):
            return WorkerError("no_network", f"'{model}' is not a local folder and not in the Hugging Face "
                               "cache, and offline mode is on (HF_HUB_OFFLINE=1): download it first "
                               "or give a folder.")
        if any(w in lowered for w in ("connection", "resolve", "timed out", "network", "offline")):
            return WorkerError("no_network", f"could not reach the Hugging Face Hub for '{model}': "
                               f"{_first_line(text, 300)}")
        return WorkerError("missing_model", f"could not load '{model}': {_first_line(text)}")
    if isinstance(exc, ImportError):
        return WorkerError("unsupported", f"a library is missing: {text[:300]}")
    if isinstance(exc, (ValueError, TypeError)):
        return WorkerError("bad_parameters", _first_line(text) or name)
    return WorkerError("internal", f"{name}: {_first_line(text)}")


def _offline() -> bool:
    return any(os.environ.get(var, "").strip().lower() in ("1", "true", "yes", "on")
               for var in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"))


def _hub_address() -> tuple[str, int]:
    """Where a Hub request would first connect: the HTTPS proxy when one is set, else the endpoint."""
    for var in ("HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy"):
        if os.environ.get(var):
            url = urlparse(os.environ[var] if "://" in os.environ[var] else "http://" + os.environ[var])
            return url.hostname or "", url.port or 80
    url = urlparse(os.environ.get("HF_ENDPOINT") or "https://huggingface.co")
    return url.hostname or "", url.port or (80 if url.scheme == "http" else 443)


def _reachable(host: str, port: int, timeout: float) -> str | None:
    """None when a TCP connection to host:port opens within ``timeout`` s, else why not. Runs in a
    thread joined with the timeout, because name resolution ignores socket timeouts."""
    result: list[str | None] = []

    def probe() -> None:
        try:
            with socket.create_connection((host, port), timeout=timeout):
                result.append(None)
        except OSError as exc:
            result.append(str(exc) or type(exc).__name__)

    thread = threading.Thread(target=probe, name="hub-probe", daemon=True)
    thread.start()
    thread.join(timeout + 0.5)
    return result[0] if result else f"no answer within {timeout:.0f} s"


class _Detokenizer:
    """A streamer for ``generate`` (its ``put``/``end``) that turns the new token ids into text for
    ``on_text``: the first at once, then at most once per ``FLUSH_INTERVAL_S`` (the token events are
    coalesced that way anyway). HF's TextStreamer decoded every token id since the last newline at
    every token: 38 µs a token of the demo model, growing with the line, on the thread that generates
    (the decode rate through the app was 5% under a plain ``generate``). Here a decode covers only
    the ids since the last one, with the ids of the one before as context (how a piece reads can
    depend on what comes before it: a leading space), and text that ends inside a character (a
    byte-level piece of a multi-byte character: U+FFFD) waits for the next ids."""

    def __init__(self, tokenizer: Any, on_text: Callable[[str], None], *,
                 interval_s: float = FLUSH_INTERVAL_S) -> None:
        self.tokenizer = tokenizer
        self.on_text = on_text
        self.interval_s = interval_s
        self.prompt_left = True  # generate's first put is the prompt: not shown
        self.ids: list[int] = []
        self.prefix = 0  # the ids decoded as context only (already sent)
        self.read = 0  # the ids whose text was sent
        self.due = 0.0

    def put(self, value: Any) -> None:
        if self.prompt_left:
            self.prompt_left = False
            return
        ids = value.tolist()
        self.ids.extend(ids[0] if ids and isinstance(ids[0], list) else ids)
        now = time.perf_counter()
        if now >= self.due:
            self.due = now + self.interval_s
            self._send(final=False)

    def end(self) -> None:
        self._send(final=True)

    def _decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids, skip_special_tokens=True))

    def _send(self, *, final: bool) -> None:
        if len(self.ids) == self.read:
            return
        before = self._decode(self.ids[self.prefix:self.read]) if self.read > self.prefix else ""
        text = self._decode(self.ids[self.prefix:])
        if text.endswith("\ufffd") and not final:
            return
        if len(text) > len(before):
            self.on_text(text[len(before):])
        self.prefix, self.read = self.read, len(self.ids)


class _Pieces:
    """Streams one answer's text as token events, with possible stop-string starts held back and the
    text from a stop string on never shown. What it is fed is sent at once: the pacing (one event per
    ``FLUSH_INTERVAL_S``) is the streamer's (``_Detokenizer``), one clock, not a second one here that
    could hold a piece back a whole interval when the two readings of the time differed by a little."""

    def __init__(self, out: Output, request_id: Any, stops: list[str]) -> None:
        self.out = out
        self.request_id = request_id
        self.stops = stops
        self.keep = max((len(s) for s in stops), default=1) - 1  # sent text a stop may begin in
        self.pending = ""
        self.tail = ""  # the last ``keep`` characters already sent
        self.shown: list[str] = []
        self.hit = False

    def feed(self, piece: str) -> None:
        if self.hit or not piece:
            return
        self.pending += piece
        ready = self.pending
        if self.stops:
            window = self.tail + self.pending
            cuts = [window.find(s) for s in self.stops if s in window]
            if cuts:
                # Text before a stop string is shown; from it on, never (generate stops right there).
                self.pending = window[:min(cuts)][len(self.tail):]
                self.hit = True
                self.flush()
                return
            hold = 0
            for s in self.stops:
                for n in range(min(len(s) - 1, len(window)), 0, -1):
                    if window.endswith(s[:n]):
                        hold = max(hold, n)
                        break
            ready = self.pending[:len(self.pending) - min(hold, len(self.pending))]
        if ready:
            self._send(ready)
            self.pending = self.pending[len(ready):]

    def flush(self) -> None:
        """Send what is pending (the end of an answer)."""
        if self.pending:
            self._send(self.pending)
            self.pending = ""

    def _send(self, text: str) -> None:
        self.out.emit("token", text=text, id=self.request_id)
        self.shown.append(text)
        if self.keep:
            self.tail = (self.tail + text)[-self.keep:]

    def text(self) -> str:
        return "".join(self.shown)


class Worker:
    def __init__(self, out: Output) -> None:
        self.out = out
        self.commands: queue.Queue[dict[str, Any]] = queue.Queue()
        self._cancel_lock = threading.Lock()
        self._cancel_epoch = 0              # bumped by an id-less cancel, unload, shutdown
        self._cancelled_ids: set[Any] = set()
        self._exit_requested = False
        self.model: Any = None
        self.tokenizer: Any = None
        self.device = "cpu"
        self.options: LoadOptions | None = None
        self.load_info: dict[str, Any] = {}

    # -- cancel semantics -------------------------------------------------------------------------------

    def is_cancelled(self, message: dict[str, Any]) -> bool:
        """Whether this generate was cancelled: by its id, or by an id-less cancel received after it."""
        return (message.get("_epoch") != self._cancel_epoch
                or ("id" in message and message["id"] in self._cancelled_ids))

    def _cancel_all(self) -> None:
        with self._cancel_lock:
            self._cancel_epoch += 1

    # -- stdin ------------------------------------------------------------------------------------------

    def read_commands(self) -> None:
        """Reader thread: cancel acts at once; everything else queues for the main thread, in order.
        No line, however malformed (deep nesting, bad UTF-8, huge), stops this loop."""
        stdin = sys.stdin.buffer
        skipping = False
        while True:
            try:
                raw = stdin.readline(MAX_COMMAND_BYTES)
            except (OSError, ValueError):
                break
            if not raw:
                break
            if skipping or (len(raw) >= MAX_COMMAND_BYTES and not raw.endswith(b"\n")):
                if not skipping:
                    self.out.emit("error", kind="protocol",
                                  message=f"command line longer than {MAX_COMMAND_BYTES} bytes: ignored")
                skipping = not raw.endswith(b"\n")
                continue
            try:
                self._take(raw.decode("utf-8", errors="replace"))
            except Exception as exc:  # RecursionError, MemoryError-free oddities: report, keep reading
                self.out.emit("error", kind="protocol",
                              message=f"bad command line ({type(exc).__name__}): {str(exc)[:200]}")
        self.request_exit(0, "stdin closed")

    def _take(self, line: str) -> None:
        message = protocol.decode(line)
        if message is None or "cmd" not in message:
            return
        name = message["cmd"]
        if name == "cancel":
            with self._cancel_lock:
                if message.get("id") is None:
                    self._cancel_epoch += 1
                else:
                    self._cancelled_ids.add(message["id"])
            return
        if name == "generate":
            # Stamped on arrival: an id-less cancel cancels what came before it, never what comes after.
            message["_epoch"] = self._cancel_epoch
        elif name in ("unload", "shutdown"):
            self._cancel_all()
        self.commands.put(message)

    def request_exit(self, code: int, reason: str) -> None:
        """End the worker soon: cancel everything, queue a shutdown, and if the main thread cannot get
        to it within EXIT_GRACE_S (a load or compile in progress), end the process anyway."""
        with self._cancel_lock:
            if self._exit_requested:
                return
            self._exit_requested = True
        self._cancel_all()
        self.commands.put({"cmd": "shutdown", "reason": reason, "code": code})

        def deadline() -> None:
            time.sleep(EXIT_GRACE_S)
            self.out.emit("exiting", reason=f"{reason} (did not finish within {EXIT_GRACE_S:.0f} s)")
            with contextlib.suppress(Exception):
                sys.stderr.flush()
            os._exit(code)

        threading.Thread(target=deadline, name="exit-deadline", daemon=True).start()

    def install_signal_handlers(self) -> None:
        """SIGINT -> cancel and exit 130. The Python-level handler only wakes a thread through the
        wakeup fd, so it works while the main thread is deep inside a C call (loading, a matmul) and
        never raises KeyboardInterrupt into torch (whose teardown then aborts with SIGABRT)."""
        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)
        signal.signal(signal.SIGINT, lambda signum, frame: None)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)

        def watch() -> None:
            while True:
                data = os.read(read_fd, 64)
                if not data or signal.SIGINT in data:
                    break
            self.request_exit(128 + signal.SIGINT, "interrupted (SIGINT)")

        threading.Thread(target=watch, name="signal-watch", daemon=True).start()

    def run(self) -> int:
        from gaudi_gui import __version__
        # The version lets a client on another machine refuse a worker that is not its own.
        self.out.emit("ready", pid=os.getpid(), protocol=protocol.PROTOCOL_VERSION, gaudi_gui=__version__)
        threading.Thread(target=self.read_commands, name="stdin-reader", daemon=True).start()
        while True:
            message = self.commands.get()
            name = message.get("cmd")
            if name == "shutdown":
                self.unload(quiet=True)
                self.out.emit("exiting", reason=message.get("reason", "shutdown"))
                code = message.get("code", 0)
                return code if isinstance(code, int) else 0
            try:
                if name == "load":
                    self.load(LoadOptions.from_dict(message.get("options") or {}))
                elif name == "generate":
                    self.generate(message)
                elif name == "unload":
                    self.unload()
                else:
                    raise WorkerError("protocol", f"unknown command {name!r}")
            except Exception as exc:
                model = self.options.model if self.options else ""
                if name == "load":
                    options = message.get("options")
                    model = str(options.get("model", "")) if isinstance(options, dict) else ""
                error = _classify(exc, model)
                if name == "load":
                    # A failed load keeps the model that was loaded before; drop the half-built one.
                    self._collect()
                    if error.kind == "out_of_memory" and self.model is not None:
                        error = WorkerError(error.kind, f"{error} The previous model is still loaded: "
                                            "unload it first to make room.")
                self.out.emit("error", kind=error.kind, message=str(error), command=name,
                              request_id=message.get("id"), loaded=self.model is not None)

    # -- loading ----------------------------------------------------------------------------------------

    def _stage(self, started: float, stage: str, **fields: Any) -> None:
        self.out.emit("loading", stage=stage, elapsed_s=round(time.perf_counter() - started, 3), **fields)

    @contextlib.contextmanager
    def _demo_progress(self, started: float) -> Iterator[None]:
        """Relay the demo builder's progress as loading events. The builder prints its own protocol
        events to stdout, which in this process is stderr: they would never reach the parent as
        progress. It has no callback parameter, so its module-level emitter is swapped for the build."""
        from gaudi_gui.workers import demo

        original: Callable[..., None] = demo._emit

        def relay(kind: str, **fields: object) -> None:
            if kind == "demo_progress":
                step, steps = int(str(fields.get("step") or 0)), int(str(fields.get("steps") or 0))
                self._stage(started, f"building the demo model (first use only): step {step}/{steps}",
                            progress=[step, steps])

        demo._emit = relay
        try:
            yield
        finally:
            demo._emit = original

    def _check_hub(self, model_id: str, started: float) -> bool:
        """Before importing torch (seconds): can ``model_id`` be loaded at all? True means load it from
        the local cache only. Fails at once when offline mode is on and the model is not cached, and
        within HUB_PROBE_TIMEOUT_S when the Hub cannot be reached (instead of 40-60 s of retries)."""
        self._stage(started, "checking the Hugging Face cache and Hub")
        try:
            from huggingface_hub import try_to_load_from_cache
            cached = isinstance(try_to_load_from_cache(model_id, "config.json"), str)
        except ValueError as exc:  # HFValidationError: not a valid repo id
            raise WorkerError("missing_model", f"'{model_id}' is neither a model folder nor a valid Hub "
                              f"id (org/name): {_first_line(str(exc), 200)}") from exc
        except ImportError:
            return False
        if _offline():
            if cached:
                return True
            raise WorkerError("no_network", f"'{model_id}' is not in the local Hugging Face cache and "
                              "offline mode is on (HF_HUB_OFFLINE=1): download it first "
                              f"(hf download {model_id}) or give a model folder.")
        host, port = _hub_address()
        problem = _reachable(host, port, HUB_PROBE_TIMEOUT_S)
        if problem is None:
            return False
        if cached:
            self.out.emit("info", message=f"the Hub ({host}:{port}) is unreachable ({problem}): using the "
                          f"cached copy of {model_id}")
            return True
        raise WorkerError("no_network", f"cannot reach the Hugging Face Hub ({host}:{port}: {problem}) and "
                          f"'{model_id}' is not in the local cache: connect, set HF_ENDPOINT or a proxy, "
                          "or give a model folder.")

    def load(self, options: LoadOptions) -> None:
        """Load ``options.model``; the current model stays loaded (and in use) until the new one is
        ready, so a failed load changes nothing."""
        problems = options.validate()
        if problems:
            raise WorkerError("bad_parameters", "; ".join(problems))
        started = time.perf_counter()
        model_path = options.model.strip()
        local_only = False
        #: A LoRA adapter folder (a training run's adapter/): its base model is loaded and the adapter
        #: applied over it, unmerged.
        adapter_dir = ""
        if paths.is_demo(model_path):
            pass
        else:
            expanded = os.path.expanduser(model_path)
            looks_local = model_path.startswith((".", "/", "~")) or os.path.isabs(expanded)
            if looks_local and not os.path.isdir(expanded):
                raise WorkerError("missing_model", f"model folder not found: {model_path}")
            if os.path.isdir(expanded):
                model_path = expanded
                adapter_dir = expanded if os.path.isfile(os.path.join(expanded, "adapter_config.json")) \
                    else ""
                if not adapter_dir and not os.path.isfile(os.path.join(expanded, "config.json")):
                    raise WorkerError("missing_model", f"{model_path} has no config.json: not a model folder")
            else:
                local_only = self._check_hub(model_path, started)
        self._stage(started, "importing torch and transformers")
        import torch

        from gaudi_gui.workers import loader
        try:
            device = loader.resolve_device(options.device)
            how = loader.plan(device, dtype=options.dtype, quantization=options.quantization)
        except loader.LoadError as exc:
            raise WorkerError(exc.kind, str(exc)) from None

        if paths.is_demo(model_path):
            self._stage(started, "building the demo model (first use only)")
            from gaudi_gui.workers.demo import resolve_model
            with self._demo_progress(started):
                model_path = resolve_model(model_path)

        base_path = model_path
        if adapter_dir:
            import json
            try:
                with open(os.path.join(adapter_dir, "adapter_config.json"), encoding="utf-8") as fh:
                    base_path = str(json.load(fh).get("base_model_name_or_path") or "")
            except (OSError, ValueError) as exc:
                raise WorkerError("missing_model", f"cannot read {adapter_dir}/adapter_config.json: "
                                                   f"{exc}") from None
            if not base_path:
                raise WorkerError("missing_model", f"{adapter_dir}: the adapter names no base model")
        try:
            model, tokenizer = loader.load(base_path, how, tokenizer_path=model_path, adapter=adapter_dir,
                                           trust_remote_code=options.trust_remote_code,
                                           local_files_only=local_only,
                                           stage=lambda text: self._stage(started, text))
        except loader.LoadError as exc:
            raise WorkerError(exc.kind, str(exc)) from None
        if options.compile:
            self._stage(started, "compiling (torch.compile)")
            if device == "hpu":
                self.out.emit("info", message="on Gaudi transformers runs torch.compile with the "
                              "hpu_backend backend")
            model.forward = torch.compile(model.forward, dynamic=True)
            # Compile now, so a compiler failure is a load error and the first answer is not slow.
            ids = tokenizer("warm up", return_tensors="pt").to(device)
            with torch.inference_mode():
                model.generate(**ids, max_new_tokens=2, do_sample=False,
                               pad_token_id=tokenizer.pad_token_id)
        # Only now is the previous model let go.
        previous_device = self.device
        self.model, self.tokenizer, self.device, self.options = model, tokenizer, device, options
        self._collect(previous_device)
        memory, memory_kind = self._memory()
        self.load_info = {
            "model": options.model, "path": model_path, "device": device, "dtype": how.dtype,
            "quantization": how.quantization, "compile": options.compile,
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "load_s": round(time.perf_counter() - started, 3), "memory_bytes": memory,
            "memory_kind": memory_kind, "chat_template": bool(getattr(tokenizer, "chat_template", None)),
            "model_type": getattr(model.config, "model_type", ""),
        }
        if adapter_dir:
            self.load_info.update(adapter=adapter_dir, base=base_path)
        self.out.emit("loaded", **self.load_info)

    def _memory(self) -> tuple[int, str]:
        """Device memory in use: the accelerator's allocator, or this process's RSS on CPU."""
        import torch
        with contextlib.suppress(Exception):
            if self.device == "cuda":
                return int(torch.cuda.memory_allocated()), "cuda allocated"
            if self.device == "hpu":
                return int(torch.hpu.memory_allocated()), "hpu allocated"  # type: ignore[attr-defined]
        import psutil
        return int(psutil.Process().memory_info().rss), "process RSS"

    def _collect(self, device: str | None = None) -> None:
        """Free what no longer has a reference (a replaced or half-loaded model)."""
        import gc
        gc.collect()
        if (device or self.device) == "cuda" and "torch" in sys.modules:
            with contextlib.suppress(Exception):
                sys.modules["torch"].cuda.empty_cache()

    def unload(self, quiet: bool = False) -> None:
        was_loaded = self.model is not None
        self.model = self.tokenizer = self.options = None
        self.load_info = {}
        if was_loaded:
            self._collect()
        if not quiet:
            self.out.emit("unloaded")

    # -- generating -------------------------------------------------------------------------------------

    def context(self) -> int | None:
        """The loaded model's context in tokens: the smaller of its config's max_position_embeddings and
        its tokenizer's model_max_length (``generation.context_of``)."""
        config = getattr(self.model, "config", None)
        as_dict = config.to_dict() if config is not None and hasattr(config, "to_dict") else {}
        return generation.context_of(as_dict, {"model_max_length": getattr(self.tokenizer,
                                                                           "model_max_length", None)})

    def _chat_inputs(self, messages: list[dict[str, str]]) -> Any:
        tokenizer = self.tokenizer
        if getattr(tokenizer, "chat_template", None):
            return tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                 return_dict=True, return_tensors="pt")
        text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages) + "Assistant:"
        return tokenizer(text, return_tensors="pt")

    def _inputs(self, message: dict[str, Any], params: GenerationParams | None = None,
                fitted: dict[str, Any] | None = None) -> Any:
        """The model's inputs; a conversation longer than the model's context loses its oldest turns
        (how many, and the context, go into ``fitted``): past it the model's answers are noise, and a
        chat that grew past it would otherwise end there for good."""
        tokenizer = self.tokenizer
        if "messages" in message:
            try:
                messages = generation.parse_messages(message["messages"])
            except ValueError as exc:
                raise WorkerError("bad_parameters", str(exc)) from exc
            if not getattr(tokenizer, "chat_template", None):
                # Fallback, announced: a base model has no template, so join the turns as plain text.
                self.out.emit("info", message="this model has no chat template: the conversation is sent "
                              "as plain 'Role: text' lines")
            context = self.context()
            if context is not None and params is not None:
                budget = generation.prompt_budget(context, params.max_new_tokens)
                try:
                    messages, left_out = generation.fit_messages(
                        messages, lambda kept: int(self._chat_inputs(kept)["input_ids"].shape[-1]), budget)
                except generation.ContextError as exc:
                    raise WorkerError("bad_parameters", exc.said(context)) from None
                if fitted is not None:
                    fitted.update(context=context, left_out=left_out)
            return self._chat_inputs(messages)
        prompt = message.get("prompt")
        if not isinstance(prompt, str):
            raise WorkerError("bad_parameters", "generate needs a prompt (text) or messages")
        if generation.prompt_problem(prompt):
            raise WorkerError("bad_parameters", generation.EMPTY_PROMPT)
        return tokenizer(prompt, return_tensors="pt")

    def generate(self, message: dict[str, Any]) -> None:
        received = time.perf_counter()
        if self.model is None:
            raise WorkerError("not_loaded", "no model is loaded: load one first")
        params, problems = GenerationParams.parse(message.get("params") or {})
        if problems:
            raise WorkerError("bad_parameters", "; ".join(problems))
        request_id = message.get("id")
        if self.is_cancelled(message):
            # Cancelled while it waited in the queue: nothing to generate.
            self.out.emit("finished", id=request_id, stats={
                "ttft_s": None, "tokens": 0, "prompt_tokens": 0, "decode_tokens_per_s": None,
                "total_s": round(time.perf_counter() - received, 6), "stop_reason": "cancelled",
                "streamed": params.streams})
            return
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList

        fitted: dict[str, Any] = {}
        inputs = self._inputs(message, params, fitted).to(self.device)
        prompt_len = int(inputs["input_ids"].shape[-1])
        if prompt_len == 0:
            raise WorkerError("bad_parameters", f"{generation.EMPTY_PROMPT}: the prompt has no tokens")
        room = fitted["context"] - prompt_len if fitted else None
        stamps: list[float] = []
        stops = list(dict.fromkeys(s for s in params.stop if s))
        pieces = _Pieces(self.out, request_id, stops)
        is_cancelled = self.is_cancelled
        verdicts: dict[tuple[int, bool], Any] = {}

        recorder = _GenerationProfile(params.max_new_tokens) if message.get("profile") else None

        class _Flag(StoppingCriteria):
            # Called once per generated token, in the generation thread: keep it cheap (cached tensors).
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                stamps.append(time.perf_counter())
                if recorder is not None:
                    recorder.step()
                done = pieces.hit or is_cancelled(message)
                key = (int(input_ids.shape[0]), done)
                verdict = verdicts.get(key)
                if verdict is None or verdict.device != input_ids.device:
                    verdict = verdicts[key] = torch.full((key[0],), done, dtype=torch.bool,
                                                         device=input_ids.device)
                return verdict

        # Runs inside generate(), in this thread: no queue, no second thread, no GIL ping-pong.
        streamer = _Detokenizer(self.tokenizer, pieces.feed) if params.streams else None
        if params.seed is not None:
            torch.manual_seed(params.seed)
        kwargs = params.generate_kwargs()
        if room is not None and room < params.max_new_tokens:
            # A chat's answer ends where the model's context does (the prompt kept room for at least
            # half of it): past it the positions are ones the model never learned.
            kwargs["max_new_tokens"] = room
            if params.min_new_tokens:
                kwargs["min_new_tokens"] = min(params.min_new_tokens, room)
        kwargs.update(inputs)
        kwargs["stopping_criteria"] = StoppingCriteriaList([_Flag()])
        kwargs["pad_token_id"] = self.tokenizer.pad_token_id
        if stops:
            # generate's own stop strings (they need the tokenizer to match across token boundaries).
            kwargs["stop_strings"] = stops
            kwargs["tokenizer"] = self.tokenizer
        if streamer is not None:
            kwargs["streamer"] = streamer
        if recorder is not None:
            recorder.start()
        try:
            with torch.inference_mode():
                output = self.model.generate(**kwargs)
        finally:
            profiled = recorder.finish(self.out) if recorder is not None else None
        tokens = int(output.shape[-1]) - prompt_len
        if streamer is None:
            pieces.feed(self.tokenizer.decode(output[0][prompt_len:], skip_special_tokens=True))
        pieces.flush()
        end = time.perf_counter()
        if pieces.hit:
            reason = "stop_string"
        elif is_cancelled(message):
            reason = "cancelled"
        elif tokens >= params.max_new_tokens:
            reason = "max_new_tokens"
        elif room is not None and tokens >= room:
            reason = "context full"
        else:
            reason = "eos"
        with self._cancel_lock:
            self._cancelled_ids.discard(request_id)
        first = stamps[0] if stamps else end
        last = stamps[-1] if stamps else end
        decode_rate = (len(stamps) - 1) / (last - first) if len(stamps) > 1 and last > first else None
        memory, memory_kind = self._memory()
        self.out.emit("finished", id=request_id, stats={
            "ttft_s": round(first - received, 6), "tokens": tokens, "prompt_tokens": prompt_len,
            "decode_tokens_per_s": decode_rate, "total_s": round(end - received, 6),
            "stop_reason": reason, "memory_bytes": memory, "memory_kind": memory_kind,
            "streamed": streamer is not None, **fitted,
            **({"profile": profiled} if profiled else {}),
        })


class _GenerationProfile:
    """The runner's Profile (issue 40): one answer's decode steps under torch.profiler, the way a
    training run's steps are recorded (``workers/profile.py``): the first token (the prompt's prefill)
    skipped, the second as the profiler's warm-up, every later token one ``ProfilerStep``. The trace
    and ``summary.json`` go to ``<data>/profiles/generate-<time>/profile/``."""

    def __init__(self, max_new_tokens: int) -> None:
        from gaudi_gui.core.profile import PROFILE_SKIP_STEPS
        self.active = max(1, max_new_tokens - PROFILE_SKIP_STEPS)
        self.folder = paths.data_dir() / "profiles" / time.strftime("generate-%Y%m%d-%H%M%S")
        self.prof: Any = None
        self.names: list[str] = []
        self.marks: list[float] = []
        self.seen = 0

    def start(self) -> None:
        import torch

        from gaudi_gui.core.profile import FOLDER_NAME, PROFILE_WAIT, PROFILE_WARMUP
        from gaudi_gui.workers.profile import activities
        chosen, self.names = activities()
        out = self.folder / FOLDER_NAME
        out.mkdir(parents=True, exist_ok=True)
        handler = torch.profiler.tensorboard_trace_handler(str(out), worker_name="generate")
        schedule = torch.profiler.schedule(wait=PROFILE_WAIT, warmup=PROFILE_WARMUP, active=self.active,
                                           repeat=1)
        self.prof = torch.profiler.profile(activities=chosen, on_trace_ready=handler, schedule=schedule)
        self.prof.start()

    def step(self) -> None:
        from gaudi_gui.core.profile import PROFILE_SKIP_STEPS
        self.seen += 1
        if self.seen >= PROFILE_SKIP_STEPS:
            self.marks.append(time.time())
        if self.prof is not None:
            self.prof.step()

    def finish(self, out: Output) -> str | None:
        """Stop the profiler, write the summary; the folder, or None (said as info) when it failed."""
        import itertools

        from gaudi_gui.core import atomic
        from gaudi_gui.core.profile import FOLDER_NAME, PROFILE_SKIP_STEPS, SUMMARY_NAME
        from gaudi_gui.workers.profile import summarize
        prof, self.prof = self.prof, None
        if prof is None:
            return None
        try:
            if PROFILE_SKIP_STEPS <= self.seen < PROFILE_SKIP_STEPS + self.active:
                # The answer ended before the profiler's active steps did (an eos, a stop string): the
                # span open since the last token ends here, and is counted as the trace shows it.
                self.marks.append(time.time())
            prof.stop()
            marks = self.marks
            times = [b - a for a, b in itertools.pairwise(marks)]
            if not times:
                out.emit("info", message=f"profile: the answer had {self.seen} token(s), too few to profile: "
                                         f"the first {PROFILE_SKIP_STEPS} are the profiler's warm-up")
                return None
            summary = summarize(prof.key_averages(), step_times=times, activity_names=self.names,
                                t0=marks[0] if marks else time.time(), t1=marks[-1] if marks else time.time(),
                                steps_wanted=self.active, first_step=PROFILE_SKIP_STEPS + 1)
            summary["kind"] = "generate"
            atomic.write_json(self.folder / FOLDER_NAME / SUMMARY_NAME, summary, indent=1, fsync=False)
        except Exception as exc:  # a profile must never cost the answer
            out.emit("info", message=f"profile: could not write it: {type(exc).__name__}: {exc}")
            return None
        return str(self.folder)


def _die_with_parent() -> None:
    """Linux: have the kernel SIGKILL this worker when the parent that started it dies, even by
    SIGKILL. (stdin EOF is the portable backstop, and the only one over SSH.)"""
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(Exception):
        libc = ctypes.CDLL(None, use_errno=True)
        pr_set_pdeathsig = 1
        libc.prctl(pr_set_pdeathsig, int(signal.SIGKILL), 0, 0, 0)


def main() -> int:
    out = Output()
    worker = Worker(out)
    worker.install_signal_handlers()
    _die_with_parent()
    code = worker.run()
    with contextlib.suppress(Exception):
        sys.stderr.flush()
    # Skip interpreter teardown: the stdin reader is blocked in a read and torch's thread pools abort
    # (SIGABRT) when finalized under it; everything worth keeping has been written already.
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())

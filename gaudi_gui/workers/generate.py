"""The model runner's worker: ``python -m gaudi_gui.workers.generate``.

Reads commands (``gaudi_gui.core.generation``: load, generate, cancel, unload, shutdown) as protocol
lines on stdin and writes events to stdout. Library noise (transformers warnings, stray prints) must
never corrupt the protocol stream, so at start the original stdout fd is duplicated for the protocol
and fd 1 is pointed at stderr.

Threads: a reader thread parses stdin, so a ``cancel`` arrives while the main thread is generating;
it only sets a flag that a StoppingCriteria checks after every token, so the worker really stops
within one token step. ``model.generate`` runs in the main thread with a TextStreamer whose callback
writes each token event as the text is finalized (measured: a TextIteratorStreamer drained from a second
thread halves a small model's decoding rate). The model stays loaded between prompts.
"""

from __future__ import annotations

import contextlib
import os
import queue
import sys
import threading
import time
from typing import Any

from gaudi_gui.core import generation, paths, protocol
from gaudi_gui.core.generation import GenerationParams, LoadOptions


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


def _classify(exc: BaseException, model: str = "") -> WorkerError:
    """Turn a library exception into a kind and a sentence the user can act on."""
    if isinstance(exc, WorkerError):
        return exc
    text = str(exc) or type(exc).__name__
    name = type(exc).__name__
    if name == "OutOfMemoryError" or isinstance(exc, MemoryError) or "out of memory" in text.lower():
        return WorkerError("out_of_memory", f"out of memory: {text.splitlines()[0][:300]}. Try a "
                           "smaller model, bf16 or 4-bit quantization, or free the device.")
    if isinstance(exc, OSError):
        offline = os.environ.get("HF_HUB_OFFLINE") == "1" or os.environ.get("TRANSFORMERS_OFFLINE") == "1"
        lowered = text.lower()
        if offline and not os.path.isdir(os.path.expanduser(model)):
            return WorkerError("no_network", f"'{model}' is not a local folder and not in the Hugging Face "
                               "cache, and offline mode is on (HF_HUB_OFFLINE=1): download it first "
                               "or give a folder.")
        if any(w in lowered for w in ("connection", "resolve", "timed out", "network", "offline")):
            return WorkerError("no_network", f"could not reach the Hugging Face Hub for '{model}': "
                               f"{text.splitlines()[0][:300]}")
        return WorkerError("missing_model", f"could not load '{model}': {text.splitlines()[0][:400]}")
    if isinstance(exc, ImportError):
        return WorkerError("unsupported", f"a library is missing: {text[:300]}")
    if isinstance(exc, (ValueError, TypeError)):
        return WorkerError("bad_parameters", text.splitlines()[0][:400] if text else name)
    return WorkerError("internal", f"{name}: {text.splitlines()[0][:400] if text else ''}")


class Worker:
    def __init__(self, out: Output) -> None:
        self.out = out
        self.commands: queue.Queue[dict[str, Any]] = queue.Queue()
        self.cancel = threading.Event()
        self.model: Any = None
        self.tokenizer: Any = None
        self.device = "cpu"
        self.options: LoadOptions | None = None
        self.load_info: dict[str, Any] = {}

    # -- stdin ------------------------------------------------------------------------------------------

    def read_commands(self) -> None:
        """Reader thread: cancel acts at once; everything else queues for the main thread, in order."""
        for raw in sys.stdin.buffer:
            line = raw.decode("utf-8", errors="replace")
            try:
                message = protocol.decode(line)
            except protocol.ProtocolError as exc:
                self.out.emit("error", kind="protocol", message=str(exc))
                continue
            if message is None or "cmd" not in message:
                continue
            name = message["cmd"]
            if name == "cancel":
                self.cancel.set()
                continue
            if name == "generate":
                # Cleared here, not when generation starts, so a cancel sent right after this generate
                # (but before the main thread picks it up) is not lost.
                self.cancel.clear()
            elif name in ("unload", "shutdown"):
                self.cancel.set()
            self.commands.put(message)
        self.cancel.set()
        self.commands.put({"cmd": "shutdown", "reason": "stdin closed"})

    def run(self) -> int:
        self.out.emit("ready", pid=os.getpid(), protocol=protocol.PROTOCOL_VERSION)
        threading.Thread(target=self.read_commands, name="stdin-reader", daemon=True).start()
        while True:
            message = self.commands.get()
            name = message.get("cmd")
            if name == "shutdown":
                self.unload(quiet=True)
                self.out.emit("exiting", reason=message.get("reason", "shutdown"))
                return 0
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
                    model = str((message.get("options") or {}).get("model", ""))
                error = _classify(exc, model)
                if name == "load":
                    self.unload(quiet=True)
                self.out.emit("error", kind=error.kind, message=str(error), command=name,
                              request_id=message.get("id"))

    # -- loading ----------------------------------------------------------------------------------------

    def _stage(self, started: float, stage: str) -> None:
        self.out.emit("loading", stage=stage, elapsed_s=round(time.perf_counter() - started, 3))

    def load(self, options: LoadOptions) -> None:
        problems = options.validate()
        if problems:
            raise WorkerError("bad_parameters", "; ".join(problems))
        self.unload(quiet=True)
        started = time.perf_counter()
        self._stage(started, "importing torch and transformers")
        import torch
        import transformers
        from transformers import AutoModelForCausalLM, AutoTokenizer

        device = self._pick_device(options.device, transformers, torch)
        if device == "hpu" and options.quantization == "8bit":
            raise WorkerError("unsupported", "8-bit quantization is not supported on Gaudi; use 4bit (nf4)")
        dtype_name = options.dtype
        if dtype_name == "auto":
            dtype_name = "fp32" if device == "cpu" else "bf16"
        dtype = torch.bfloat16 if dtype_name == "bf16" else torch.float32

        model_path = options.model.strip()
        if paths.is_demo(model_path):
            self._stage(started, "building the demo model (first use only)")
            from gaudi_gui.workers.demo import resolve_model
            model_path = resolve_model(model_path)
        expanded = os.path.expanduser(model_path)
        looks_local = (model_path.startswith((".", "/", "~"))
                       or os.path.isabs(expanded))
        if looks_local and not os.path.isdir(expanded):
            raise WorkerError("missing_model", f"model folder not found: {model_path}")
        if os.path.isdir(expanded):
            model_path = expanded
            if not os.path.isfile(os.path.join(expanded, "config.json")):
                raise WorkerError("missing_model", f"{model_path} has no config.json: not a model folder")

        kwargs: dict[str, Any] = {"dtype": dtype, "trust_remote_code": options.trust_remote_code}
        if options.quantization != "none":
            kwargs["quantization_config"] = self._bnb_config(options.quantization, dtype, transformers)
        if device == "hpu":
            kwargs["device_map"] = "hpu"
        elif device == "cuda" and options.quantization != "none":
            kwargs["device_map"] = "cuda"

        self._stage(started, "loading tokenizer")
        tokenizer = AutoTokenizer.from_pretrained(model_path, trust_remote_code=options.trust_remote_code)
        self._stage(started, "loading weights")
        model: Any = AutoModelForCausalLM.from_pretrained(model_path, **kwargs)
        if "device_map" not in kwargs and device != "cpu":
            self._stage(started, f"moving to {device}")
            model = model.to(device)
        model.eval()
        if tokenizer.pad_token_id is None and tokenizer.eos_token_id is not None:
            tokenizer.pad_token = tokenizer.eos_token
        if options.compile:
            self._stage(started, "compiling (torch.compile)")
            if device == "hpu":
                self.out.emit("info", message="on Gaudi transformers runs torch.compile with the "
                              "hpu_backend backend")
            model.forward = torch.compile(model.forward, dynamic=True)
            self.model, self.tokenizer, self.device = model, tokenizer, device
            # Compile now, so a compiler failure is a load error and the first answer is not slow.
            ids = tokenizer("warm up", return_tensors="pt").to(device)
            with torch.inference_mode():
                model.generate(**ids, max_new_tokens=2, do_sample=False,
                               pad_token_id=tokenizer.pad_token_id)
        self.model, self.tokenizer, self.device, self.options = model, tokenizer, device, options
        memory, memory_kind = self._memory()
        self.load_info = {
            "model": options.model, "path": model_path, "device": device, "dtype": dtype_name,
            "quantization": options.quantization, "compile": options.compile,
            "parameters": int(sum(p.numel() for p in model.parameters())),
            "load_s": round(time.perf_counter() - started, 3), "memory_bytes": memory,
            "memory_kind": memory_kind, "chat_template": bool(getattr(tokenizer, "chat_template", None)),
            "model_type": getattr(model.config, "model_type", ""),
        }
        self.out.emit("loaded", **self.load_info)

    def _pick_device(self, wanted: str, transformers: Any, torch: Any) -> str:
        hpu = False
        if wanted in ("auto", "hpu"):
            try:
                hpu = bool(transformers.is_torch_hpu_available())
            except Exception:  # a broken habana install must not stop a CPU load
                hpu = False
        if wanted == "hpu" and not hpu:
            raise WorkerError("unsupported", "device hpu was asked for but no Gaudi (habana_frameworks) "
                              "is available in this environment")
        if wanted == "cuda" and not torch.cuda.is_available():
            raise WorkerError("unsupported", "device cuda was asked for but torch sees no CUDA GPU")
        if wanted == "auto":
            return "hpu" if hpu else "cuda" if torch.cuda.is_available() else "cpu"
        return wanted

    def _bnb_config(self, quantization: str, dtype: Any, transformers: Any) -> Any:
        try:
            import bitsandbytes  # noqa: F401
        except ImportError as exc:
            raise WorkerError("unsupported", "quantization needs bitsandbytes (pip install "
                              "bitsandbytes)") from exc
        if quantization == "8bit":
            return transformers.BitsAndBytesConfig(load_in_8bit=True)
        return transformers.BitsAndBytesConfig(load_in_4bit=True, bnb_4bit_quant_type="nf4",
                                               bnb_4bit_compute_dtype=dtype)

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

    def unload(self, quiet: bool = False) -> None:
        was_loaded = self.model is not None
        self.model = self.tokenizer = self.options = None
        self.load_info = {}
        if was_loaded:
            import gc
            gc.collect()
            import torch
            with contextlib.suppress(Exception):
                if self.device == "cuda":
                    torch.cuda.empty_cache()
        if not quiet:
            self.out.emit("unloaded")

    # -- generating -------------------------------------------------------------------------------------

    def _inputs(self, message: dict[str, Any]) -> Any:
        tokenizer = self.tokenizer
        if "messages" in message:
            try:
                messages = generation.parse_messages(message["messages"])
            except ValueError as exc:
                raise WorkerError("bad_parameters", str(exc)) from exc
            if getattr(tokenizer, "chat_template", None):
                return tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                     return_dict=True, return_tensors="pt")
            # Fallback, announced: a base model has no template, so join the turns as plain text.
            self.out.emit("info", message="this model has no chat template: the conversation is sent "
                          "as plain 'Role: text' lines")
            text = "".join(f"{m['role'].capitalize()}: {m['content']}\n" for m in messages) + "Assistant:"
            return tokenizer(text, return_tensors="pt")
        prompt = message.get("prompt")
        if not isinstance(prompt, str):
            raise WorkerError("bad_parameters", "generate needs a prompt (text) or messages")
        return tokenizer(prompt, return_tensors="pt")

    def generate(self, message: dict[str, Any]) -> None:
        received = time.perf_counter()
        if self.model is None:
            raise WorkerError("not_loaded", "no model is loaded: load one first")
        raw_params = message.get("params") or {}
        if not isinstance(raw_params, dict):
            raise WorkerError("bad_parameters", "params must be an object")
        params = GenerationParams.from_dict(raw_params)
        problems = params.validate()
        if problems:
            raise WorkerError("bad_parameters", "; ".join(problems))
        import torch
        from transformers import StoppingCriteria, StoppingCriteriaList, TextStreamer

        request_id = message.get("id")
        inputs = self._inputs(message).to(self.device)
        prompt_len = int(inputs["input_ids"].shape[-1])
        cancel = self.cancel
        stamps: list[float] = []
        stop_hit = threading.Event()

        class _Flag(StoppingCriteria):
            # Called once per generated token, in the generation thread.
            def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
                stamps.append(time.perf_counter())
                done = cancel.is_set() or stop_hit.is_set()
                return torch.full((input_ids.shape[0],), done, dtype=torch.bool, device=input_ids.device)

        stops = [s for s in params.stop if s]
        state = {"text": "", "sent": ""}
        out = self.out

        def on_text(piece: str) -> None:
            # Runs inside generate(), in this thread: no queue, no second thread, no GIL ping-pong
            # (a TextIteratorStreamer read from another thread halves a small model's tokens/s).
            if stop_hit.is_set() or not piece:
                return
            state["text"] += piece
            safe, hit = _stop_split(state["text"], stops)
            if len(safe) > len(state["sent"]):
                out.emit("token", text=safe[len(state["sent"]):], id=request_id)
                state["sent"] = safe
            if hit:
                stop_hit.set()

        class _Emit(TextStreamer):
            def on_finalized_text(self, text: str, stream_end: bool = False) -> None:
                on_text(text)

        streamer = _Emit(self.tokenizer, skip_prompt=True, skip_special_tokens=True) \
            if params.streams else None
        if params.seed is not None:
            torch.manual_seed(params.seed)
        kwargs = params.generate_kwargs()
        kwargs.update(inputs)
        kwargs["stopping_criteria"] = StoppingCriteriaList([_Flag()])
        kwargs["pad_token_id"] = self.tokenizer.pad_token_id
        if streamer is not None:
            kwargs["streamer"] = streamer
        result: dict[str, Any] = {}
        try:
            with torch.inference_mode():
                result["output"] = self.model.generate(**kwargs)
        except Exception as exc:
            result["error"] = exc
        text, sent = state["text"], state["sent"]
        if "error" in result:
            raise result["error"]
        output = result["output"]
        tokens = int(output.shape[-1]) - prompt_len
        if streamer is None:
            text = self.tokenizer.decode(output[0][prompt_len:], skip_special_tokens=True)
            safe, hit = _stop_split(text, stops)
            if hit:
                stop_hit.set()
            if safe:
                self.out.emit("token", text=safe, id=request_id)
        elif not stop_hit.is_set():
            # Text the streamer held back (the last word) is flushed by end(); anything left over:
            rest = _stop_split(text, stops)[0][len(sent):]
            if rest:
                self.out.emit("token", text=rest, id=request_id)
        end = time.perf_counter()
        if stop_hit.is_set():
            reason = "stop_string"
        elif cancel.is_set():
            reason = "cancelled"
        elif tokens >= params.max_new_tokens:
            reason = "max_new_tokens"
        else:
            reason = "eos"
        first = stamps[0] if stamps else end
        last = stamps[-1] if stamps else end
        decode_rate = (len(stamps) - 1) / (last - first) if len(stamps) > 1 and last > first else None
        memory, memory_kind = self._memory()
        self.out.emit("finished", id=request_id, stats={
            "ttft_s": round(first - received, 6), "tokens": tokens, "prompt_tokens": prompt_len,
            "decode_tokens_per_s": decode_rate, "total_s": round(end - received, 6),
            "stop_reason": reason, "memory_bytes": memory, "memory_kind": memory_kind,
            "streamed": streamer is not None,
        })


def _stop_split(text: str, stops: list[str]) -> tuple[str, bool]:
    """(the part of ``text`` safe to show, whether a stop string was hit).

    Text that could be the beginning of a stop string is held back until the next piece decides."""
    if not stops:
        return text, False
    cut = min((text.find(s) for s in stops if s in text), default=-1)
    if cut >= 0:
        return text[:cut], True
    hold = 0
    for s in stops:
        for n in range(min(len(s) - 1, len(text)), 0, -1):
            if text.endswith(s[:n]):
                hold = max(hold, n)
                break
    return text[:len(text) - hold], False


def main() -> int:
    out = Output()
    code = Worker(out).run()
    sys.stderr.flush()
    # Skip interpreter teardown: the stdin reader is blocked in a read and torch's thread pools abort
    # (SIGABRT) when finalized under it; everything worth keeping has been written already.
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main())

"""Serving a model on an OpenAI-compatible endpoint: the choices, the engines' argv, and reading them.

Two engines start a server: ``transformers serve`` (ships with transformers' serving extra, runs on
every device, this CPU included; no API key, no adapters: a LoRA adapter is merged first) and vLLM's
``vllm serve`` (on Gaudi with Intel's vllm-gaudi plugin; adapters as LoRA modules, an API key, graph
warm-up that logs ``[Warmup][Prompt][k/N]`` per bucket). This module decides which engine runs and why,
builds its argv, sizes vLLM's context length, and reads what the engine prints (warm-up progress,
the uvicorn access log both engines write). Qt-free and torch-free: the command and the GUI share it.

Observed with transformers 5.x on this CPU (``transformers serve --port P --device cpu DIR``): the
server is pinned to the folder given on the command line; a request's ``model`` may be left out or must
be that same id (anything else: 400 "Server is pinned to ..."); ``/v1/models`` lists it once loaded;
uvicorn prints one access line per request (``INFO:     127.0.0.1:PORT - "POST /v1/chat/completions
HTTP/1.1" 200 OK``); it prints no token counts or time to first token. So ``gaudi-gui serve`` runs it
through ``workers/transformers_serve``, which counts the tokens its runner counts and prints the
totals as protocol lines on the engine's output (``TokenTally`` reads them). vLLM counts its own
tokens in Prometheus counters on the same port (``/metrics``): ``VllmTokenReader`` reads them.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import socket
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from gaudi_gui.core import quantization as quant
from gaudi_gui.core.events import EventType
from gaudi_gui.core.proctree import ProcessRef

ENGINES = ("auto", "transformers", "vllm")
DEVICES = ("auto", "cpu", "cuda", "hpu")
DTYPES = ("auto", "bf16", "fp32")
QUANTIZATIONS = quant.QUANTIZATIONS  # the one vocabulary (core.quantization)
#: The loopback address every server binds unless "listen on all interfaces" was chosen.
LOOPBACK = "127.0.0.1"
ALL_INTERFACES = "0.0.0.0"
DEFAULT_PORT = 8000
#: vLLM's block size on Gaudi (its default there is 128): contexts are sized to whole blocks.
BLOCK = 128
#: How to install vLLM on Gaudi, said where it is missing (it is never installed by us).
VLLM_INSTALL_HINT = ("vLLM is not installed there; on Gaudi install Intel's vllm-gaudi plugin for the "
                     "host's Gaudi software version as its docs say: "
                     "https://docs.vllm.ai/projects/gaudi/en/latest/getting_started/installation.html")

_DTYPE_WORDS = {"auto": "auto", "bf16": "bfloat16", "fp32": "float32"}


def gaudi_software_here() -> str:
    """This machine's Gaudi software release as its habana-torch-plugin says ("1.23.0"), or ""."""
    from importlib import metadata
    try:
        version = metadata.version("habana-torch-plugin")
    except metadata.PackageNotFoundError:
        return ""
    return ".".join(version.split(".")[:3])


def vllm_install_hint(software: str | None = None, compat: dict[str, Any] | None = None) -> str:
    """Where vLLM is missing: Intel's install page, and what the doctor's compatibility table
    (resources/gaudi-compat.json) says about vLLM for this Gaudi software release, with its
    source."""
    from gaudi_gui.core.health import compat_row, load_compat
    from gaudi_gui.core.paths import DataFileError
    software = gaudi_software_here() if software is None else software
    if not software:
        return VLLM_INSTALL_HINT
    if compat is None:
        try:
            compat = load_compat()
        except DataFileError as exc:
            return f"{VLLM_INSTALL_HINT} ({exc})"
    row, exact = compat_row(compat, software)
    if row is None:
        return (f"{VLLM_INSTALL_HINT} (Gaudi software {software} is not in the compatibility table: "
                "check Intel's support matrix for the vllm-gaudi version)")
    note = str(row.get("vllm") or "the table does not name a vLLM version")
    release = "" if exact else f" (the {row.get('gaudi_software')} row)"
    return (f"{VLLM_INSTALL_HINT}. For Gaudi software {software}{release} Intel's support matrix says: "
            f"{note} ({row.get('source', 'no source')}, read {row.get('date', '?')})")


class ServeError(ValueError):
    """Bad input for a server (the field and the message for a person)."""

    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"{field_name}: {message}")
        self.field = field_name
        self.message = message


@dataclass(frozen=True)
class EngineChoice:
    engine: str
    reason: str


def choose_engine(requested: str, *, vllm_importable: bool, device: str) -> EngineChoice:
    """Which engine serves, with the reason as a sentence a person reads before the start.

    ``auto`` picks vLLM only where it is importable and the device is an accelerator it serves
    (hpu, cuda); everywhere else ``transformers serve``, which runs on every device."""
    if requested == "transformers":
        return EngineChoice("transformers", "transformers serve, as chosen")
    if requested == "vllm":
        if not vllm_importable:
            raise ServeError("engine", vllm_install_hint())
        return EngineChoice("vllm", "vLLM, as chosen")
    if requested != "auto":
        raise ServeError("engine", f"unknown engine {requested!r} (choose {', '.join(ENGINES)})")
    if not vllm_importable:
        return EngineChoice("transformers", "transformers serve: vLLM is not importable here")
    if device not in ("hpu", "cuda"):
        return EngineChoice("transformers", f"transformers serve: vLLM serves hpu/cuda, the device is "
                                            f"{device or 'cpu'}")
    return EngineChoice("vllm", f"vLLM: importable here and the device is {device}")


def size_max_model_len(prompt_tokens: int, answer_tokens: int, *, model_max: int | None = None,
                       block: int = BLOCK) -> int:
    """The context length to give vLLM: the longest prompt plus the longest answer expected, rounded up
    to whole KV blocks, never past the model's own limit. vLLM's default is the model's full context,
    which on Gaudi makes warm-up compile buckets (and reserve KV cache) nobody asked for."""
    if prompt_tokens < 1 or answer_tokens < 1:
        raise ServeError("max_model_len", "expected prompt and answer lengths must be at least 1 token")
    need = prompt_tokens + answer_tokens
    sized = -(-need // block) * block
    if model_max:
        if need > model_max:
            raise ServeError("max_model_len", f"{need} tokens (prompt {prompt_tokens} + answer "
                                              f"{answer_tokens}) exceed the model's context of {model_max}")
        sized = min(sized, model_max)
    return sized


@dataclass(frozen=True)
class ServeSpec:
    """One server as the form or the command line asks for it."""

    model: str
    engine: str = "auto"
    port: int = DEFAULT_PORT
    device: str = "auto"
    dtype: str = "auto"
    quantization: str = "none"
    adapter: str = ""
    max_model_len: int = 0
    api_key_env: str = ""
    listen_all: bool = False
    #: The cards the engine may use (module ids on Gaudi, indexes on CUDA); empty: every card.
    cards: tuple[int, ...] = ()
    #: A calibrate run folder (core.fp8): served in FP8 through vLLM's INC quantization.
    fp8: str = ""

    def problems(self, *, local: bool = True) -> list[tuple[str, str]]:
        """(field, message) for each bad value, before anything starts. ``local``: the model is
        looked for on this machine (False: a host's server, whose own ``serve`` looks on the host)."""
        out: list[tuple[str, str]] = []
        if not self.model.strip():
            out.append(("model", "choose a model (Hub id, folder, or builtin:demo)"))
        elif local:
            from gaudi_gui.core.jobcheck import model_problem  # the one rule of training, Serve, Evaluate
            bad = model_problem(self.model)
            if bad:
                out.append(("model", bad))
        if self.engine not in ENGINES:
            out.append(("engine", f"choose one of {', '.join(ENGINES)}"))
        if not 1 <= self.port <= 65535:
            out.append(("port", "a port is 1-65535"))
        if self.device not in DEVICES:
            out.append(("device", f"choose one of {', '.join(DEVICES)}"))
        if self.dtype not in DTYPES:
            out.append(("dtype", f"choose one of {', '.join(DTYPES)}"))
        if self.quantization not in QUANTIZATIONS:
            out.append(("quantization", f"choose one of {', '.join(QUANTIZATIONS)}"))
        if self.max_model_len < 0:
            out.append(("max_model_len", "must be 0 (the engine's default) or more"))
        if self.api_key_env and not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", self.api_key_env):
            out.append(("api_key_env", "the name of an environment variable (letters, digits, _)"))
        if self.listen_all and not self.api_key_env:
            out.append(("listen_all", "listening on all interfaces requires an API key"))
        if self.fp8 and (self.quantization != "none" or self.adapter):
            out.append(("fp8", "FP8 serves the calibrated full model: no --quantization, no --adapter"))
        return out

    def cli_args(self) -> list[str]:
        """The ``gaudi-gui serve`` options for this spec (``--opt=value``: a value may begin with '-')."""
        args = [f"--model={self.model}", f"--engine={self.engine}", f"--port={self.port}",
                f"--device={self.device}", f"--dtype={self.dtype}", f"--quantization={self.quantization}"]
        if self.adapter:
            args.append(f"--adapter={self.adapter}")
        if self.max_model_len:
            args.append(f"--max-model-len={self.max_model_len}")
        if self.api_key_env:
            args.append(f"--api-key-env={self.api_key_env}")
        if self.listen_all:
            args.append("--listen-all")
        if self.cards:
            args.append("--cards=" + ",".join(str(c) for c in sorted(set(self.cards))))
        if self.fp8:
            args.append(f"--fp8={self.fp8}")
        return args


def transformers_argv(program: Sequence[str], model: str, spec: ServeSpec, *, bind: str) -> list[str]:
    """``transformers serve`` for one model, pinned (the model on the command line: loaded at start,
    every request served by it). ``program``: how to run the transformers CLI there."""
    argv = [*program, "serve", "--host", bind, "--port", str(spec.port), "--device", spec.device,
            "--dtype", _DTYPE_WORDS.get(spec.dtype, "auto")]
    if spec.quantization != "none":
        argv += ["--quantization", f"bnb-{spec.quantization}"]
    if spec.max_model_len:
        argv += ["--max-model-len", str(spec.max_model_len)]
    return [*argv, "--", model]


def vllm_argv(program: Sequence[str], model: str, spec: ServeSpec, *, bind: str,
              adapter: str = "") -> list[str]:
    """``vllm serve``. The API key travels in VLLM_API_KEY (never on a command line ``ps`` shows);
    an adapter is a LoRA module named ``adapter``."""
    argv = [*program, "serve", model, "--host", bind, "--port", str(spec.port),
            "--dtype", _DTYPE_WORDS.get(spec.dtype, "auto")]
    if tensor_parallel(spec) > 1:
        argv += ["--tensor-parallel-size", str(tensor_parallel(spec))]
    if spec.max_model_len:
        argv += ["--max-model-len", str(spec.max_model_len)]
    if spec.quantization != "none":
        argv += ["--quantization", "bitsandbytes"]
    if spec.fp8:
        # INC's QUANTIZE step inside vLLM (vllm-gaudi); QUANT_CONFIG names the measurements (fp8_env).
        argv += ["--quantization", "inc", "--kv-cache-dtype", "fp8_inc"]
    if adapter:
        argv += ["--enable-lora", "--lora-modules", f"adapter={adapter}"]
    return argv


def tensor_parallel(spec: ServeSpec) -> int:
    """vLLM's ``--tensor-parallel-size``: one rank a card of ``--cards`` (no cards chosen: 1, vLLM's
    default, whatever the machine holds)."""
    return max(1, len(set(spec.cards)))


#: Why ``--fp8`` is refused where vLLM is not (or transformers serve is asked for): FP8 serving is
#: vLLM's INC quantization (the command line and the Serve panel say the same).
FP8_NEEDS_VLLM = ("FP8 serving runs through vLLM (vllm-gaudi, --quantization inc), which is not here; "
                  "check the calibration with gaudi-gui eval --model M --fp8 RUN instead")


def device_here(device: str, probed: str | None = None) -> str:
    """The device ``auto`` means on this machine: what the environment probe decides (the one rule
    for the runner, Serve, Evaluate and training: workers/device.py). ``probed``: the app's probe
    answer, when it has one; else the probe child runs now (seconds: it imports torch)."""
    if device != "auto":
        return device
    if probed in ("hpu", "cuda", "cpu"):
        return probed
    from gaudi_gui.core.prepare import probe_device
    return probe_device()


def vllm_here() -> bool:
    """Whether vLLM is importable here (looked up, not imported: importing it imports torch)."""
    import importlib.util
    import shutil

    return importlib.util.find_spec("vllm") is not None and shutil.which("vllm") is not None


# -- reading the engine's output -------------------------------------------------------------------

_WARMUP = re.compile(r"\[Warmup\]\[(?P<phase>[^\]]+)\]\[(?P<k>\d+)/(?P<n>\d+)\]")
_LOG_TIME = re.compile(r"\b(?P<mo>\d\d)-(?P<d>\d\d) (?P<h>\d\d):(?P<mi>\d\d):(?P<s>\d\d)\b")


@dataclass
class WarmupProgress:
    phase: str
    step: int
    total: int
    fraction: float
    eta_s: float | None


@dataclass
class WarmupParser:
    """vLLM-gaudi's warm-up lines (``[Warmup][Prompt][3/24] batch_size:4 seq_len:768 ...``, then
    ``[Warmup][Decode][k/N]``) turned into one fraction over both phases and an ETA. The phases run
    one after the other; a phase not seen yet counts as big as the one seen (the decode buckets are
    not known until they start), so the fraction never goes back. Times come from the line's own
    ``MM-DD HH:MM:SS`` stamp when it has one (recorded logs replay exactly), else from ``now``."""

    phases: int = 2
    _done_phases: list[tuple[str, int]] = field(default_factory=list)
    _current: tuple[str, int] | None = None
    _first_time: float | None = None
    _last_fraction: float = 0.0

    def feed(self, line: str, now: float | None = None) -> WarmupProgress | None:
        match = _WARMUP.search(line)
        if match is None:
            return None
        phase, k, n = match["phase"], int(match["k"]), int(match["n"])
        if n < 1:
            return None
        stamp = _log_time(line)
        t = stamp if stamp is not None else (time.monotonic() if now is None else now)
        if self._first_time is None:
            self._first_time = t
        if self._current is None or self._current[0] != phase:
            if self._current is not None:
                self._done_phases.append(self._current)
            self._current = (phase, n)
        done_steps = sum(total for _, total in self._done_phases) + k
        phases_left = max(self.phases - len(self._done_phases) - 1, 0)
        all_steps = sum(total for _, total in self._done_phases) + n + phases_left * n
        fraction = max(min(done_steps / all_steps, 1.0), self._last_fraction)
        self._last_fraction = fraction
        elapsed = t - self._first_time
        eta = elapsed * (1 - fraction) / fraction if fraction > 0 and elapsed > 0 else None
        return WarmupProgress(phase, k, n, fraction, eta)


def _log_time(line: str) -> float | None:
    match = _LOG_TIME.search(line)
    if match is None:
        return None
    try:
        stamp = datetime(2000, int(match["mo"]), int(match["d"]), int(match["h"]), int(match["mi"]),
                         int(match["s"]))
    except ValueError:
        return None
    return stamp.timestamp()


_ACCESS = re.compile(r'^(?:INFO|WARNING|ERROR)?:?\s*(?P<client>[\w.:\[\]-]+):(?P<cport>\d+) - '
                     r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d{3})')


@dataclass(frozen=True)
class RequestRecord:
    """One request as the engine's own access log shows it (tokens and TTFT where the engine prints
    them: ``transformers serve`` does not, so they stay None)."""

    time: float
    method: str
    path: str
    status: int
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    ttft_s: float | None = None
    tokens_per_s: float | None = None

    def to_dict(self) -> dict[str, object]:
        return {"time": self.time, "method": self.method, "path": self.path, "status": self.status,
                "prompt_tokens": self.prompt_tokens, "completion_tokens": self.completion_tokens,
                "ttft_s": self.ttft_s, "tokens_per_s": self.tokens_per_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, object]) -> RequestRecord:
        def num(key: str) -> float | None:
            value = data.get(key)
            return float(value) if isinstance(value, (int, float)) else None

        def whole(key: str) -> int | None:
            value = data.get(key)
            return int(value) if isinstance(value, int) else None

        return cls(num("time") or 0.0, str(data.get("method", "")), str(data.get("path", "")),
                   whole("status") or 0, whole("prompt_tokens"), whole("completion_tokens"),
                   num("ttft_s"), num("tokens_per_s"))


def parse_request(line: str, now: float | None = None) -> RequestRecord | None:
    """A request from one uvicorn access line (both engines print them), or None."""
    match = _ACCESS.match(line.strip())
    if match is None:
        return None
    return RequestRecord(time.time() if now is None else now, match["method"], match["path"],
                         int(match["status"]))


def _count(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


#: Where a Serve run's token counts come from when the engine counts them itself.
TOKENS_SOURCE = "the engine's own count: transformers serve's GenerateRunner.count_tokens"


@dataclass
class TokenTally:
    """The engine's own token counts (``workers/transformers_serve``'s ``serve_tokens`` lines), summed
    over its processes: each process reports its own running totals (the model's process; an API
    server's zeros), so the sum is the last totals of each. A process whose totals go down is a new
    one on a reused pid: what the earlier one counted is kept. ``why_not``: the engine said it cannot
    count (another transformers version), or it is not ours to count."""

    per_process: dict[int, tuple[int, int]] = field(default_factory=dict)
    banked: tuple[int, int] = (0, 0)
    why_not: str = ""
    heard: bool = False
    #: Where the counts come from (vLLM: its Prometheus counters, ``VLLM_TOKENS_SOURCE``).
    source: str = TOKENS_SOURCE

    def take(self, message: Mapping[str, Any]) -> dict[str, Any] | None:
        """The event fields to say when ``message`` changed what is known, else None."""
        if message.get("type") != EventType.SERVE_TOKENS:
            return None
        if message.get("counting") is False:
            self.why_not = str(message.get("why") or "the engine cannot count its tokens")
            self.heard = True
            return self.fields()
        pid, prompt, generated = (message.get(k) for k in ("pid", "prompt_tokens", "completion_tokens"))
        if not (_count(pid) and _count(prompt) and _count(generated)):
            return None
        assert isinstance(pid, int) and isinstance(prompt, int) and isinstance(generated, int)
        old = self.per_process.get(pid)
        if old == (prompt, generated) and self.heard:
            return None
        if old is not None and (prompt < old[0] or generated < old[1]):
            self.banked = (self.banked[0] + old[0], self.banked[1] + old[1])
        self.per_process[pid] = (prompt, generated)
        self.heard = True
        return self.fields()

    def totals(self) -> tuple[int, int]:
        """(prompt tokens, generated tokens) so far."""
        return (self.banked[0] + sum(p for p, _ in self.per_process.values()),
                self.banked[1] + sum(g for _, g in self.per_process.values()))

    def fields(self) -> dict[str, Any]:
        if self.why_not:
            return {"counting": False, "why": self.why_not, "source": self.source}
        prompt, generated = self.totals()
        return {"counting": True, "prompt_tokens": prompt, "completion_tokens": generated,
                "source": self.source}


# -- vLLM's own token counters (its Prometheus /metrics) ----------------------------------------------

#: vLLM's counters (vllm/v1/metrics/loggers.py: Counter "vllm:prompt_tokens" and
#: "vllm:generation_tokens", labels model_name and engine; prometheus_client exposes a counter with
#: ``_total``), summed over every label set (one per engine of a data-parallel server).
VLLM_PROMPT_COUNTER = "vllm:prompt_tokens_total"
VLLM_GENERATED_COUNTER = "vllm:generation_tokens_total"
VLLM_TOKENS_SOURCE = (f"the engine's own count: vLLM's {VLLM_GENERATED_COUNTER} and {VLLM_PROMPT_COUNTER} "
                      "at /metrics")
#: How often the counters are read while serving (and once more just before the engine is stopped).
VLLM_METRICS_EVERY_S = 1.0


class MetricsUnreadable(ValueError):
    """A /metrics text without vLLM's token counters, or with one that is not a count."""


def _sample(line: str) -> tuple[str, str, str] | None:
    """(name, the labels' text, value) of one exposition sample line (Prometheus text format 0.0.4:
    ``name{label="value",...} value [timestamp]``; a label value may hold spaces, braces and
    escaped quotes), or None for a comment, a blank line or the quoted-name form."""
    line = line.strip()
    if not line or line.startswith(("#", "{")):
        return None
    cut = len(line)
    for mark in ("{", " ", "\t"):
        at = line.find(mark)
        if at != -1:
            cut = min(cut, at)
    name, rest = line[:cut], line[cut:]
    labels = ""
    if rest.startswith("{"):
        quoted, escaped = False, False
        for i, char in enumerate(rest):
            if escaped:
                escaped = False
            elif char == "\\":
                escaped = quoted
            elif char == '"':
                quoted = not quoted
            elif char == "}" and not quoted:
                labels, rest = rest[1:i], rest[i + 1:]
                break
        else:
            return None
    words = rest.split()
    return (name, labels, words[0]) if words else None


def vllm_token_counts(text: str) -> tuple[int, int]:
    """(prompt tokens, generated tokens) from vLLM's ``/metrics`` text: each counter summed over its
    label sets. MetricsUnreadable (with why) where a counter is missing or not a whole count."""
    sums: dict[str, float] = {}
    for line in text.splitlines():
        sample = _sample(line)
        if sample is None or sample[0] not in (VLLM_PROMPT_COUNTER, VLLM_GENERATED_COUNTER):
            continue
        name, _labels, value = sample
        try:
            number = float(value)  # prometheus_client writes 24.0, or 1.234567e+06 past a million
        except ValueError:
            raise MetricsUnreadable(f"{name} reads {value!r}, not a count") from None
        if not (number >= 0 and number == int(number)):
            raise MetricsUnreadable(f"{name} reads {value!r}, not a count")
        sums[name] = sums.get(name, 0.0) + number
    missing = [n for n in (VLLM_GENERATED_COUNTER, VLLM_PROMPT_COUNTER) if n not in sums]
    if missing:
        raise MetricsUnreadable(f"/metrics has no {' and no '.join(missing)} (vLLM keeps no stats with "
                                "--disable-log-stats)")
    return int(sums[VLLM_PROMPT_COUNTER]), int(sums[VLLM_GENERATED_COUNTER])


@dataclass
class VllmTokenReader:
    """vLLM's token counters read from its ``/metrics`` into a ``TokenTally`` (``source``
    ``VLLM_TOKENS_SOURCE``): ``read(status, text)`` with what one GET of /metrics answered (status 0:
    no answer, ``text`` then says why) gives the ``serve_tokens`` fields to say when they changed.

    /metrics is not behind vLLM's API key (its PUBLIC_ENDPOINTS; older versions guard only /v1).
    A 404 (no metrics), a refusal or a text without the counters is for good: "not measured" with why
    at once. A failed read while serving is passing (the next one a second later counts the same
    totals); the read just before the stop (``final``) is the one that makes the count whole, so if it
    fails the count is "not measured", never a count short by the last second."""

    pid: int
    tally: TokenTally = field(default_factory=lambda: TokenTally(source=VLLM_TOKENS_SOURCE))
    last_good: float | None = None
    failures: int = 0
    last_failure: str = ""

    def read(self, status: int, text: str, *, now: float, final: bool = False) -> dict[str, Any] | None:
        if self.tally.why_not:
            return None
        if status == 200:
            try:
                prompt, generated = vllm_token_counts(text)
            except MetricsUnreadable as exc:
                return self._cannot(f"vLLM's {exc}")
            self.last_good = now
            return self.tally.take({"type": EventType.SERVE_TOKENS, "pid": self.pid, "prompt_tokens": prompt,
                                    "completion_tokens": generated})
        if status == 404:
            return self._cannot("vLLM's /metrics answered 404: this server exposes no Prometheus metrics")
        if status in (401, 403):
            return self._cannot(f"vLLM's /metrics refused the request ({status})")
        why = f"status {status}" if status else (text or "no answer")
        self.failures += 1
        self.last_failure = why
        if final:
            before = (f"; its last reading, {now - self.last_good:.1f} s earlier, misses what was generated "
                      "since") if self.last_good is not None else ""
            return self._cannot(f"the reading of vLLM's /metrics just before the stop failed ({why}){before}")
        return None

    def _cannot(self, why: str) -> dict[str, Any] | None:
        return self.tally.take({"type": EventType.SERVE_TOKENS, "counting": False, "why": why})



def tokens_line(fields: Mapping[str, Any]) -> str:
    """A ``serve_tokens`` event for a person: '16 tokens generated, 32 prompt tokens (source)'; why
    they were not counted; '' for nothing said."""
    if not fields:
        return ""
    if fields.get("counting") is False:
        return f"tokens not counted: {fields.get('why') or 'no reason given'}"
    generated, prompt = fields.get("completion_tokens"), fields.get("prompt_tokens")
    if not (_count(generated) and _count(prompt)):
        return ""
    source = fields.get("source") or TOKENS_SOURCE
    return f"{generated:,} tokens generated, {prompt:,} prompt tokens ({source})"


# -- what a person pastes --------------------------------------------------------------------------

def endpoint_url(port: int, address: str = LOOPBACK) -> str:
    return f"http://{address}:{port}/v1"


def curl_snippet(url: str, model: str, api_key_env: str = "") -> str:
    """A curl line that works as pasted into a POSIX shell (the key read from the environment)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": "Hello!"}],
                       "max_tokens": 32})
    auth = f' -H "Authorization: Bearer ${api_key_env}"' if api_key_env else ""
    return (f"curl -s {shlex.quote(url + '/chat/completions')} -H 'Content-Type: application/json'"
            f"{auth} -d {shlex.quote(body)}")


def python_snippet(url: str, model: str, api_key_env: str = "") -> str:
    """An openai-client script that works as pasted."""
    key = f"os.environ[{api_key_env!r}]" if api_key_env else '"none"'
    return "\n".join([
        "import os",
        "from openai import OpenAI",
        "",
        f"client = OpenAI(base_url={url!r}, api_key={key})",
        "reply = client.chat.completions.create(",
        f"    model={model!r},",
        '    messages=[{"role": "user", "content": "Hello!"}],',
        "    max_tokens=32,",
        ")",
        "print(reply.choices[0].message.content)",
    ])


# -- talking to the endpoint (the runner's chat through the server) -----------------------------------

def chat_body(model: str, params: Any, *, messages: list[dict[str, str]] | None = None,
              prompt: str | None = None) -> dict[str, Any]:
    """An OpenAI request for the runner's generation settings (``core.generation.GenerationParams``):
    ``/chat/completions`` with ``messages``, ``/completions`` with ``prompt``; always streamed, with
    the usage in the last chunk. Greedy (``do_sample`` off) is temperature 0. Settings the OpenAI API
    does not have (top_k, repetition penalty, beams) are left to the server's defaults."""
    body: dict[str, Any] = {"stream": True, "stream_options": {"include_usage": True},
                            "max_tokens": int(params.max_new_tokens)}
    if model:
        body["model"] = model
    if params.do_sample:
        body["temperature"] = float(params.temperature)
        body["top_p"] = float(params.top_p)
    else:
        body["temperature"] = 0.0
    if params.seed is not None:
        body["seed"] = int(params.seed)
    if params.stop:
        body["stop"] = list(params.stop)[:4]
    if messages is not None:
        body["messages"] = messages
    else:
        body["prompt"] = prompt or ""
    return body


def chat_request_problem(body: Any) -> str | None:
    """What is wrong with an OpenAI chat request's shape (None: nothing we check): ``messages`` a
    non-empty list of objects, each with a text ``role`` and a ``content`` that is text, a list of
    parts (objects with a ``type``) or empty; ``max_tokens`` / ``max_completion_tokens`` whole numbers.
    ``transformers serve`` answered a bare 500 to ``"messages": "hello"``: this is said as a 400."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        got = "missing" if messages is None else f"{type(messages).__name__} {json.dumps(messages)[:40]}"
        return f"messages must be a non-empty list of {{\"role\": ..., \"content\": ...}} objects (got {got})"
    for index, message in enumerate(messages):
        where = f"messages[{index}]"
        if not isinstance(message, dict):
            return f"{where} must be an object with role and content (got {type(message).__name__})"
        if not isinstance(message.get("role"), str) or not message["role"]:
            return f"{where}.role must be text (system, user, assistant, tool)"
        content = message.get("content")
        if content is not None and not isinstance(content, str) and not (
                isinstance(content, list) and all(isinstance(p, dict) and isinstance(p.get("type"), str)
                                                  for p in content)):
            return (f"{where}.content must be text or a list of parts with a type "
                    f"(got {type(content).__name__})")
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            return f"{name} must be a whole number of at least 1 (got {json.dumps(value)[:40]})"
    return None


def completion_request_problem(body: Any) -> str | None:
    """What is wrong with an OpenAI completions request's shape (None: nothing we check)."""
    if not isinstance(body, dict):
        return "the request body must be a JSON object"
    value = body.get("max_tokens")
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        return f"max_tokens must be a whole number of at least 1 (got {json.dumps(value)[:40]})"
    return None


class SseReader:
    """Server-sent events read as they arrive: ``feed(bytes)`` returns the JSON object of every
    complete ``data:`` line (``"[DONE]"`` as the string), keeping a partial line for the next feed.
    A ``data:`` line that is not JSON is returned as ``{"error": {"message": line}}``."""

    def __init__(self) -> None:
        self._partial = b""

    def feed(self, data: bytes) -> list[Any]:
        self._partial += data
        *lines, self._partial = self._partial.split(b"\n")
        out: list[Any] = []
        for raw in lines:
            line = raw.strip().decode("utf-8", errors="replace")
            if not line.startswith("data:"):
                continue  # comments, event: lines, the blank line between events
            payload = line[5:].strip()
            if payload == "[DONE]":
                out.append("[DONE]")
                continue
            try:
                out.append(json.loads(payload))
            except ValueError:
                out.append({"error": {"message": payload[:300]}})
        return out


def chunk_text(event: dict[str, Any]) -> str:
    """The text one streamed chunk adds (chat: ``delta.content``; completions: ``text``)."""
    text = ""
    for choice in event.get("choices") or []:
        if not isinstance(choice, dict):
            continue
        delta = choice.get("delta")
        if isinstance(delta, dict) and isinstance(delta.get("content"), str):
            text += delta["content"]
        elif isinstance(choice.get("text"), str):
            text += choice["text"]
    return text


def chunk_finish(event: dict[str, Any]) -> str:
    """A chunk's finish reason ("stop", "length") or ""."""
    for choice in event.get("choices") or []:
        if isinstance(choice, dict) and choice.get("finish_reason"):
            return str(choice["finish_reason"])
    return ""


def endpoint_stats(*, started: float, first: float | None, ended: float, chunks: int,
                   usage: dict[str, Any] | None, finish: str) -> dict[str, Any]:
    """The runner's stats line for an answer from the endpoint (``core.generation.format_stats``):
    TTFT from the request to the first text, tokens (the server's usage, else the text chunks) and
    decode tokens/s after the first token."""
    tokens = int((usage or {}).get("completion_tokens") or chunks)
    stats: dict[str, Any] = {"tokens": tokens, "total_s": ended - started,
                             "stop_reason": {"stop": "eos", "length": "max tokens"}.get(finish, finish),
                             "source": "endpoint"}
    if first is not None:
        stats["ttft_s"] = first - started
        decode = ended - first
        if tokens > 1 and decode > 0:
            stats["decode_tokens_per_s"] = (tokens - 1) / decode
    return stats


# -- the engine's record: which gaudi-gui serve owns the engine on a port ---------------------------

#: How long an orphaned engine gets to end after SIGTERM before it is killed.
ORPHAN_GRACE_S = 10.0


def engine_record_path(port: int) -> Path:
    """Where the engine serving ``port`` is recorded while its ``gaudi-gui serve`` runs."""
    from gaudi_gui.core import paths

    return paths.data_dir() / "serve" / f"engine-{port}.json"


@dataclass(frozen=True)
class EngineRecord:
    """An engine a ``gaudi-gui serve`` started: the engine and its owner, each a (pid, create time),
    so a recycled pid is never taken for either. Written when the engine starts, removed when the
    owner has ended it; a record left behind names an engine whose owner was killed."""

    port: int
    bind: str
    model: str
    engine: str
    process: ProcessRef
    owner: ProcessRef
    started_at: float

    def to_dict(self) -> dict[str, Any]:
        return {"port": self.port, "bind": self.bind, "model": self.model, "engine": self.engine,
                "process": self.process.to_dict(), "owner": self.owner.to_dict(),
                "started_at": self.started_at}

    @classmethod
    def from_dict(cls, data: Any) -> EngineRecord | None:
        if not isinstance(data, Mapping):
            return None
        process = ProcessRef.from_dict(data.get("process") or {})
        owner = ProcessRef.from_dict(data.get("owner") or {})
        port = data.get("port")
        if process is None or owner is None or isinstance(port, bool) or not isinstance(port, int):
            return None
        started = data.get("started_at")
        return cls(port, str(data.get("bind", LOOPBACK)), str(data.get("model", "")),
                   str(data.get("engine", "")), process, owner,
                   float(started) if isinstance(started, (int, float)) else 0.0)

    def engine_alive(self) -> bool:
        return self.process.is_alive()

    def owner_alive(self) -> bool:
        return self.owner.is_alive()

    def orphaned(self) -> bool:
        """The engine runs on and the ``gaudi-gui serve`` that started it is gone."""
        return self.engine_alive() and not self.owner_alive()

    def orphan_message(self) -> str:
        return (f"port {self.port} is held by an earlier gaudi-gui serve engine (pid {self.process.pid}, "
                f"model {self.model}) whose owner is gone: stop it with "
                f"`gaudi-gui serve --stop-orphan --port {self.port}`")


def write_engine_record(record: EngineRecord) -> None:
    from gaudi_gui.core import atomic

    path = engine_record_path(record.port)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic.write_json(path, record.to_dict())


def read_engine_record(port: int) -> EngineRecord | None:
    try:
        data = json.loads(engine_record_path(port).read_text(encoding="utf-8"))
    except (OSError, ValueError, RecursionError):
        return None
    record = EngineRecord.from_dict(data)
    return record if record is not None and record.port == port else None


def forget_engine_record(record: EngineRecord) -> None:
    """Remove the record, unless by now it names another engine (a later serve on the same port)."""
    current = read_engine_record(record.port)
    if current is not None and current.process != record.process:
        return
    with contextlib.suppress(OSError):
        engine_record_path(record.port).unlink()


# -- ports -----------------------------------------------------------------------------------------

def port_free(port: int, address: str = LOOPBACK) -> bool:
    """Whether a server could bind ``address:port`` now (a listener there, or a port in TIME_WAIT
    held without SO_REUSEADDR, makes it not free)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((address, port))
        except OSError:
            return False
    return True


def pick_free_port(address: str = LOOPBACK) -> int:
    """A port the system says is free now (for the local end of a forward, or a test)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((address, 0))
        return int(sock.getsockname()[1])


__all__ = [
    "ALL_INTERFACES",
    "BLOCK",
    "DEFAULT_PORT",
    "DEVICES",
    "DTYPES",
    "ENGINES",
    "FP8_NEEDS_VLLM",
    "LOOPBACK",
    "ORPHAN_GRACE_S",
    "QUANTIZATIONS",
    "TOKENS_SOURCE",
    "VLLM_GENERATED_COUNTER",
    "VLLM_INSTALL_HINT",
    "VLLM_METRICS_EVERY_S",
    "VLLM_PROMPT_COUNTER",
    "VLLM_TOKENS_SOURCE",
    "EngineChoice",
    "EngineRecord",
    "MetricsUnreadable",
    "RequestRecord",
    "ServeError",
    "ServeSpec",
    "SseReader",
    "TokenTally",
    "VllmTokenReader",
    "WarmupParser",
    "WarmupProgress",
    "chat_body",
    "chat_request_problem",
    "choose_engine",
    "chunk_finish",
    "chunk_text",
    "completion_request_problem",
    "curl_snippet",
    "device_here",
    "endpoint_stats",
    "endpoint_url",
    "engine_record_path",
    "forget_engine_record",
    "gaudi_software_here",
    "parse_request",
    "pick_free_port",
    "port_free",
    "python_snippet",
    "read_engine_record",
    "size_max_model_len",
    "tensor_parallel",
    "tokens_line",
    "transformers_argv",
    "vllm_argv",
    "vllm_here",
    "vllm_install_hint",
    "vllm_token_counts",
    "write_engine_record",
]

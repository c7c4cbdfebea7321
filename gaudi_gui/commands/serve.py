"""``gaudi-gui serve --model M``: an OpenAI-compatible endpoint for a model, here or on a host.

Here: the engine (``transformers serve``, or ``vllm serve`` where it is importable and the device is an
accelerator; ``core.serve.choose_engine``) starts as a child in a process group of its own, bound to
127.0.0.1. The command polls the server's own ``/v1/models`` until it answers, then prints the endpoint
URL on a line of its own, then one line per request from the engine's access log. Ctrl-C or SIGTERM
stops the whole engine tree and waits until the port is free again (exit 0). A port already taken, a
missing engine, something that is not a model: one line, exit 2; a server that dies or never answers:
its last lines, exit 1. A stdout whose reader went away (``… | head -n 3``) ends the printing, not the
server (one line on stderr says so).

The engine never outlives this command unseen: on Linux it gets SIGTERM from the kernel when this
process dies, even by SIGKILL (``PR_SET_PDEATHSIG``), and while it runs it is recorded with its owner
(``core.serve.EngineRecord``, ``serve/engine-PORT.json`` in the data folder, removed at a clean end).
An engine that did not end with its owner (hung, stopped) is named by the next serve on its port, and
``gaudi-gui serve --stop-orphan --port P`` ends it.

``--host DEST``: the host's own ``serve --detach`` (its supervisor and run folder are the host's: a killed
client or a dropped connection leaves it serving), bound to the host's loopback on ``--remote-port``; a
local port forward on the same multiplexed connection makes the endpoint ``http://127.0.0.1:PORT/v1``
here. Without ``--detach`` it is followed with the one relay of placed output (``remote_run.relay``),
the forward asked for again whenever it stops answering; Ctrl-C stops it there.

``--events``: JSON lines (core.protocol) for the app: ``serve_state`` (starting, loading, warming,
ready, stopped, failed), ``serve_progress`` (warm-up fraction and ETA), ``serve_url``, ``serve_request``,
``serve_tokens`` (the engine's own running token totals: ``transformers serve`` runs through
``workers/transformers_serve``, which counts them; vLLM's Prometheus counters are read from its
``/metrics`` at most once a second and once more just before the engine is stopped; said when they
change and once more at the stop).
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from gaudi_gui.commands.flags import add_detach_arguments
from gaudi_gui.core import paths, protocol, visibility
from gaudi_gui.core import serve as sv
from gaudi_gui.core.child import Child
from gaudi_gui.core.events import EventType
from gaudi_gui.core.jobkind import die_with_parent
from gaudi_gui.core.proctree import ProcessRef, ProcessTree

#: How long a recorded engine whose owner died gets to end by itself before a new serve names it.
ORPHAN_SETTLE_S = 5.0
#: How long the engine may take to answer /v1/models (vLLM's warm-up on Gaudi takes minutes).
READY_TIMEOUT_S = 1800.0
LAST_LINES = 15


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve a model on an OpenAI-compatible endpoint",
                       description="Start an OpenAI-compatible server for a model (here or on --host) "
                                   "and print its endpoint URL once it answers. Ctrl-C stops it.")
    p.add_argument("--model", default="", help="Hub id, local folder, adapter folder, or builtin:demo")
    p.add_argument("--engine", default="auto", choices=sv.ENGINES,
                   help="auto: vLLM where importable and the device is hpu/cuda, else transformers serve")
    p.add_argument("--port", type=int, default=sv.DEFAULT_PORT,
                   help="the endpoint's port here (for --host: the local end of the forward)")
    p.add_argument("--remote-port", type=int, default=0,
                   help="with --host: the server's port on the host's loopback (default: --port)")
    p.add_argument("--device", default="auto", choices=sv.DEVICES)
    p.add_argument("--dtype", default="auto", choices=sv.DTYPES)
    p.add_argument("--quantization", default="none", choices=sv.QUANTIZATIONS)
    p.add_argument("--adapter", default="", help="a LoRA adapter folder (a training run's adapter/)")
    p.add_argument("--max-model-len", type=int, default=0, help="longest prompt + answer in tokens")
    p.add_argument("--api-key-env", default="",
                   help="name of the environment variable holding the API key (vLLM only)")
    p.add_argument("--listen-all", action="store_true",
                   help="bind all interfaces instead of loopback (needs --api-key-env)")
    p.add_argument("--cards", default="", metavar="IDS",
                   help="the cards the engine may use: module ids on Gaudi (HABANA_VISIBLE_MODULES), "
                        "indexes on CUDA (CUDA_VISIBLE_DEVICES); default every card")
    p.add_argument("--fp8", default="", metavar="RUN",
                   help="serve in FP8 with a calibrate run's measurements (vLLM on Gaudi: --quantization "
                        "inc); refused when the run was calibrated for another machine, INC or model")
    p.add_argument("--events", action="store_true", help="print JSON-lines events for the app")
    add_detach_arguments(p, "serve")
    from gaudi_gui.commands import client
    client.add_argument(p)
    p.add_argument("--json", action="store_true", help="with --detach: print the job as JSON")
    p.add_argument("--stop-orphan", action="store_true",
                   help="stop the engine an earlier gaudi-gui serve left running on --port after it was "
                        "killed (recorded, so only an engine of ours is stopped), and free the port")


class _Out:
    """Text for a person, or events for the app (and the URL line in both). The one place serve
    prints: a reader that went away (``gaudi-gui serve … | head -n 3``) ends the printing, never the
    server. The closed stream is pointed at /dev/null (as Python's docs on SIGPIPE advise), so no
    later print and no flush at exit raises again; serve says so once on the other stream."""

    def __init__(self, events: bool) -> None:
        self.events = events
        self.closed: set[str] = set()

    def _say(self, text: str, *, err: bool = False) -> None:
        name = "stderr" if err else "stdout"
        if name in self.closed:
            return
        stream = sys.stderr if err else sys.stdout
        try:
            protocol.write_line(stream, text)
        except OSError as exc:
            if not isinstance(exc, BrokenPipeError) and exc.errno not in (errno.EPIPE, errno.EBADF):
                raise
            self._stream_closed(name, stream)

    def _stream_closed(self, name: str, stream: Any) -> None:
        self.closed.add(name)
        with contextlib.suppress(OSError, ValueError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, stream.fileno())
            os.close(devnull)
        other = "stdout" if name == "stderr" else "stderr"
        self._say(f"gaudi-gui serve: {name} was closed (its reader went away): no more lines there; "
                  f"the server goes on until Ctrl-C or SIGTERM", err=other == "stderr")

    def state(self, state: str, message: str, **extra: Any) -> None:
        if self.events:
            self._say(protocol.event(EventType.SERVE_STATE, state=state, message=message, **extra))
        else:
            self._say(message)

    def progress(self, p: sv.WarmupProgress) -> None:
        if self.events:
            self._say(protocol.event(EventType.SERVE_PROGRESS, phase=p.phase, step=p.step, total=p.total,
                                     fraction=p.fraction, eta_s=p.eta_s))
        else:
            eta = f", about {p.eta_s:.0f} s left" if p.eta_s is not None else ""
            self._say(f"warm-up {p.phase} {p.step}/{p.total} ({p.fraction:.0%}{eta})")

    def ready(self, message: str, url: str, **extra: Any) -> None:
        """The server answers at ``url``. Events: the URL first, then the state, so a reader that
        says "ready" has the URL to show with it (the Serve panel showed "ready" with no URL for a
        moment when the two lines came in two reads); for a person: the sentence, then the URL."""
        if self.events:
            self._say(protocol.event(EventType.SERVE_URL, url=url, **extra))
        self.state("ready", message, url=url,
                   **{k: v for k, v in extra.items() if k not in ("model", "name")})
        self._say(url)

    def request(self, record: sv.RequestRecord) -> None:
        if self.events:
            self._say(protocol.event(EventType.SERVE_REQUEST, **record.to_dict()))
        else:
            stamp = time.strftime("%H:%M:%S", time.localtime(record.time))
            self._say(f"{stamp} {record.method} {record.path} {record.status}")

    def tokens(self, fields: dict[str, Any], *, final: bool = False) -> None:
        """The engine's token totals: an event each time they change; for a person, once at the end."""
        if self.events:
            if not final:
                self._say(protocol.event(EventType.SERVE_TOKENS, **fields))
        elif final and (line := sv.tokens_line(fields)):
            self._say(line)

    def fail(self, message: str, lines: list[str] | None = None) -> None:
        if self.events:
            self._say(protocol.event(EventType.SERVE_STATE, state="failed", message=message,
                                     lines=lines or []))
        self._say(f"gaudi-gui serve: {message}", err=True)
        for line in lines or []:
            self._say(f"  | {line}", err=True)


def _shown(out: _Out) -> Callable[[dict[str, Any]], None]:
    """How a person sees the events of a serve the agent runs (its log holds only its plain lines: the
    URL, the engine's output): the words this command prints when it serves in-process. A failure is
    said by the command itself, on its stderr (in the log)."""
    def show(event: dict[str, Any]) -> None:
        kind = event.get("type")
        if kind == EventType.SERVE_STATE and event.get("state") != "failed" and event.get("message"):
            out.state(str(event.get("state")), str(event["message"]))
        elif kind == EventType.SERVE_PROGRESS:
            eta = event.get("eta_s")
            out.progress(sv.WarmupProgress(
                phase=str(event.get("phase") or ""), step=int(event.get("step") or 0),
                total=int(event.get("total") or 0), fraction=float(event.get("fraction") or 0.0),
                eta_s=float(eta) if isinstance(eta, (int, float)) else None))
        elif kind == EventType.SERVE_REQUEST:
            out.request(sv.RequestRecord(
                time=float(event.get("time") or 0.0), method=str(event.get("method") or ""),
                path=str(event.get("path") or ""), status=int(event.get("status") or 0)))
    return show


class _Stop(Exception):
    """SIGTERM / SIGHUP arrived: stop as Ctrl-C does."""


def _raise_stop(signum: int, frame: object) -> None:
    raise _Stop()


def run(args: argparse.Namespace) -> int:
    out = _Out(args.events)
    if args.stop_orphan:
        if (args.host or "").strip() not in ("", "local"):
            out.fail("--stop-orphan: only on this machine (run it on the host itself)")
            return 2
        if not 1 <= args.port <= 65535:
            out.fail("--port: a port is 1-65535")
            return 2
        return _stop_orphan(args.port, out)
    problems: list[tuple[str, str]] = []
    cards: tuple[int, ...] = ()
    if args.cards:
        try:
            cards = tuple(visibility.parse_cards(args.cards))
        except ValueError as exc:
            problems.append(("cards", str(exc).removeprefix("--cards ")))
    spec = sv.ServeSpec(model=args.model, engine=args.engine, port=args.port, device=args.device,
                        dtype=args.dtype, quantization=args.quantization, adapter=args.adapter,
                        max_model_len=args.max_model_len, api_key_env=args.api_key_env,
                        listen_all=args.listen_all, cards=cards, fp8=args.fp8)
    host = (args.host or "").strip()
    problems += spec.problems(local=not (host and host != "local"))  # a host's own serve checks its files
    if args.remote_port and not 1 <= args.remote_port <= 65535:
        problems.append(("remote_port", "a port is 1-65535"))
    if args.remote_port and not (host and host != "local"):
        problems.append(("remote_port", "only with --host (the server's port on the host's loopback)"))
    if problems:
        out.fail("; ".join(f"--{f.replace('_', '-')}: {m}" for f, m in problems))
        return 2
    if spec.fp8 and not (host and host != "local"):
        refused = _fp8_refusal(spec)
        if isinstance(refused, str):
            out.fail(refused)
            return 2
        spec = refused
    if spec.api_key_env and not os.environ.get(spec.api_key_env):
        out.fail(f"--api-key-env: the environment variable {spec.api_key_env} is not set")
        return 2
    if args.detach and host and host != "local":
        return _detach_on_host(args, spec, out)
    if host and host != "local":
        return _on_host(args, spec, out)
    refused = _port_refusal(spec)  # here, before the agent or a background job is asked
    if refused:
        out.fail(refused)
        return 2
    if args.detach:
        from gaudi_gui.commands.detach import detach_command
        name = f"serve-{Path(spec.model).name or 'model'}"
        return detach_command("serve", "serve", spec.cli_args(), name=name, runs_dir=args.runs_dir,
                              as_json=args.json)
    from gaudi_gui.commands import client
    if client.wanted(args):
        return client.run_job("serve", spec.cli_args(), runs_dir=args.runs_dir, shown=_shown(out))
    old = {s: signal.signal(s, _raise_stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        return _here(spec, out)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


def _fp8_refusal(spec: sv.ServeSpec) -> str | sv.ServeSpec:
    """``--fp8 RUN`` before anything starts: the line that refuses it (a calibration of another machine,
    INC or model; no vLLM here to serve it), or the spec with the run as an absolute folder."""
    import dataclasses

    from gaudi_gui.core import fp8
    try:
        folder = fp8.find_run(spec.fp8)
        manifest, found = fp8.check(folder, model=spec.model)
    except fp8.Fp8Error as exc:
        return f"--fp8: {exc}"
    if found:
        return fp8.check_line(spec.fp8, found)
    # vLLM's tensor-parallel ranks (sv.tensor_parallel: one a card of --cards) each read the files of their
    # own rank and world size: as many as the calibration measured with, or none fit.
    ranks = fp8.serve_ranks_refusal(spec.fp8, manifest, sv.tensor_parallel(spec))
    if ranks:
        return ranks
    if spec.engine == "transformers" or not sv.vllm_here():
        return f"--fp8 {spec.fp8}: {sv.FP8_NEEDS_VLLM}"
    return dataclasses.replace(spec, fp8=str(folder.resolve()), engine="vllm")


# -- here --------------------------------------------------------------------------------------------

#: transformers' serve CLI run in-process by our worker, which counts the tokens it generates.
TRANSFORMERS_WORKER = "gaudi_gui.workers.transformers_serve"


def _transformers_program() -> tuple[list[str], str] | None:
    """How to run ``transformers serve`` here, and why its tokens go uncounted ('' when they are):
    this Python's transformers through our worker; else a ``transformers`` command on PATH (another
    Python, whose runner the worker cannot reach)."""
    import importlib.util

    if importlib.util.find_spec("transformers") is not None:
        return [sys.executable, "-m", TRANSFORMERS_WORKER], ""
    found = shutil.which("transformers")
    if found is None:
        return None
    return [found], (f"transformers serve runs from {found}, outside gaudi-gui's Python: its runner is not "
                     "ours to count")


def _adapter_base(adapter: str) -> str:
    data = json.loads((Path(adapter) / "adapter_config.json").read_text())
    base = str(data.get("base_model_name_or_path") or "")
    if not base:
        raise ValueError("its adapter_config.json names no base model")
    return base


def _port_refusal(spec: sv.ServeSpec) -> str:
    """Why this machine's ``spec.port`` cannot be served on ("" when it can): an engine of an earlier
    serve holds it (named, with how to stop it), or anything else does."""
    bind = sv.ALL_INTERFACES if spec.listen_all else sv.LOOPBACK
    record = sv.read_engine_record(spec.port)
    if record is not None and record.orphaned():
        # Its owner just died: the kernel's SIGTERM is ending it (about a second); give it that time.
        deadline = time.monotonic() + ORPHAN_SETTLE_S
        while record.engine_alive() and time.monotonic() < deadline:
            time.sleep(0.1)
    if record is not None and record.engine_alive():
        # An engine of ours on this port (serving, or still loading and not bound yet).
        if not record.owner_alive():
            return f"--port: {record.orphan_message()}"
        return (f"--port: port {spec.port} is taken by another gaudi-gui serve (pid {record.owner.pid}, "
                f"model {record.model}); choose another")
    if not sv.port_free(spec.port, bind):
        return f"--port: port {spec.port} is already taken on {bind}; choose another"
    return ""


def _here(spec: sv.ServeSpec, out: _Out) -> int:
    bind = sv.ALL_INTERFACES if spec.listen_all else sv.LOOPBACK
    refused = _port_refusal(spec)
    if refused:
        out.fail(refused)
        return 2
    device = sv.device_here(spec.device)
    # Decided once (the probe's answer): the engine's cards and its --device follow from it.
    spec = dataclasses.replace(spec, device=device)
    try:
        choice = sv.choose_engine(spec.engine, vllm_importable=sv.vllm_here(), device=device)
    except sv.ServeError as exc:
        out.fail(f"--{exc.field}: {exc.message}")
        return 2
    if spec.api_key_env and choice.engine == "transformers":
        out.fail("--api-key-env: transformers serve takes no API key (it listens on loopback only); "
                 "use --engine vllm or leave the key out")
        return 2
    model = spec.model.strip()
    adapter = spec.adapter.strip()
    is_demo = paths.is_demo(model)  # the model itself was checked with the spec (spec.problems)
    expanded = os.path.expanduser(model)
    if not is_demo and os.path.isfile(os.path.join(expanded, "adapter_config.json")) and not adapter:
        adapter, model = expanded, ""  # an adapter folder given as the model: serve it over its base
    if adapter:
        if not os.path.isfile(os.path.join(os.path.expanduser(adapter), "adapter_config.json")):
            out.fail(f"--adapter: {adapter} holds no adapter (adapter_config.json)")
            return 2
        adapter = os.path.abspath(os.path.expanduser(adapter))
        if not model:
            try:
                model = _adapter_base(adapter)
            except (OSError, ValueError) as exc:
                out.fail(f"--adapter: {exc}")
                return 2
            is_demo = paths.is_demo(model)
    out.state("starting", f"starting {choice.reason}")
    temp: tempfile.TemporaryDirectory[str] | None = None
    try:
        if is_demo:
            model = _demo_model(out)
            if not model:
                return 1
        elif os.path.isdir(os.path.expanduser(model)):
            model = os.path.abspath(os.path.expanduser(model))
        if adapter and choice.engine == "transformers":
            out.state("loading", "transformers serve takes no adapters: merging the adapter into its base "
                                 "model first (a temporary folder, removed at stop)")
            temp = tempfile.TemporaryDirectory(prefix="gaudi-gui-serve-merged-")
            merged = _merge(adapter, Path(temp.name) / "model", out)
            if not merged:
                return 1
            model, adapter = merged, ""
        return _run_engine(spec, choice, model, adapter, bind=bind, out=out)
    except (KeyboardInterrupt, _Stop):
        out.state("stopped", "stopped before the server started")
        return 0
    finally:
        if temp is not None:
            temp.cleanup()


def _demo_model(out: _Out) -> str:
    folder = paths.demo_model_dir()
    if (folder / "config.json").is_file():
        return str(folder)
    out.state("loading", "building the demo model (first use only)")
    done = subprocess.run([sys.executable, "-m", "gaudi_gui.workers.demo", str(folder)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        out.fail("the demo model could not be built", done.stderr.splitlines()[-LAST_LINES:])
        return ""
    return str(folder)


def _merge(adapter: str, target: Path, out: _Out) -> str:
    done = subprocess.run([sys.executable, "-m", "gaudi_gui.workers.merge", "--adapter", adapter,
                           "--out", str(target)], capture_output=True, text=True)
    if done.returncode != 0:
        out.fail("merging the adapter failed", (done.stdout + done.stderr).splitlines()[-LAST_LINES:])
        return ""
    return str(target)


def _fetch(url: str, key: str = "", timeout: float = 3.0) -> tuple[int, str]:
    """(status, body) of a GET; (0, why) where nothing answered."""
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status), response.read().decode("utf-8", errors="replace")
    except urllib.error.HTTPError as exc:
        return int(exc.code), ""
    except (OSError, ValueError) as exc:
        return 0, str(getattr(exc, "reason", None) or exc) or type(exc).__name__


def _get(url: str, key: str = "", timeout: float = 2.0) -> int:
    request = urllib.request.Request(url, headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)
    except (OSError, ValueError):
        return 0


def _run_engine(spec: sv.ServeSpec, choice: sv.EngineChoice, model: str, adapter: str, *, bind: str,
                out: _Out) -> int:
    env = dict(os.environ)
    # The engine's own token counts (transformers serve through our worker; vLLM's /metrics counters).
    tally = sv.TokenTally(source=sv.VLLM_TOKENS_SOURCE if choice.engine == "vllm" else sv.TOKENS_SOURCE)
    # Only the chosen cards (HABANA_VISIBLE_MODULES / CUDA_VISIBLE_DEVICES), as a training run's.
    env.update(visibility.device_env(sv.device_here(spec.device), spec.cards))
    key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
    if choice.engine == "vllm":
        program = shutil.which("vllm")
        if program is None:
            out.fail(f"--engine: {sv.vllm_install_hint()}")
            return 2
        argv = sv.vllm_argv([program], model, spec, bind=bind, adapter=adapter)
        if spec.fp8:
            from gaudi_gui.core.fp8 import vllm_env
            env.update(vllm_env(spec.fp8))
        if key:
            env["VLLM_API_KEY"] = key
    else:
        how = _transformers_program()
        if how is None:
            out.fail("--engine: the transformers command is missing: install transformers with its serving "
                     "extra (pip install 'transformers[serving]')")
            return 2
        argv = sv.transformers_argv(how[0], model, spec, bind=bind)
        if how[1]:
            tally.take({"type": EventType.SERVE_TOKENS, "counting": False, "why": how[1]})
    env["PYTHONUNBUFFERED"] = "1"
    # The engine ends with this process even when it is SIGKILLed (nothing here runs then): the kernel
    # sends it SIGTERM (PR_SET_PDEATHSIG); and it is recorded, so that an engine that did not end (hung,
    # stopped) is named by the next serve on its port instead of a bare "port taken". Its two streams
    # are one log (warm-up lines, the access log), read as one in the order written.
    child = Child(argv, decode=lambda line: {"line": line.rstrip("\r\n")}, env=env, stdin=False,
                  merge_stderr=True, tail_lines=LAST_LINES, preexec=die_with_parent())
    record = _record_engine(child.pid, spec.port, bind, model, choice.engine)
    vllm_tokens = sv.VllmTokenReader(child.pid, tally) if choice.engine == "vllm" else None
    metrics_url = f"http://127.0.0.1:{spec.port}/metrics"
    last_read = 0.0

    def read_counters(*, final: bool = False) -> None:
        """vLLM's token counters from its /metrics (at most once a second; ``final``: now, just
        before the engine is stopped, so what it generated to the end is counted)."""
        nonlocal last_read
        now = time.monotonic()
        if vllm_tokens is None or (not final and now - last_read < sv.VLLM_METRICS_EVERY_S):
            return
        last_read = now
        status, text = _fetch(metrics_url, key)
        fields = vllm_tokens.read(status, text, now=now, final=final)
        if fields is not None:
            out.tokens(fields)

    warmup = sv.WarmupParser()
    url = sv.endpoint_url(spec.port)
    models_url = f"http://127.0.0.1:{spec.port}/v1/models"
    out.state("loading", f"loading {model} ({choice.engine}, pid {child.pid})", pid=child.pid,
              engine=choice.engine, reason=choice.reason)
    if tally.heard:
        out.tokens(tally.fields())
    warming = False

    def counted(line: str) -> bool:
        """A token-count line of the engine's (said on when the totals changed)."""
        if not line.startswith(protocol.PREFIX):
            return False
        try:
            message = protocol.decode(line)
        except protocol.ProtocolError:
            return False
        fields = tally.take(message or {})
        if fields is not None:
            out.tokens(fields)
        return message is not None and message.get("type") == EventType.SERVE_TOKENS

    def drain(on_line: Callable[[str], None], wait: float) -> bool:
        """Read what the engine printed; False once its output ended."""
        message = child.next_message(wait)
        while message:
            on_line(str(message["line"]))
            message = child.next_message(0)
        return message is not None

    def while_starting(line: str) -> None:
        nonlocal warming
        if counted(line):
            return
        progress = warmup.feed(line)
        if progress is not None:
            if not warming:
                warming = True
                out.state("warming", "warming up (compiling a graph per bucket)")
            out.progress(progress)

    probe_lines = 1  # the readiness probe's own GET /v1/models is no one's request

    def while_serving(line: str) -> None:
        nonlocal probe_lines
        if counted(line):
            return
        record = sv.parse_request(line)
        if record is None:
            return
        if record.path == "/health":
            return  # the forward's liveness probe (--host), not a request of the user's
        if probe_lines and record.path == "/v1/models" and record.status == 200:
            probe_lines -= 1
            return
        if vllm_tokens is not None and record.path == "/metrics":
            return  # reading vLLM's token counters: no one's request
        out.request(record)

    try:
        started = time.monotonic()
        while True:
            alive = drain(while_starting, 0.25)
            if child.poll() is not None or not alive:
                code = child.end(0)
                out.fail(f"the server ended before it answered (exit {code})", list(child.tail))
                return 1
            if _get(models_url, key) == 200:
                break
            if time.monotonic() - started > READY_TIMEOUT_S:
                out.fail(f"the server did not answer within {READY_TIMEOUT_S:.0f} s", list(child.tail))
                return 1
        read_counters()  # vLLM's counters as the server starts serving (0: warm-up is not counted)
        # model: the id requests must name (the folder it resolved to); name: what the user chose;
        # context: the longest request it takes (a chat leaves out its oldest turns to stay within it).
        out.ready(f"ready after {time.monotonic() - started:.1f} s: {url}", url, model=model,
                  name=spec.model.strip(), **_context_field(spec, choice, model, models_url, key))
        while drain(while_serving, 0.5):
            if child.poll() is not None:
                break
            read_counters()
        code = child.end(0)
        drain(while_serving, 0.1)
        out.tokens(tally.fields() if tally.heard else {}, final=True)
        out.fail(f"the server ended by itself (exit {code})", list(child.tail))
        return 1
    except (KeyboardInterrupt, _Stop):
        if vllm_tokens is not None and child.poll() is None:
            # The counters' last reading, with the engine still up: a second signal skips it (the
            # count is then "not measured": the tally says why).
            try:
                read_counters(final=True)
            except (KeyboardInterrupt, _Stop):
                fields = vllm_tokens.read(0, "stopped again before it answered", now=time.monotonic(),
                                          final=True)
                if fields is not None:
                    out.tokens(fields)

        def last() -> None:
            """The engine's last totals (written at its SIGTERM), read before "stopped" is said."""
            drain(while_serving, 0)
            out.tokens(tally.fields() if tally.heard else {}, final=True)

        return _stop(child, spec.port, bind, out, last=last)
    finally:
        if child.poll() is None:
            child.end(0)
        if record is not None:
            sv.forget_engine_record(record)


def _context_field(spec: sv.ServeSpec, choice: sv.EngineChoice, model: str, models_url: str,
                   key: str) -> dict[str, int]:
    """``{"context": tokens}``: the longest request the engine takes, prompt and answer: vLLM's own
    ``max_model_len`` from /v1/models where it says it, else ``--max-model-len`` where given, never past
    the model's own context (its config and tokenizer, read from its files); {} where none is known."""
    from gaudi_gui.core.generation import model_context

    limits = [n for n in (spec.max_model_len, model_context(model)) if n]
    if choice.engine == "vllm":
        status, text = _fetch(models_url, key)
        with contextlib.suppress(ValueError, TypeError, AttributeError, IndexError):
            said = json.loads(text)["data"][0].get("max_model_len") if status == 200 else None
            if isinstance(said, int) and said > 0:
                limits = [said]
    return {"context": min(limits)} if limits else {}


def _record_engine(pid: int, port: int, bind: str, model: str, engine: str) -> sv.EngineRecord | None:
    """Record the engine and this process as its owner (each with its create time)."""
    process, owner = ProcessRef.of(pid), ProcessRef.of(os.getpid())
    if process is None or owner is None:
        return None
    record = sv.EngineRecord(port=port, bind=bind, model=model, engine=engine, process=process, owner=owner,
                             started_at=time.time())
    try:
        sv.write_engine_record(record)
    except OSError:
        return None  # an unwritable data folder must not stop the server; the death signal still holds
    return record


def _stop_orphan(port: int, out: _Out) -> int:
    """``serve --stop-orphan --port P``: end the recorded engine whose owner is gone (SIGTERM to its
    group and every descendant, SIGCONT so a stopped one can act on it, SIGKILL after
    ``ORPHAN_GRACE_S``), then wait for the port."""
    record = sv.read_engine_record(port)
    if record is None or not record.engine_alive():
        if record is not None:
            sv.forget_engine_record(record)
        taken = "" if sv.port_free(port) else f" (port {port} is taken by something else)"
        out.state("stopped", f"no engine of an earlier gaudi-gui serve runs on port {port}{taken}")
        return 0
    if record.owner_alive():
        out.fail(f"--stop-orphan: the engine on port {port} (pid {record.process.pid}) belongs to a running "
                 f"gaudi-gui serve (pid {record.owner.pid}): stop that one (Ctrl-C, or SIGTERM to it)")
        return 2
    root = record.process.process()
    if root is None:
        sv.forget_engine_record(record)
        out.state("stopped", f"no engine of an earlier gaudi-gui serve runs on port {port}")
        return 0
    tree = ProcessTree(record.process.pid, group=_leads_group(record.process.pid))
    tree.record()
    for sig in (signal.SIGTERM, signal.SIGCONT):
        tree.signal(sig)
        tree.signal_recorded(sig)
    deadline = time.monotonic() + sv.ORPHAN_GRACE_S
    while record.process.is_alive() and time.monotonic() < deadline:
        time.sleep(0.1)
    tree.kill()
    deadline = time.monotonic() + 10
    while (record.process.is_alive() or not sv.port_free(port, record.bind)) and time.monotonic() < deadline:
        time.sleep(0.1)
    if record.process.is_alive():
        out.fail(f"--stop-orphan: the engine (pid {record.process.pid}) on port {port} did not end")
        return 1
    sv.forget_engine_record(record)
    free = sv.port_free(port, record.bind)
    where = f"port {port} is free" if free else f"port {port} is still held by another process"
    out.state("stopped", f"stopped the engine (pid {record.process.pid}, model {record.model}) an earlier "
                         f"gaudi-gui serve left on port {port}; {where}")
    return 0


def _leads_group(pid: int) -> bool:
    """Whether ``pid`` leads a process group of its own (the engine starts in a session of its own)."""
    try:
        return os.getpgid(pid) == pid
    except OSError:
        return False


def _stop(child: Child, port: int, bind: str, out: _Out, *, last: Callable[[], object] | None = None) -> int:
    """End the engine's whole tree (SIGTERM, then SIGKILL after 10 s), read what it said last
    (``last``), and wait until the port is free."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
    try:
        child.end(10)
        if last is not None:
            last()
        deadline = time.monotonic() + 10
        while not sv.port_free(port, bind) and time.monotonic() < deadline:
            time.sleep(0.1)
        out.state("stopped", f"stopped; port {port} is free" if sv.port_free(port, bind)
                  else f"stopped; port {port} is still held by another process")
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# -- on a host ---------------------------------------------------------------------------------------

def _start_on_host(args: argparse.Namespace, spec: sv.ServeSpec,
                   out: _Out) -> tuple[Any, Any, dict[str, Any]] | int:
    """The host's own ``serve --detach`` (its supervisor and run folder are the host's: the server
    outlives this command and the connection): (host, the forward of ``--port`` here to its port
    there, the host's announce), or the exit code once the reason was said."""
    from gaudi_gui.commands.detach import detach_on_host
    from gaudi_gui.core.placement import Forward, Placement
    from gaudi_gui.core.remote import HostError

    try:
        placement = Placement.from_cli(host=args.host, remote_command=args.remote_command)
    except HostError as exc:
        out.fail(f"--host: {exc}")
        return 2
    if not sv.port_free(spec.port):
        out.fail(f"--port: port {spec.port} is already taken here; choose another")
        return 2
    host, remote_port = placement.host, args.remote_port or spec.port
    # The key crosses the connection as the guard's checked --env argument, never through a shell.
    env = {spec.api_key_env: os.environ[spec.api_key_env]} if spec.api_key_env else None
    words = ["serve", *dataclasses.replace(spec, port=remote_port).cli_args()]
    info, why, code = detach_on_host(host, words, env=env)
    if info is None:
        out.fail(why)
        return 2 if code == 2 else 1  # ssh's 255 too: serve's exit codes are 0, 1 and 2
    return host, Forward(spec.port, remote_port), info


def _detach_on_host(args: argparse.Namespace, spec: sv.ServeSpec, out: _Out) -> int:
    """``serve --host DEST --detach``: the server started there (``_start_on_host``) and the forward
    asked for here; ``runs --host DEST follow|stop`` follow and stop it; ``forward`` asks for the
    forward again after the connection dropped."""
    from gaudi_gui.commands.detach import print_started

    started = _start_on_host(args, spec, out)
    if isinstance(started, int):
        return started
    host, fwd, info = started
    forward(host.name, fwd)
    info.update(host=host.name, url=sv.endpoint_url(spec.port), remote_port=fwd.remote_port)
    print_started(info, "serve", as_json=args.json)
    return 0


def _on_host(args: argparse.Namespace, spec: sv.ServeSpec, out: _Out) -> int:
    """``serve --host DEST`` without ``--detach``: the server started there as ``--detach`` starts it,
    then followed here with the one relay of placed output (``remote_run.relay``: the host's ``runs
    follow``, reconnecting after a dropped connection while the server goes on there), its endpoint
    forwarded to ``--port`` here (asked for again whenever it stops answering). Ctrl-C / SIGTERM stop
    the job there (``runs stop``: the engine's tree ends, its port is freed) and cancel the forward
    here (exit 0); a failed server: its message and last lines (exit 2 for bad input, else 1). If this
    command is killed, the server goes on: ``gaudi-gui runs --host DEST stop RUN`` ends it."""
    from gaudi_gui.commands import remote_run

    try:
        started = _start_on_host(args, spec, out)
    except KeyboardInterrupt:
        out.state("stopped", f"interrupted while starting on {args.host}: if it started there, `gaudi-gui "
                             f"runs --host {args.host} list` shows it (runs stop ends it)")
        return 0
    if isinstance(started, int):
        return started
    host, fwd, info = started
    folder, url = str(info["folder"]), sv.endpoint_url(fwd.local_port)
    key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
    out.state("starting", f"starting on {host.name} (its port {fwd.remote_port} forwarded to "
                          f"{fwd.local_port} here; run folder there: {folder}; it goes on if this command "
                          f"or the connection ends)", host=host.name, folder=folder)
    run = remote_run.HostRun(host, 0, folder)
    failure: dict[str, Any] = {}
    log: deque[str] = deque(maxlen=LAST_LINES)
    ready = threading.Event()
    done = threading.Event()
    stop_sent: list[int] = []
    tokens: dict[str, Any] = {}  # the engine's last token totals there

    def keep_forward() -> None:
        """While it serves: the forward asked for again whenever it stops answering (a connection
        made again, a master that was replaced). /health: the probes are not logged as requests."""
        while not done.wait(5.0):
            if ready.is_set() and _get(f"http://127.0.0.1:{fwd.local_port}/health", key, timeout=3) == 0:
                forward(host.name, fwd)

    def take(_run: Any, msg: dict[str, Any]) -> None:
        kind = msg.get("t")
        if kind == "log":
            log.append(str(msg.get("line", "")))
        elif kind == "reconnecting":
            out.state("reconnecting", f"the connection to {host.name} dropped ({msg.get('why')}): "
                                      f"reconnecting in {msg.get('in'):g} s; the server goes on there",
                      host=host.name)
        elif kind == "lost":
            failure.setdefault("message", f"{msg.get('why')}; the server goes on on {host.name}: gaudi-gui "
                                          f"runs --host {host.name} stop {folder}")
        elif kind == "event":
            event = {k: v for k, v in (msg.get("event") or {}).items() if k not in ("v", "rank", "time")}
            _take_event(event)

    def _take_event(event: dict[str, Any]) -> None:
        kind, state = event.get("type"), event.get("state")
        if kind == EventType.SERVE_URL and not ready.is_set():
            # /health, not /v1/models: the probe is not listed as a request
            forward(host.name, fwd)
            if _get(f"http://127.0.0.1:{fwd.local_port}/health", key, timeout=10) != 200:
                _mux(host.name, fwd, "forward")
            ready.set()
            context = event.get("context")
            out.ready(f"ready on {host.name}: {url}", url, host=host.name, model=str(event.get("model", "")),
                      name=str(event.get("name") or spec.model.strip()),
                      **({"context": context} if isinstance(context, int) else {}))
        elif kind == EventType.SERVE_STATE and state == "failed":
            failure.update(event)
        elif kind == EventType.SERVE_STATE and state not in ("ready", "stopped"):
            out.state(str(state), f"{host.name}: {event.get('message', '')}", host=host.name)
        elif kind == EventType.SERVE_PROGRESS:
            out.progress(sv.WarmupProgress(str(event.get("phase")), int(event.get("step") or 0),
                                           int(event.get("total") or 0), float(event.get("fraction") or 0.0),
                                           event.get("eta_s")))
        elif kind == EventType.SERVE_REQUEST:
            out.request(sv.RequestRecord.from_dict(event))
        elif kind == EventType.SERVE_TOKENS:
            tokens.clear()
            tokens.update({k: v for k, v in event.items() if k != "type"})
            out.tokens(tokens)

    def on_signal(count: int, name: str) -> None:
        stop_sent.append(count)
        out.state("stopping", f"{name}: stopping the server on {host.name}" +
                  (" now" if count > 1 else " (again: kill it now)"), host=host.name)
        threading.Thread(target=remote_run.stop_runs, args=([run], count > 1), daemon=True).start()

    threading.Thread(target=keep_forward, name="forward", daemon=True).start()
    try:
        remote_run.relay([run], take, reconnect_s=RECONNECT_S, on_signal=on_signal)
    finally:
        done.set()
        if ready.is_set() and run.final is not None:
            # The forward belongs to the multiplexed master, which outlives this command: give it back.
            _mux(host.name, fwd, "cancel")
    final = run.final or {}
    if run.final is None:
        out.fail(f"following the server on {host.name}: {failure.get('message') or run.lost}")
        return 1
    out.tokens(tokens, final=True)
    if not failure and (stop_sent or final.get("state") == "stopped"):  # here, or runs stop from elsewhere
        free = sv.port_free(fwd.local_port)
        out.state("stopped", f"stopped on {host.name}; port {fwd.local_port} here is free" if free
                  else f"stopped on {host.name}", host=host.name)
        return 0
    message = str(failure.get("message") or final.get("summary") or final.get("state"))
    out.fail(f"on {host.name}: {message}", [str(x) for x in failure.get("lines") or []] or list(log))
    return 2 if final.get("exit_code") == 2 else 1


def forward(dest: str, fwd: Any) -> bool:
    """Ask the multiplexed connection to ``dest`` (made first when there is none) for ``fwd``;
    whether the local port now reaches the host (a taken local port says nothing: checked first)."""
    from gaudi_gui.core.remote import ssh_base, ssh_target

    if not sv.port_free(fwd.local_port):
        return False
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([*ssh_base(dest), "--", ssh_target(dest), "true"], capture_output=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    _mux(dest, fwd, "forward")
    return not sv.port_free(fwd.local_port)


#: How long the follow of a server on a host tries to reach it again after the connection dropped
#: (the server goes on there meanwhile).
RECONNECT_S = 600.0


def _mux(dest: str, fwd: Any, op: str) -> None:
    """``ssh -O forward`` (ask the multiplexed connection for the forward again: nothing answers
    through it now) or ``-O cancel`` (the master would hold the local port until it ends)."""
    from gaudi_gui.core.remote import ssh_base, ssh_target

    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([*ssh_base(dest), "-O", op, *fwd.ssh_option(), "--", ssh_target(dest)],
                       capture_output=True, timeout=15)

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

``--host DEST``: the same command runs on the host (``core.placement``: ssh, under the guard, so a
killed client or a dropped connection leaves nothing there), bound to the host's loopback on
``--remote-port``; a local port forward on the same multiplexed connection makes the endpoint
``http://127.0.0.1:PORT/v1`` here. A forward that stops answering while the connection lives is asked
for again (``ssh -O forward``).

``--events``: JSON lines (core.protocol) for the app: ``serve_state`` (starting, loading, warming,
ready, stopped, failed), ``serve_progress`` (warm-up fraction and ETA), ``serve_url``, ``serve_request``.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import errno
import json
import os
import queue
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
    p.add_argument("--events", action="store_true", help="print JSON-lines events for the app")
    add_detach_arguments(p, "serve")
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
            self._say(protocol.event("serve_state", state=state, message=message, **extra))
        else:
            self._say(message)

    def progress(self, p: sv.WarmupProgress) -> None:
        if self.events:
            self._say(protocol.event("serve_progress", phase=p.phase, step=p.step, total=p.total,
                                     fraction=p.fraction, eta_s=p.eta_s))
        else:
            eta = f", about {p.eta_s:.0f} s left" if p.eta_s is not None else ""
            self._say(f"warm-up {p.phase} {p.step}/{p.total} ({p.fraction:.0%}{eta})")

    def url(self, url: str, **extra: Any) -> None:
        if self.events:
            self._say(protocol.event("serve_url", url=url, **extra))
        self._say(url)

    def request(self, record: sv.RequestRecord) -> None:
        if self.events:
            self._say(protocol.event("serve_request", **record.to_dict()))
        else:
            stamp = time.strftime("%H:%M:%S", time.localtime(record.time))
            self._say(f"{stamp} {record.method} {record.path} {record.status}")

    def fail(self, message: str, lines: list[str] | None = None) -> None:
        if self.events:
            self._say(protocol.event("serve_state", state="failed", message=message, lines=lines or []))
        self._say(f"gaudi-gui serve: {message}", err=True)
        for line in lines or []:
            self._say(f"  | {line}", err=True)


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
                        listen_all=args.listen_all, cards=cards)
    problems += spec.problems()
    if args.remote_port and not 1 <= args.remote_port <= 65535:
        problems.append(("remote_port", "a port is 1-65535"))
    host = (args.host or "").strip()
    if args.remote_port and not (host and host != "local"):
        problems.append(("remote_port", "only with --host (the server's port on the host's loopback)"))
    if problems:
        out.fail("; ".join(f"--{f.replace('_', '-')}: {m}" for f, m in problems))
        return 2
    if spec.api_key_env and not os.environ.get(spec.api_key_env):
        out.fail(f"--api-key-env: the environment variable {spec.api_key_env} is not set")
        return 2
    if args.detach and host and host != "local":
        return _detach_on_host(args, spec, out)
    if args.detach:
        from gaudi_gui.commands.detach import detach_command
        name = f"serve-{Path(spec.model).name or 'model'}"
        return detach_command("serve", "serve", spec.cli_args(), name=name, runs_dir=args.runs_dir,
                              as_json=args.json)
    old = {s: signal.signal(s, _raise_stop) for s in (signal.SIGTERM, signal.SIGHUP)}
    try:
        if host and host != "local":
            return _on_host(args, spec, out)
        return _here(spec, out)
    finally:
        for s, handler in old.items():
            signal.signal(s, handler)


# -- here --------------------------------------------------------------------------------------------

def _transformers_program() -> list[str] | None:
    beside = Path(sys.executable).parent / "transformers"
    if beside.is_file():
        return [str(beside)]
    found = shutil.which("transformers")
    return [found] if found else None


def _adapter_base(adapter: str) -> str:
    data = json.loads((Path(adapter) / "adapter_config.json").read_text())
    base = str(data.get("base_model_name_or_path") or "")
    if not base:
        raise ValueError("its adapter_config.json names no base model")
    return base


def _here(spec: sv.ServeSpec, out: _Out) -> int:
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
            out.fail(f"--port: {record.orphan_message()}")
        else:
            out.fail(f"--port: port {spec.port} is taken by another gaudi-gui serve (pid {record.owner.pid}, "
                     f"model {record.model}); choose another")
        return 2
    if not sv.port_free(spec.port, bind):
        out.fail(f"--port: port {spec.port} is already taken on {bind}; choose another")
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
    is_demo = paths.is_demo(model)
    problem = sv.check_model(model, is_demo=is_demo)
    if problem:
        out.fail(f"--model: {problem}")
        return 2
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


def _reader(stream: Any, lines: queue.Queue[str | None]) -> None:
    for raw in iter(stream.readline, b""):
        lines.put(raw.decode("utf-8", "replace").rstrip("\r\n"))
    lines.put(None)


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
    # Only the chosen cards (HABANA_VISIBLE_MODULES / CUDA_VISIBLE_DEVICES), as a training run's.
    env.update(visibility.device_env(sv.device_here(spec.device), spec.cards))
    key = os.environ.get(spec.api_key_env, "") if spec.api_key_env else ""
    if choice.engine == "vllm":
        program = shutil.which("vllm")
        if program is None:
            out.fail(f"--engine: {sv.vllm_install_hint()}")
            return 2
        argv = sv.vllm_argv([program], model, spec, bind=bind, adapter=adapter)
        if key:
            env["VLLM_API_KEY"] = key
    else:
        program_words = _transformers_program()
        if program_words is None:
            out.fail("--engine: the transformers command is missing: install transformers with its serving "
                     "extra (pip install 'transformers[serving]')")
            return 2
        argv = sv.transformers_argv(program_words, model, spec, bind=bind)
    env["PYTHONUNBUFFERED"] = "1"
    # The engine ends with this process even when it is SIGKILLed (nothing here runs then): the kernel
    # sends it SIGTERM (PR_SET_PDEATHSIG); and it is recorded, so that an engine that did not end (hung,
    # stopped) is named by the next serve on its port instead of a bare "port taken".
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env=env, start_new_session=True,
                            preexec_fn=die_with_parent())  # noqa: PLW1509 - only with no other thread
    tree = ProcessTree(proc.pid)
    record = _record_engine(proc.pid, spec.port, bind, model, choice.engine)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    last: deque[str] = deque(maxlen=LAST_LINES)
    warmup = sv.WarmupParser()
    url = sv.endpoint_url(spec.port)
    models_url = f"http://127.0.0.1:{spec.port}/v1/models"
    out.state("loading", f"loading {model} ({choice.engine}, pid {proc.pid})", pid=proc.pid,
              engine=choice.engine, reason=choice.reason)
    warming = False

    def drain(on_line: Callable[[str], None], wait: float) -> bool:
        """Read what the engine printed; False once its output ended."""
        try:
            item = lines.get(timeout=wait)
        except queue.Empty:
            return True
        while True:
            if item is None:
                return False
            last.append(item)
            on_line(item)
            try:
                item = lines.get_nowait()
            except queue.Empty:
                return True

    def while_starting(line: str) -> None:
        nonlocal warming
        progress = warmup.feed(line)
        if progress is not None:
            if not warming:
                warming = True
                out.state("warming", "warming up (compiling a graph per bucket)")
            out.progress(progress)

    probe_lines = 1  # the readiness probe's own GET /v1/models is no one's request

    def while_serving(line: str) -> None:
        nonlocal probe_lines
        record = sv.parse_request(line)
        if record is None:
            return
        if record.path == "/health":
            return  # the forward's liveness probe (--host), not a request of the user's
        if probe_lines and record.path == "/v1/models" and record.status == 200:
            probe_lines -= 1
            return
        out.request(record)

    try:
        started = time.monotonic()
        while True:
            alive = drain(while_starting, 0.25)
            if proc.poll() is not None or not alive:
                proc.wait()
                out.fail(f"the server ended before it answered (exit {proc.returncode})", list(last))
                return 1
            if _get(models_url, key) == 200:
                break
            if time.monotonic() - started > READY_TIMEOUT_S:
                out.fail(f"the server did not answer within {READY_TIMEOUT_S:.0f} s", list(last))
                return 1
        out.state("ready", f"ready after {time.monotonic() - started:.1f} s: {url}", url=url)
        out.url(url, model=model)
        while drain(while_serving, 0.5):
            if proc.poll() is not None:
                break
        proc.wait()
        drain(while_serving, 0.1)
        out.fail(f"the server ended by itself (exit {proc.returncode})", list(last))
        return 1
    except (KeyboardInterrupt, _Stop):
        return _stop(proc, tree, spec.port, bind, out)
    finally:
        if proc.poll() is None:
            tree.kill()
            proc.wait()
        if record is not None:
            sv.forget_engine_record(record)


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


def _stop(proc: subprocess.Popen[bytes], tree: ProcessTree, port: int, bind: str, out: _Out) -> int:
    """End the engine's whole tree (SIGTERM, then SIGKILL after 10 s) and wait until the port is free."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut the clean-up short
    try:
        tree.record()
        tree.signal(signal.SIGTERM)
        tree.signal_recorded(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        tree.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=5)
        deadline = time.monotonic() + 10
        while not sv.port_free(port, bind) and time.monotonic() < deadline:
            time.sleep(0.1)
        out.state("stopped", f"stopped; port {port} is free" if sv.port_free(port, bind)
                  else f"stopped; port {port} is still held by another process")
        return 0
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)


# -- on a host ---------------------------------------------------------------------------------------

def _on_host(args: argparse.Namespace, spec: sv.ServeSpec, out: _Out) -> int:
    from gaudi_gui.core.placement import Forward, Placement
    from gaudi_gui.core.remote import HostError

    try:
        placement = Placement.from_cli(host=args.host, remote_command=args.remote_command)
    except HostError as exc:
        out.fail(f"--host: {exc}")
        return 2
    host = placement.host
    local_port = spec.port
    remote_port = args.remote_port or spec.port
    if not sv.port_free(local_port):
        out.fail(f"--port: port {local_port} is already taken here; choose another")
        return 2
    remote_spec = dataclasses.replace(spec, port=remote_port)
    forward = Forward(local_port, remote_port)
    env = {spec.api_key_env: os.environ[spec.api_key_env]} if spec.api_key_env else None
    argv = placement.start_argv(host, ["serve", *remote_spec.cli_args(), "--events"], guard=True, env=env,
                                forwards=[forward])
    out.state("starting", f"starting on {host.name} (its port {remote_port} forwarded to {local_port} here)",
              host=host.name)
    attempt = 0
    while True:
        outcome, code = _host_session(argv, host.name, forward, key_env=spec.api_key_env, out=out,
                                      reconnecting=attempt > 0)
        if outcome != "dropped" or attempt >= RECONNECTS:
            return code
        attempt += 1
        # The connection went (a network cut, a sleeping laptop): the guard has ended the server
        # there; start it again on a new connection, the same ports.
        out.state("reconnecting", f"the connection to {host.name} dropped: reconnecting "
                                  f"({attempt}/{RECONNECTS})", host=host.name)
        try:
            time.sleep(3.0 * attempt)
            deadline = time.monotonic() + 20
            while not sv.port_free(local_port) and time.monotonic() < deadline:
                time.sleep(0.2)
        except (KeyboardInterrupt, _Stop):
            out.state("stopped", f"stopped while reconnecting to {host.name}")
            return 0


def _detach_on_host(args: argparse.Namespace, spec: sv.ServeSpec, out: _Out) -> int:
    """``serve --host DEST --detach``: the host's own ``serve --detach`` (its supervisor and run folder
    are the host's: the server outlives this command and the connection), then the forward of
    ``--port`` here to its port there on the multiplexed connection. ``runs --host DEST follow|stop``
    follow and stop it; ``forward`` asks for the forward again after the connection dropped."""
    from gaudi_gui.commands.detach import detach_on_host, print_started
    from gaudi_gui.core.placement import Forward, Placement
    from gaudi_gui.core.remote import HostError

    try:
        placement = Placement.from_cli(host=args.host, remote_command=args.remote_command)
    except HostError as exc:
        out.fail(f"--host: {exc}")
        return 2
    if spec.api_key_env:
        out.fail("--api-key-env: not with --host and --detach (the key would not cross the connection)")
        return 2
    if not sv.port_free(spec.port):
        out.fail(f"--port: port {spec.port} is already taken here; choose another")
        return 2
    host, remote_port = placement.host, args.remote_port or spec.port
    info, why, code = detach_on_host(host, ["serve", *dataclasses.replace(spec, port=remote_port).cli_args()])
    if info is None:
        out.fail(why)
        return code
    forward(host.name, Forward(spec.port, remote_port))
    info.update(host=host.name, url=sv.endpoint_url(spec.port), remote_port=remote_port)
    print_started(info, "serve", as_json=args.json)
    return 0


def forward(dest: str, fwd: Any) -> bool:
    """Ask the multiplexed connection to ``dest`` (made first when there is none) for ``fwd``;
    whether the local port now reaches the host (a taken local port says nothing: checked first)."""
    from gaudi_gui.core.remote import ssh_base

    if not sv.port_free(fwd.local_port):
        return False
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([*ssh_base(), "--", dest, "true"], capture_output=True, timeout=30,
                       stdin=subprocess.DEVNULL)
    _reforward(ssh_base, dest, fwd)
    return not sv.port_free(fwd.local_port)


#: How often a dropped connection to a host is re-made (the server is started again there).
RECONNECTS = 3


def _host_session(argv: list[str], host_name: str, forward: Any, *, key_env: str, out: _Out,
                  reconnecting: bool) -> tuple[str, int]:
    """One ssh session running the server on the host: ("stopped" | "failed" | "dropped", exit code).
    "dropped": ssh lost the connection (exit 255) after the server was ready, or, while reconnecting,
    before it (the host's port still held by the server the guard is ending is retried too)."""
    from gaudi_gui.core.remote import ssh_base

    local_port = forward.local_port
    # stdin stays open (a pipe never written): the guard ends the server there when it closes.
    proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            start_new_session=True)
    lines: queue.Queue[str | None] = queue.Queue()
    threading.Thread(target=_reader, args=(proc.stdout, lines), daemon=True).start()
    errors: deque[str] = deque(maxlen=LAST_LINES)

    def read_errors() -> None:
        assert proc.stderr is not None
        for raw in iter(proc.stderr.readline, b""):
            errors.append(raw.decode("utf-8", "replace").rstrip())

    threading.Thread(target=read_errors, daemon=True).start()
    url = sv.endpoint_url(local_port)
    key = os.environ.get(key_env, "") if key_env else ""
    ready = False
    remote_failed: dict[str, Any] = {}
    remote_model = ""
    next_check = 0.0
    try:
        while True:
            try:
                item = lines.get(timeout=0.5)
            except queue.Empty:
                item = ""
            if item is None:
                break
            message = protocol.decode(item) if item else None
            if message is not None:
                kind = message.get("type")
                fields = {k: v for k, v in message.items() if k not in ("type", "v")}
                if kind == "serve_state" and fields.get("state") == "ready":
                    # /health, not /v1/models: the probe is not listed as a request
                    if _get(f"http://127.0.0.1:{local_port}/health", key, timeout=10) != 200:
                        _reforward(ssh_base, host_name, forward)
                    ready = True
                    out.state("ready", f"ready on {host_name}: {url}", url=url, host=host_name)
                    out.url(url, host=host_name, model=remote_model)
                elif kind == "serve_url":
                    remote_model = str(fields.get("model", ""))
                elif kind == "serve_state" and fields.get("state") == "failed":
                    remote_failed = fields
                elif kind == "serve_state":
                    out.state(str(fields.get("state")), f"{host_name}: {fields.get('message', '')}",
                              host=host_name)
                elif kind == "serve_progress":
                    out.progress(sv.WarmupProgress(str(fields.get("phase")), int(fields.get("step") or 0),
                                                   int(fields.get("total") or 0),
                                                   float(fields.get("fraction") or 0.0),
                                                   fields.get("eta_s")))
                elif kind == "serve_request":
                    out.request(sv.RequestRecord.from_dict(fields))
            if ready and time.monotonic() > next_check:
                next_check = time.monotonic() + 5
                # /health: the probes are not logged as requests (see while_serving)
                if _get(f"http://127.0.0.1:{local_port}/health", key, timeout=3) == 0 and proc.poll() is None:
                    _reforward(ssh_base, host_name, forward)
        proc.wait()
        # The port there still held by the server the guard is ending (or its engine, ending by itself).
        port_held = any(words in str(remote_failed.get("message", "")) for words in (
            "already taken", "held by an earlier gaudi-gui serve engine", "taken by another gaudi-gui serve"))
        if (proc.returncode == 255 and (ready or reconnecting)) or (reconnecting and port_held):
            # A new multiplexing master made for this session may hold the forward (and the local
            # port) for ControlPersist after it: give it back before the next try.
            _cancel_forward(ssh_base, host_name, forward)
            return "dropped", 1
        if remote_failed:
            out.fail(f"on {host_name}: {remote_failed.get('message', '')}",
                     [str(x) for x in remote_failed.get("lines") or []])
            return "failed", 2 if proc.returncode == 2 else 1
        out.fail(f"the server on {host_name} ended (exit {proc.returncode})", list(errors))
        return "failed", 1 if proc.returncode != 2 else 2
    except (KeyboardInterrupt, _Stop):
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        try:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # type: ignore[union-attr]  # the guard stops the server there
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            # The forward belongs to the multiplexed master, which outlives this session: give it back.
            _cancel_forward(ssh_base, host_name, forward)
            out.state("stopped", f"stopped on {host_name}; port {local_port} here is free"
                      if sv.port_free(local_port) else f"stopped on {host_name}")
            return "stopped", 0
        finally:
            signal.signal(signal.SIGINT, signal.default_int_handler)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                proc.stdin.close()  # type: ignore[union-attr]
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _reforward(ssh_base: Callable[..., list[str]], dest: str, forward: Any) -> None:
    """Ask the multiplexed connection for the forward again (it answers nothing through it now)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([*ssh_base(), "-O", "forward", *forward.ssh_option(), "--", dest],
                       capture_output=True, timeout=15)


def _cancel_forward(ssh_base: Callable[..., list[str]], dest: str, forward: Any) -> None:
    """Cancel the forward in the multiplexed master (it would hold the local port until it ends)."""
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        subprocess.run([*ssh_base(), "-O", "cancel", *forward.ssh_option(), "--", dest],
                       capture_output=True, timeout=15)

"""The agent's interactive children: the model runner's worker, the environment probe, the schema and
validation children, the SFT preview and merge, the dashboards, a run on several hosts' pre-flight and
its whole job meter kept (issue 38: the window starts none).

``child.start {kind, args}`` starts one and answers its ``child_id``; the starting session is
subscribed to its output at once (no line is lost between the reply and a subscribe). Every read of
the child's stdout or stderr is published as one ``Ev.OUTPUT {child_id, messages}``: a protocol line
(``core.protocol``, on either stream) becomes its message, any other line ``{"stream", "line"}``.
Its end comes once as ``{child_id, end: {exit_code, status, stopped, tail}}``. ``child.send`` writes
a line to its stdin (or closes it), ``child.stop`` ends it: SIGTERM to its group, SIGKILL after a grace.

The argv of a kind is built here from its arguments (``KINDS``), never from shell text: a client names
what to run, not how. These children are not jobs: they belong to the session that started them and
end with it (a closed window ends its runner's worker), unlike training runs, which outlive everything.
"""

from __future__ import annotations

import asyncio
import codecs
import contextlib
import dataclasses
import itertools
import json
import os
import signal
import sys
import tempfile
from collections import deque
from collections.abc import Callable
from typing import Any

from gaudi_gui.agent.server import Agent, Handler, Refused, Session
from gaudi_gui.core import prepare, proctree, protocol
from gaudi_gui.core.agentwire import Ev
from gaudi_gui.core.visibility import child_env

#: Seconds between SIGTERM and SIGKILL when a stop names no grace.
GRACE_S = 5.0
#: Lines of stderr (and plain stdout) kept for the end's ``tail``.
TAIL_LINES = 60
#: A line longer than this without a newline is cut into a line (memory stays bounded).
MAX_LINE_CHARS = 1 << 20
#: The most bytes one read takes (one Ev.OUTPUT per read).
READ_BYTES = 1 << 16
#: Seconds a child's output is still read after it exited (what a helper still holding its pipes may say).
PIPES_AFTER_EXIT_S = 2.0
#: How often a child whose output is still open is looked at for its exit status.
EXIT_POLL_S = 0.5


@dataclasses.dataclass
class Spec:
    """How to run one child: its argv (no shell), its whole environment, files to delete at its end."""

    argv: list[str]
    env: dict[str, str]
    files: list[str] = dataclasses.field(default_factory=list)


def _python(args: dict[str, Any]) -> str:
    """The interpreter to run: the agent's own, or an absolute path to an executable file."""
    python = str(args.get("python") or "")
    if not python:
        return sys.executable
    if not os.path.isabs(python) or not os.access(python, os.X_OK) or os.path.isdir(python):
        raise Refused(f"python must be the absolute path of an executable: {python!r}")
    return python


def _str_map(value: Any, what: str) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise Refused(f"{what} must be an object of names to values")
    return {str(k): str(v) for k, v in value.items()}


def _temp_json(prefix: str, body: Any) -> str:
    fd, path = tempfile.mkstemp(prefix=prefix, suffix=".json")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        fh.write(body if isinstance(body, str) else json.dumps(body))
    return path


def _generate(args: dict[str, Any]) -> Spec:
    return Spec([_python(args), "-m", "gaudi_gui.workers.generate"],
                child_env(_str_map(args.get("env"), "env")))


def _probe(args: dict[str, Any]) -> Spec:
    return Spec([_python(args), "-m", "gaudi_gui.workers.probe"], child_env())


def _device(args: dict[str, Any]) -> tuple[str, dict[str, str]]:
    device = str(args.get("device") or "cpu")
    if device not in ("cpu", "cuda", "hpu"):
        raise Refused(f"no such device: {device!r} (cpu, cuda or hpu)")
    return device, _str_map(args.get("device_env"), "device_env")


def _schema(args: dict[str, Any]) -> Spec:
    device, device_env = _device(args)
    return Spec([_python(args), "-m", "gaudi_gui.workers.schema"], prepare.child_env(device, device_env))


def _validate(args: dict[str, Any]) -> Spec:
    device, device_env = _device(args)
    training_args = args.get("training_args")
    if not isinstance(training_args, dict):
        raise Refused("validate needs training_args (an object)")
    path = _temp_json("gaudi-gui-validate-", {
        "training_args": training_args, "env": prepare.device_variables(device, device_env),
        "num_processes": max(1, int(args.get("num_processes") or 1)),
        # The objective's config class builds the arguments (DPOConfig for a DPO job); the child
        # takes only the names it knows.
        "objective": str(args.get("objective") or "sft")})
    return Spec([_python(args), "-m", "gaudi_gui.workers.schema", "--validate", path],
                prepare.child_env(device, device_env), [path])


def _helper_env() -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    return env


def _sft_preview(args: dict[str, Any]) -> Spec:
    job = args.get("job")
    if not isinstance(job, str) or not job.strip().startswith("{"):
        raise Refused("sft_preview needs job (the job's JSON text)")
    path = _temp_json("gaudi-gui-preview-", job)
    rows = max(1, min(100, int(args.get("rows") or 3)))
    return Spec([_python(args), "-m", "gaudi_gui.workers.sft_data", "--config", path, "--rows", str(rows)],
                _helper_env(), [path])


def _merge(args: dict[str, Any]) -> Spec:
    adapter, out = str(args.get("adapter") or ""), str(args.get("out") or "")
    if not adapter or not out:
        raise Refused("merge needs adapter and out (folders)")
    return Spec([_python(args), "-m", "gaudi_gui.workers.merge", "--adapter", adapter, "--out", out],
                _helper_env())


def _dashboard(args: dict[str, Any]) -> Spec:
    kind, folder = str(args.get("kind") or ""), str(args.get("folder") or "")
    if kind not in ("tensorboard", "trackio"):
        raise Refused(f"no such dashboard: {kind!r} (tensorboard or trackio)")
    if not folder:
        raise Refused("dashboard needs folder (the run's folder)")
    argv = [sys.executable, "-m", "gaudi_gui", "runs", "open", folder, f"--{kind}", "--no-browser", "--json"]
    if args.get("python"):
        argv += ["--python", str(args["python"])]  # one argument of the command, which checks it
    env = dict(os.environ)
    env.setdefault("PYTHONUNBUFFERED", "1")
    return Spec(argv, env)


def _export(args: dict[str, Any]) -> Spec:
    """``runs export`` of one run folder: TensorBoard event files (``tensorboard``: a folder) or
    trackio's storage (``trackio_dir``, ``project``); each value one argument, given as ``--opt=value``
    (a value that starts with "-" stays a value), checked by the command."""
    folder = str(args.get("folder") or "")
    if not os.path.isabs(folder) or "\0" in folder:
        raise Refused(f"export needs folder (a run folder's absolute path): {folder!r}")
    argv = [_python(args), "-m", "gaudi_gui", "runs", "export", folder]
    if args.get("tracker") == "trackio":
        argv.append("--trackio")
        if args.get("trackio_dir"):
            argv.append(f"--trackio-dir={args['trackio_dir']}")
        if args.get("project"):
            argv.append(f"--project={args['project']}")
    elif args.get("tracker") == "tensorboard" and args.get("tensorboard"):
        argv.append(f"--tensorboard={args['tensorboard']}")
    else:
        raise Refused("export needs tracker: tensorboard (with its folder) or trackio")
    return Spec(argv, _helper_env())


def _doctor(args: dict[str, Any]) -> Spec:
    """This machine's doctor: its JSON report (health, the start gate), or with ``report`` (an absolute
    path) the bug report written there (``about``: a saved host's name, its parts made on that host)."""
    report = str(args.get("report") or "")
    if report:
        if not os.path.isabs(report) or "\0" in report:
            raise Refused(f"report must be an absolute path: {report!r}")
        about = str(args.get("about") or "")
        argv = [_python(args), "-m", "gaudi_gui", "doctor", "--report", report]
        if about:
            argv += ["--host", about]  # one argument: the command checks the name
        return Spec(argv, dict(os.environ))
    argv = [_python(args), "-m", "gaudi_gui", "doctor", "--json", "--timeout",
            f"{max(1.0, float(args.get('timeout_s') or 30)):g}"]
    if args.get("hl_smi"):
        argv += ["--hl-smi", str(args["hl_smi"])]
    if args.get("background"):
        argv.append("--background")  # the periodic check: below the window and the runs
    return Spec(argv, dict(os.environ))


def _fetch(args: dict[str, Any]) -> Spec:
    """``runs --host HOST fetch FOLDER``: a run that ended on a host (its records and its profile trace)
    brought into this machine's runs store (``runs_dir``: the window's), over that host's ssh
    connection (core.run_copy). Each value one argument, checked by the command."""
    folder, host = str(args.get("folder") or ""), str(args.get("host") or "")
    if not folder.startswith("/") or "\0" in folder:
        raise Refused(f"fetch needs folder (the run folder's absolute path on the host): {folder!r}")
    if not host or "\0" in host:
        raise Refused("fetch needs host (a saved host's ssh destination)")
    argv = [_python(args), "-m", "gaudi_gui", "runs", f"--host={host}"]
    if args.get("remote_command"):
        argv.append(f"--remote-command={args['remote_command']}")
    if args.get("runs_dir"):
        argv.append(f"--runs-dir={args['runs_dir']}")
    return Spec([*argv, "fetch", folder, "--json"], dict(os.environ))


def _ssh_config(args: dict[str, Any]) -> Spec:
    """``ssh -G DEST``: ssh's resolved configuration of a host, without connecting (the Hosts tab's
    address of a host, as other machines reach it)."""
    from gaudi_gui.core import multi_host, remote
    try:
        dest = remote.check_destination(str(args.get("dest") or ""))
    except remote.HostError as exc:
        raise Refused(f"ssh_config: {exc}") from None
    return Spec(multi_host.ssh_g_argv(remote.Host.parse(dest)), dict(os.environ))


#: ``hosts --setup``'s own options a set-up may carry, and whether each takes a value.
_SETUP_OPTIONS = {"--venv": True, "--python": True, "--no-deps": False}


def _host_setup(args: dict[str, Any]) -> Spec:
    """``gaudi-gui hosts --setup DEST [--venv PATH] [--python PY] [--no-deps]``: this gaudi-gui installed
    on a saved host (a wheel built here, a venv there). Only those options, each value one argument."""
    from gaudi_gui.core import remote
    try:
        dest = remote.check_destination(str(args.get("dest") or ""))
    except remote.HostError as exc:
        raise Refused(f"host_setup: {exc}") from None
    words = [str(w) for w in args.get("options") or []]
    argv = [_python(args), "-m", "gaudi_gui", "hosts", f"--setup={dest}"]
    at = 0
    while at < len(words):
        option = words[at]
        if option not in _SETUP_OPTIONS:
            raise Refused(f"host_setup: {option!r} is not one of {', '.join(_SETUP_OPTIONS)}")
        if _SETUP_OPTIONS[option]:
            if at + 1 >= len(words) or "\0" in words[at + 1]:
                raise Refused(f"host_setup: {option} needs a value")
            argv.append(f"{option}={words[at + 1]}")
            at += 2
        else:
            argv.append(option)
            at += 1
    return Spec(argv, dict(os.environ))


def _host_name(value: Any, kind: str) -> str:
    """A host's name as one piece of an argument (the command checks it is a destination)."""
    name = str(value or "")
    if not name or any(c in name for c in "\0,=") or name != name.strip():
        raise Refused(f"{kind} needs each host's name (an ssh destination, or local): {name!r}")
    return name


def _remote_command(value: Any, kind: str) -> str:
    command = str(value or "")
    if "\0" in command or "\n" in command:
        raise Refused(f"{kind}: a remote command is one line: {command!r}")
    return command


def _hosts_preflight(args: dict[str, Any]) -> Spec:
    """``hosts --preflight A,B --config JOB --port N --json``: a run on several hosts' pre-flight and host
    0's address (core.multi_host.preflight_answer), before the Training tab starts it. ``hosts``: a list
    of {name, remote_command} in machine-rank order; ``job``: the job (an object, written to a temporary
    file); ``port``: the main process port; ``main_ip``: host 0's address, when given."""
    hosts = args.get("hosts")
    if not isinstance(hosts, list) or len(hosts) < 2 or not all(isinstance(h, dict) for h in hosts):
        raise Refused("hosts_preflight needs hosts (a list of two or more {name, remote_command})")
    names = [_host_name(h.get("name"), "hosts_preflight") for h in hosts]
    commands = [_remote_command(h.get("remote_command"), "hosts_preflight") for h in hosts]
    job = args.get("job")
    if not isinstance(job, dict):
        raise Refused("hosts_preflight needs job (the job, an object)")
    port = args.get("port")
    if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
        raise Refused(f"hosts_preflight needs port (the main process port, 1-65535): {port!r}")
    main_ip = str(args.get("main_ip") or "")
    if "\0" in main_ip:
        raise Refused(f"hosts_preflight: main_ip is an address: {main_ip!r}")
    argv = [_python(args), "-m", "gaudi_gui", "hosts", f"--preflight={','.join(names)}", f"--port={port}",
            "--json", *(f"--host-command={n}={c}" for n, c in zip(names, commands, strict=True) if c)]
    if main_ip:
        argv.append(f"--main-ip={main_ip}")
    path = _temp_json("gaudi-gui-preflight-", job)
    return Spec([*argv, f"--config={path}"], dict(os.environ), [path])


def _keep_job_meter(args: dict[str, Any]) -> Spec:
    """``hosts --host H --keep-job-meter FOLDER --meter FILE --json``: a run on several hosts' whole job
    meter (``meter``: an object, written to a temporary file) kept in host 0's run ``folder`` on ``host``
    (core.multi_host.keep_job_meter_answer). Each value one argument, checked by the command."""
    host = _host_name(args.get("host"), "keep_job_meter")
    command = _remote_command(args.get("remote_command"), "keep_job_meter")
    folder = str(args.get("folder") or "")
    if not folder.startswith("/") or "\0" in folder:
        raise Refused(f"keep_job_meter needs folder (host 0's run folder, an absolute path): {folder!r}")
    meter = args.get("meter")
    if not isinstance(meter, dict):
        raise Refused("keep_job_meter needs meter (the whole job's meter, an object)")
    argv = [_python(args), "-m", "gaudi_gui", "hosts", f"--host={host}"]
    if command:
        argv.append(f"--remote-command={command}")
    path = _temp_json("gaudi-gui-job-meter-", meter)
    return Spec([*argv, f"--keep-job-meter={folder}", f"--meter={path}", "--json"], dict(os.environ), [path])


#: Every kind of interactive child: its name -> its argv and environment from the request's ``args``.
KINDS: dict[str, Callable[[dict[str, Any]], Spec]] = {
    "generate": _generate, "probe": _probe, "schema": _schema, "validate": _validate,
    "sft_preview": _sft_preview, "merge": _merge, "dashboard": _dashboard, "doctor": _doctor,
    "export": _export, "fetch": _fetch, "ssh_config": _ssh_config, "host_setup": _host_setup,
    "hosts_preflight": _hosts_preflight, "keep_job_meter": _keep_job_meter}


class _Lines:
    """Bytes of one stream -> complete lines (UTF-8 decoded incrementally; ``\\r`` rewrites of a
    progress bar keep only their newest text)."""

    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._buffer = ""

    def feed(self, data: bytes, final: bool = False) -> list[str]:
        self._buffer += self._decoder.decode(data, final)
        *lines, self._buffer = self._buffer.split("\n")
        if (final and self._buffer) or len(self._buffer) > MAX_LINE_CHARS:
            lines.append(self._buffer)
            self._buffer = ""
        return [_last_rewrite(line) for line in lines]


def _last_rewrite(line: str) -> str:
    line = line.rstrip("\r")
    if "\r" not in line:
        return line
    return next((part for part in reversed(line.split("\r")) if part.strip()), "")


class Child:
    """One running child of the agent."""

    def __init__(self, child_id: str, kind: str, session: Session, spec: Spec,
                 proc: asyncio.subprocess.Process) -> None:
        self.child_id, self.kind, self.session, self.spec, self.proc = child_id, kind, session, spec, proc
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)
        self.stopped = False
        self.ended = False
        self._kill: asyncio.TimerHandle | None = None
        #: What the child had started when a stop was asked (by pid and create time): helpers in a
        #: session of their own are not in its group, and once it is gone they are nobody's children.
        self.tree: list[proctree.ProcessRef] = []

    def signal_group(self, signum: int) -> None:
        """``signum`` to the child's process group (its own session: what it started goes too)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.proc.pid, signum)

    def stop(self, grace_s: float = GRACE_S) -> None:
        if self.ended:
            return
        self.stopped = True
        if not self.tree:
            self.tree = proctree.descendants(self.proc.pid)
        self.signal_group(signal.SIGTERM)
        if self._kill is None:
            self._kill = asyncio.get_running_loop().call_later(max(0.0, grace_s), self.kill_all)

    def kill_all(self) -> None:
        """SIGKILL to the child's group and to every process it had started when it was stopped."""
        self.signal_group(signal.SIGKILL)
        for ref in self.tree:
            ref.signal(signal.SIGKILL)

    def describe(self) -> dict[str, Any]:
        return {"child_id": self.child_id, "kind": self.kind, "pid": self.proc.pid}


class Children:
    """The service (``Service`` of agent/server.py)."""

    name = "children"

    def __init__(self, agent: Agent) -> None:
        self.agent = agent
        self.children: dict[str, Child] = {}
        self._ids = itertools.count(1)
        self._tasks: set[asyncio.Task[None]] = set()

    def ops(self) -> dict[str, Handler]:
        return {"child.start": self._start, "child.send": self._send, "child.stop": self._stop,
                "child.list": self._list}

    async def start(self) -> None:
        return None

    async def stop(self) -> None:
        for child in list(self.children.values()):
            child.stop(0.5)
        for task in list(self._tasks):
            with contextlib.suppress(Exception):
                await asyncio.wait_for(task, 3)

    def busy(self) -> list[str]:
        return [f"{c.kind} child {c.child_id} (pid {c.proc.pid})" for c in self.children.values()]

    def holds(self) -> list[str]:
        return self.busy()  # its pipes are this agent's: the child's output would have no reader

    def status(self) -> dict[str, Any]:
        running = [c.describe() for c in self.children.values()]
        return {"children": running, "summary": f"{len(running)} interactive children" if running else ""}

    def subscribed(self, session: Session, ev: str, key: str | None) -> None:
        return None

    def session_gone(self, session: Session) -> None:
        for child in list(self.children.values()):
            if child.session is session:
                child.stop()

    # -- operations -------------------------------------------------------------------------------
    async def _start(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        kind = str(message.get("kind") or "")
        make = KINDS.get(kind)
        if make is None:
            raise Refused(f"no such child kind: {kind!r} (known: {', '.join(sorted(KINDS))})")
        args = message.get("args") or {}
        if not isinstance(args, dict):
            raise Refused("args must be an object")
        try:
            spec = make(args)
        except (TypeError, ValueError) as exc:
            raise Refused(f"bad arguments for {kind}: {exc}") from None
        try:
            proc = await asyncio.create_subprocess_exec(
                *spec.argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.PIPE, env=spec.env, start_new_session=True, limit=READ_BYTES)
        except OSError as exc:
            _remove(spec.files)
            raise Refused(f"could not start {spec.argv[0]}: {exc.strerror or exc}") from None
        child_id = f"c{next(self._ids)}-{proc.pid}"
        child = Child(child_id, kind, session, spec, proc)
        self.children[child_id] = child
        # The session hears this child from its first line on (before it could subscribe itself).
        keys = session.subs.get(Ev.OUTPUT.value, set())
        if keys is not None:
            keys.add(child_id)
            session.subs[Ev.OUTPUT.value] = keys
        # No await from here to the reply: the reply goes out before any of the child's output.
        task = asyncio.create_task(self._watch(child))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return {"child_id": child_id, "pid": proc.pid}

    def _child(self, message: dict[str, Any]) -> Child:
        child_id = str(message.get("child_id") or "")
        child = self.children.get(child_id)
        if child is None:
            raise Refused(f"no running child {child_id!r}")
        return child

    async def _send(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        child = self._child(message)
        stdin = child.proc.stdin
        if stdin is None or stdin.is_closing():
            raise Refused(f"child {child.child_id}'s input is closed")
        if "message" in message:
            body = message["message"]
            line = body if isinstance(body, str) else json.dumps(body, separators=(",", ":"))
            if "\n" in line.rstrip("\n"):
                raise Refused("a message is one line")
            stdin.write(line.rstrip("\n").encode("utf-8", "replace") + b"\n")
            with contextlib.suppress(ConnectionError):
                await stdin.drain()
        if message.get("close"):
            stdin.close()
        return {}

    async def _stop(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        child = self._child(message)
        grace = message.get("grace_s")
        child.stop(GRACE_S if grace is None else float(grace))
        return {}

    async def _list(self, session: Session, message: dict[str, Any]) -> dict[str, Any]:
        return {"children": [c.describe() for c in self.children.values()]}

    # -- watching -----------------------------------------------------------------------------------
    async def _watch(self, child: Child) -> None:
        assert child.proc.stdout is not None and child.proc.stderr is not None
        readers = asyncio.gather(self._read(child, child.proc.stdout, "stdout"),
                                 self._read(child, child.proc.stderr, "stderr"))
        try:
            code = await _exited(child.proc, readers)
            # Its pipes close when the last process holding them ends: a helper it started in a session
            # of its own may hold them on. A stopped child's tree is killed; any other's output is read
            # for a moment more, then its end is said all the same (never "running" for ever).
            try:
                await asyncio.wait_for(asyncio.shield(readers), PIPES_AFTER_EXIT_S)
            except asyncio.TimeoutError:
                if child.stopped:
                    child.kill_all()
                    with contextlib.suppress(asyncio.TimeoutError):
                        await asyncio.wait_for(asyncio.shield(readers), PIPES_AFTER_EXIT_S)
                if not readers.done():
                    readers.cancel()
                    child.tail.append("(its output was still held open by a process it started: "
                                      "no longer read)")
                    _close_pipes(child.proc)
        finally:
            child.ended = True
            if child._kill is not None:
                child._kill.cancel()
            if not readers.done():
                readers.cancel()
            # Helpers it left in its group (and, stopped, what it had started) must not outlive it.
            if child.stopped:
                child.kill_all()
            else:
                child.signal_group(signal.SIGKILL)
            self.children.pop(child.child_id, None)
            _remove(child.spec.files)
        end = {"exit_code": code, "status": "crashed" if code < 0 else "exited", "stopped": child.stopped,
               "tail": list(child.tail)}
        self.agent.publish(Ev.OUTPUT, child.child_id, child_id=child.child_id, end=end)

    async def _read(self, child: Child, stream: asyncio.StreamReader, name: str) -> None:
        lines = _Lines()
        while True:
            try:
                data = await stream.read(READ_BYTES)
            except (ConnectionError, OSError):
                data = b""
            messages: list[dict[str, Any]] = []
            for line in lines.feed(data, final=not data):
                if line.startswith(protocol.PREFIX):
                    try:
                        decoded = protocol.decode(line)
                    except protocol.ProtocolError as exc:
                        child.tail.append(f"(a bad protocol line: {exc})")
                        continue
                    if decoded is not None:
                        messages.append(decoded)
                        continue
                child.tail.append(line)
                messages.append({"stream": name, "line": line})
            if messages:
                self.agent.publish(Ev.OUTPUT, child.child_id, child_id=child.child_id, messages=messages)
            if not data:
                return


async def _exited(proc: asyncio.subprocess.Process, readers: asyncio.Future[Any]) -> int:
    """``proc``'s exit status as soon as it has exited. Not ``proc.wait()``: since Python 3.11.5 (and
    3.12) that waits for its pipes to close as well, which a helper it started in a session of its own
    may hold open for ever; the status itself is known (``returncode``) the moment the child watcher
    reaps it."""
    while proc.returncode is None:
        if readers.done():  # its pipes closed: it has ended or is about to; wait() returns at once
            return await proc.wait()
        await asyncio.wait({readers}, timeout=EXIT_POLL_S)
    return proc.returncode


def _close_pipes(proc: asyncio.subprocess.Process) -> None:
    """Let go of the pipes of a child that has exited while a process it started holds them (asyncio
    keeps its transport open until they close: a file descriptor per pipe for as long as the helper
    lives)."""
    transport = getattr(proc, "_transport", None)
    if transport is not None:
        with contextlib.suppress(Exception):
            transport.close()


def _remove(files: list[str]) -> None:
    for path in files:
        with contextlib.suppress(OSError):
            os.unlink(path)


def make(agent: Agent) -> Children:
    return Children(agent)

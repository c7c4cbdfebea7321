"""``gaudi-gui agent``: run this machine's agent, relay to it (``--stdio``: what a workstation runs over
ssh), or say what it runs (``--status``).

- no option: the agent in the foreground (its log on stderr); ``--daemon``: in the background (what a
  client starts on demand: it forks and this command ends at once);
- ``--stdio``: start the agent when none runs, then carry stdin to its socket and its answers to stdout
  until either side closes. A workstation reaches a host's agent through one ``ssh HOST gaudi-gui agent
  --stdio`` session; a dropped connection ends only this relay, never the agent's work;
- ``--status``: what the agent runs (jobs, clients, the device loop, hosts), where its log is; exit 3
  when no agent runs;
- ``--stop``: ask it to end (refused while work runs, unless ``--force``: work goes on without it).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import selectors
import sys
import time
from typing import Any

from gaudi_gui.core import agentwire
from gaudi_gui.core.agentwire import AgentError

EXIT_NOT_RUNNING = 3


def add_parser(sub: Any) -> None:
    p = sub.add_parser("agent", help="this machine's background agent: it owns all work (started on demand)",
                       description=__doc__.split("\n\n")[0] if __doc__ else None)
    mode = p.add_mutually_exclusive_group()
    mode.add_argument("--daemon", action="store_true", help="start it in the background and return")
    mode.add_argument("--stdio", action="store_true",
                      help="relay stdin/stdout to the agent (started when none runs): "
                           "one ssh session per host")
    mode.add_argument("--status", action="store_true", help="what the agent runs, its pid and its log")
    mode.add_argument("--stop", action="store_true", help="ask the agent to end (refused while work runs)")
    p.add_argument("--force", action="store_true",
                   help="with --stop: end even with work running (it goes on)")
    p.add_argument("--json", action="store_true", help="with --status: the status as JSON")


def run(args: argparse.Namespace) -> int:
    if args.status:
        return _status(as_json=args.json)
    if args.stop:
        return _stop(force=args.force)
    if args.stdio:
        return _relay()
    if args.daemon:
        # The caller waits for this process; the agent itself is our child, left to init at once.
        if os.fork() > 0:
            os._exit(0)
        os.setsid()
    return serve()


def build() -> Any:
    """The agent with every service (the registry of what it does)."""
    from gaudi_gui.agent.server import Agent
    agent = Agent()
    for make in _service_makers():
        agent.add(make(agent))
    return agent


#: Modules of this package that are not services.
_NOT_SERVICES = frozenset({"server", "main"})


def _service_makers() -> list[Any]:
    """Every service of the agent: each module of ``gaudi_gui.agent`` that has ``make(agent)`` (a new
    kind of work is one file, found here without editing anything else), in name order."""
    import importlib
    import pkgutil

    import gaudi_gui.agent as package
    makers = []
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda i: i.name):
        if info.name.startswith("_") or info.name in _NOT_SERVICES:
            continue
        module = importlib.import_module(f"gaudi_gui.agent.{info.name}")
        if callable(getattr(module, "make", None)):
            makers.append(module.make)
    return makers


def serve() -> int:
    import asyncio

    from gaudi_gui.agent.server import Lock
    try:
        folder = agentwire.socket_dir()
    except AgentError as exc:
        print(f"gaudi-gui agent: {exc}", file=sys.stderr)
        return 1
    lock = Lock(folder)
    if not lock.take():
        # Two clients started one each: the first holds the lock and serves both.
        print("gaudi-gui agent: one is already running for this user", file=sys.stderr)
        return 0
    with contextlib.suppress(OSError):
        os.nice(0)
    return asyncio.run(build().serve())


def _status(*, as_json: bool) -> int:
    sock = agentwire.try_connect()
    if sock is None:
        print(f"no agent runs (a client starts it on demand); its log: {agentwire.log_path()}")
        return EXIT_NOT_RUNNING
    with agentwire.Connection(sock) as conn:
        status = conn.request("status")
    if as_json:
        print(json.dumps(status, indent=2, sort_keys=True))
        return 0
    agent = status["agent"]
    up = time.time() - float(agent["started"])
    print(f"agent {agent['version']} (protocol {agent['protocol']}), pid {agent['pid']}, up {_span(up)}")
    print(f"  socket: {agent['socket']}")
    print(f"  log:    {agent['log']}")
    if agent.get("outdated"):
        print(f"  {agent['outdated']}")
    clients = status.get("clients") or []
    print(f"  clients: {len(clients)}" + "".join(f"\n    {c['client']} (pid {c['pid']})" for c in clients))
    busy = status.get("busy") or []
    print("  running: " + ("nothing" if not busy else "\n    " + "\n    ".join(busy)))
    for name, info in sorted((status.get("services") or {}).items()):
        words = info.get("summary") if isinstance(info, dict) else None
        if words:
            print(f"  {name}: {words}")
    return 0


def _span(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def _stop(*, force: bool) -> int:
    sock = agentwire.try_connect()
    if sock is None:
        print("no agent runs")
        return 0
    try:
        with agentwire.Connection(sock) as conn:
            conn.request("shutdown", force=force)
    except AgentError as exc:
        print(f"gaudi-gui agent: {exc}", file=sys.stderr)
        return 1
    print("the agent is ending")
    return 0


def _relay() -> int:
    """stdin -> the agent's socket, the socket -> stdout, until either closes."""
    sock = agentwire.try_connect()
    if sock is None:
        agentwire.spawn()
        deadline = time.monotonic() + agentwire.START_WAIT_S
        while sock is None and time.monotonic() < deadline:
            time.sleep(0.05)
            sock = agentwire.try_connect()
    if sock is None:
        words = f"the agent did not start on this host (its log: {agentwire.log_path()})"
        sys.stdout.buffer.write(agentwire.encode({"re": 0, "ok": False, "error": words}))
        sys.stdout.flush()
        return 1
    stdin, stdout = sys.stdin.buffer.fileno(), sys.stdout.buffer.fileno()
    sel = selectors.DefaultSelector()
    sel.register(stdin, selectors.EVENT_READ, "in")
    sel.register(sock, selectors.EVENT_READ, "agent")
    try:
        while True:
            for key, _ in sel.select():
                if key.data == "in":
                    data = os.read(stdin, 1 << 16)
                    if not data:
                        return 0
                    sock.sendall(data)
                else:
                    data = sock.recv(1 << 16)
                    if not data:
                        return 0
                    _write_all(stdout, data)
    except (BrokenPipeError, ConnectionError):
        return 0
    finally:
        sock.close()


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]
